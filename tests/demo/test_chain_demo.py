"""`spolake demo --chain` end to end at a toy scale: the demo's recipe (with the test's tiny model as π0), both
arms, the report. What it measures is the lead's to run at demo scale; here: that it runs, pairs and counts right."""
import json
import shutil
from dataclasses import replace

from spo_lake.demo.chain import run_chain_demo
from spo_lake.demo.run import QUICK
from spo_lake.lake import Lake

# the demo's quick scale, shrunk (the models' SFT steps do not matter: the test puts its tiny model in their place)
TOY = replace(QUICK, train_prompts=6, eval_prompts=4, reference_samples=1, cot_samples=1, q0_samples=2, pts_rollouts=2,
              pts_trajectories=1, train_steps=4, online_per_step=4, lr=1e-3, eval_every=2, eval_max_prompts=4)


def test_chain_demo_runs_both_arms_on_copies_of_the_seed_lake_and_reports(tmp_path, fast_model_dir):
    for name in ("pi0", "cot"):  # the recipe keeps models that exist: no tiny-model training here
        shutil.copytree(fast_model_dir, tmp_path / "seed-0" / "models" / name)
    metrics = run_chain_demo(tmp_path, seeds=(0,), runs=2, scale=TOY, log=lambda *_: None)

    (seed,) = metrics["seeds"]
    for arm in ("independent", "chain"):
        curve = seed["arms"][arm]["curve"]
        assert [p["online_samples"] for p in curve] == [0, 8, 16]  # 2 runs × 2 steps × 4 rollouts
        assert len(seed["arms"][arm]["final_held_out"]) == 4
    # run 1 of both arms is the same run (same config, seed, and lake contents): the same final evaluation
    runs = {arm: seed["arms"][arm]["runs"] for arm in ("independent", "chain")}
    first = [json.loads((tmp_path / "seed-0" / "chain" / arm / "runs" / name / "evals" / "step-2.json").read_text())
             for arm, name in (("independent", "independent-run-1"), ("chain", "chain-run-1"))]
    assert first[0] == first[1] and runs["chain"][0].endswith("chain-run-1")
    assert seed["arms"]["independent"]["curve"][1] == seed["arms"]["chain"]["curve"][1]
    diversity = [seed["arms"][arm]["distinct_correct_per_prompt"][0] for arm in ("independent", "chain")]
    assert diversity[0] == diversity[1] and {"reference", "spo"} <= set(diversity[0])

    # each arm's lake holds the seed lake's snapshot and only its own runs' rollouts
    chain_lake = Lake.open(str(tmp_path / "seed-0" / "chain" / "chain" / "lake"))
    run_ids = chain_lake.sql("SELECT DISTINCT run_id FROM trajectories WHERE source = 'spo' ORDER BY 1")
    assert run_ids.column(0).to_pylist() == ["chain-run-1", "chain-run-2"]
    assert chain_lake.count("trajectories", "chain-run-2") == chain_lake.count("trajectories", "base") + 8
    report = (tmp_path / "chain_report.md").read_text()
    assert "Does the chain win? **" in report and (tmp_path / "chain.png").stat().st_size > 0
    assert set(metrics["chain_minus_independent"]) == {"pass@1", "pass@10", "known_prompts"}
