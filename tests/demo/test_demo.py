"""The demo's pieces that can be checked without training: equal online budgets, configs that load, the statistics,
the report over seeds (π0 row, claims with intervals, plots)."""
import json
import random

import pytest

from spo_lake.demo.report import CLAIMS, PI0, pts_curve, table_rows, write_report
from spo_lake.demo.run import FULL, QUICK, _toml, methods, run_config
from spo_lake.demo.stats import mean_std, paired_prompt_difference, paired_seed_difference
from spo_lake.lake import Lake
from spo_lake.models.identity import model_identity
from spo_lake.models.scripted import write_scripted_model
from spo_lake.rl.config import load_config, stream_counts


def test_every_method_gets_the_same_online_budget_and_the_paper_eval_settings(tmp_path):
    for scale in (QUICK, FULL):
        per_step = set()
        for name, method in methods(scale).items():
            path = tmp_path / "c.toml"
            path.write_text(_toml(run_config(name, method, tmp_path, scale, seed=3)))
            config = load_config(path)
            counts = dict(zip((s.name for s in config.data.streams), stream_counts(config)))
            per_step.add(counts["online"])
            assert config.run.seed == 3 and config.data.snapshot == "demo-3" and config.eval.n == 20
            assert config.eval.k == [1, 10] and config.eval.temperature == 0.4 and config.eval.top_p == 0.95
            assert "countdown/1003/" in config.eval.where and "countdown/3/" in config.eval.train_where
        assert per_step == {scale.online_per_step}


def test_paired_bootstrap_intervals():
    rng = random.Random(0)
    base = [{f"p{i}": rng.random() for i in range(50)} for _ in range(3)]
    better = [{p: v + 0.1 for p, v in seed.items()} for seed in base]
    up = paired_prompt_difference(better, base)
    assert up.mean == pytest.approx(0.1) and up.low == pytest.approx(0.1) and up.verdict == "holds"
    noisy = [{p: rng.random() for p in seed} for seed in base]
    mixed = paired_prompt_difference(noisy, base)
    assert mixed.low < mixed.mean < mixed.high and len(mixed.per_seed) == 3
    assert paired_prompt_difference(base, better).verdict == "reversed"
    with pytest.raises(ValueError, match="same, non-empty prompt set"):
        paired_prompt_difference([{"a": 1.0}], [{"b": 1.0}])
    seeds = paired_seed_difference([3.0, 4.0, 5.0], [1.0, 1.5, 2.0])
    assert seeds.per_seed == (2.0, 2.5, 3.0) and seeds.verdict == "holds" and 2.0 <= seeds.low <= seeds.high <= 3.0
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(2 ** 0.5)) and mean_std([5.0]) == (5.0, 0.0)


NAMES = list(methods(QUICK))
SKILL, OTHER = ([2, 3, 4], 24), ([3, 7, 12], 16)  # 2*3*4 needs a product; 12+7-3 does not
PI0_ANSWER, SKILL_ANSWER = "12+7-3", "2*3*4"
LAKE_ARMS = ("SPO half-online", "SPO + MC (50/25/25)", "SFT→GRPO", "GRPO + lake solutions")


def _starting_lake(lake: Lake, pi0, seed: int) -> None:
    """Four training prompts (0 and 2 need a product), π0's Q0 counts of them (8 samples each: skill 0 and 1
    successes, other 4 and 8), counts that must not count (another model's, a prefix's, an earlier smaller count),
    and correct solutions:
    the solver's for every prompt, a CoT sample for prompt 0, a wrong reference sample for prompt 1."""
    train = [f"countdown/{seed}/{i}" for i in range(4)]
    lake.append("prompts", [{"prompt_id": p, "task": "countdown", "prompt": p,
                             "tests": json.dumps(dict(zip(("numbers", "target"), SKILL if i % 2 == 0 else OTHER)))}
                            for i, p in enumerate(train)])
    write_scripted_model(pi0, [PI0_ANSWER])  # a model directory: an identity, a tokenizer for the PTS plot
    value, pi0_id = {"temperature": 1.0, "top_p": 1.0, "n": 8}, model_identity(str(pi0))
    lake.append("values", [{**value, "prompt_id": p, "model_id": pi0_id, "n_success": s}
                           for p, s in zip(train, (0, 4, 1, 8))]
                + [{**value, "prompt_id": train[0], "model_id": "cot@def", "n_success": 8},
                   {**value, "prompt_id": train[0], "model_id": pi0_id, "trajectory_id": "t-human-0",
                    "position": 3, "n_success": 8},
                   # an earlier q0 run's smaller count: superseded by the row with the larger n, not added to it
                   {**value, "prompt_id": train[1], "model_id": pi0_id, "n": 4, "n_success": 1}])
    rows = [(f"t-human-{i}", p, "human", True) for i, p in enumerate(train)]
    rows += [("t-cot-0", train[0], "cot", True), ("t-ref-1", train[1], "reference", False)]
    lake.append("trajectories", [{"trajectory_id": t, "prompt_id": p, "source": src, "response_text": t,
                                  "response_hash": t} for t, p, src, _ in rows])
    lake.append("evaluations", [{"trajectory_id": t, "verifier": "countdown", "passed": ok, "reward": 0.0 if ok else -1.0,
                                 "verdict": "ok" if ok else "wrong_answer"} for t, _, _, ok in rows])


def _fake_seed(out, seed: int, shift: dict[str, int]) -> dict:
    """A finished seed: its lake's prompts (half of them need a product) with the solver's solutions, per-prompt
    eval counts (n = 20) at step 0 and 10 for each method (`shift` added on the skill prompts only), a last
    checkpoint per run (scripted: the lake arms' answer the skill's solution half the time, the others π0's
    answer only), its summary."""
    rng = random.Random(seed)
    prompts = [f"countdown/{1000 + seed}/{i}" for i in range(30)]
    lake = Lake.init(out / f"seed-{seed}" / "lake")
    lake.append("prompts", [{"prompt_id": p, "task": "countdown", "prompt": p,
                             "tests": json.dumps(dict(zip(("numbers", "target"), SKILL if i % 2 else OTHER)))}
                            for i, p in enumerate(prompts)])
    _starting_lake(lake, out / f"seed-{seed}" / "models" / "pi0", seed)
    lake.append("trajectories", [{"trajectory_id": f"t-held-out-{i}", "prompt_id": p, "source": "human",
                                  "response_text": SKILL_ANSWER if i % 2 else PI0_ANSWER,
                                  "response_hash": f"h-held-out-{i}"} for i, p in enumerate(prompts)])
    lake.snapshot(f"demo-{seed}")
    base = {p: rng.randint(0, 12) for p in prompts}
    results = []
    for name in NAMES:
        run_id = name.replace(" ", "-") + f"-s{seed}"
        evals = out / f"seed-{seed}" / "runs" / run_id / "evals"
        evals.mkdir(parents=True)
        write_scripted_model(evals.parent / "checkpoints" / "step-0000010",
                             [PI0_ANSWER, SKILL_ANSWER] if name in LAKE_ARMS else [PI0_ANSWER])
        curve = []
        for step, delta in ((0, 0), (10, shift.get(name, 0))):
            counts = [[p, 20, min(20, base[p] + (delta if i % 2 else 0))] for i, p in enumerate(prompts)]
            (evals / f"step-{step}.json").write_text(json.dumps({"held_out": counts, "train": counts}))
            p1 = sum(c for _, _, c in counts) / (20 * len(counts))
            curve.append({"step": step, "pass@1": p1, "pass@10": min(1.0, 2 * p1), "train/pass@1": p1,
                          "train/pass@10": min(1.0, 2 * p1)})
        results.append({"method": name, "run_id": run_id, "final": curve[-1], "curve": curve, "wall_s": 10.0,
                        "step_s": 2.0 if name == "PPO" else 1.0, "peak_rss_mb": 800.0,
                        "state_mb": 20.0 if name == "PPO" else 10.0,
                        "online_samples": 96, "resumed": False, "gap": curve[-1]["pass@10"] - curve[-1]["pass@1"]})
    return {"seed": seed, "recipe_steps": [{"step": "snapshot", "summary": "ok", "seconds": 0.1}],
            "recipe_seconds": 1.0, "total_seconds": 2.0, "methods": results}


def test_report_over_seeds_has_pi0_the_claims_per_problem_group_and_plots(tmp_path):
    # +3 of 20 on every skill prompt (0.15 pass@1) for the lake arm, +1 for GRPO (the best online-only arm), +3 for
    # SFT→GRPO, +4 for GRPO with lake solutions; no arm changes on the other prompts
    shift = {"GRPO": 1, "SPO half-online": 3, "SPO + MC (50/25/25)": 3, "SFT→GRPO": 3, "GRPO + lake solutions": 4}
    seeds = [_fake_seed(tmp_path, s, shift) for s in (0, 1)]
    summary = write_report(tmp_path, seeds, {"quick": True, "scale": {}})
    rows = table_rows(tmp_path, seeds)
    assert [r[0] for r in rows] == [PI0, *NAMES]
    skill = {r[0]: float(r[1].split(" ±")[0]) for r in rows}
    other = {r[0]: float(r[3].split(" ±")[0]) for r in rows}
    assert skill["SPO half-online"] == pytest.approx(skill[PI0] + 0.15, abs=2e-3)
    assert other["SPO half-online"] == pytest.approx(other[PI0], abs=1e-3)
    # Δ nats of the held-out solver solutions: the lake arms' checkpoints put half their mass on the skill's answer
    # (π0 only ε), and give up about log 2 on π0's answer to the other problems; an online arm's is π0's model
    nats = {r[0]: (float(r[5].split(" ±")[0]), float(r[6].split(" ±")[0])) for r in rows}
    assert nats[PI0] == (0.0, 0.0) and nats["PPO"] == (0.0, 0.0)
    assert nats["SPO half-online"][0] > 5 and -1.0 < nats["SPO half-online"][1] < -0.3
    verdicts = {c["text"]: c["verdict"] for c in summary["claims"]}
    assert len(verdicts) == len(CLAIMS)
    # +0.10 over the best online-only arm is exactly 0.10: the bound is reached (and a 0 interval is not above 0)
    (best,) = [t for t in verdicts if t.startswith("SPO half-online − the best online-only arm (GRPO)")]
    assert verdicts[best] == "not shown"
    assert verdicts["SPO half-online ≥ SFT→GRPO − 0.02 pass@1 on the skill problems"] == "holds"
    assert verdicts["SPO half-online ≥ GRPO + lake solutions pass@1 on the skill problems"] == "reversed"
    assert verdicts["SPO half-online pass@1 > π0 pass@1 on the skill problems"] == "holds"
    assert verdicts["PPO loses at most 0.02 pass@1 to π0 on the other problems"] == "holds"
    assert verdicts["SPO steps faster than PPO (seconds per step, lower is better)"] == "holds"
    assert verdicts["SPO needs less memory than PPO (training state, lower is better)"] == "holds"
    (absorbs,) = [t for t in verdicts if t.startswith("SPO half-online absorbs more of the skill's solutions than "
                                                       "the best online-only arm")]
    assert verdicts[absorbs] == "holds"
    assert verdicts["SPO half-online absorbs more of the skill's solutions than SFT→GRPO (nats)"] == "not shown"
    fit = json.loads((tmp_path / "seed-0" / "lake_fit.json").read_text())  # scored once, then read back
    assert set(fit) == {PI0} | {m["run_id"] for m in seeds[0]["methods"]} and len(fit[PI0]) == 30
    report = (tmp_path / "report.md").read_text()
    assert "| π0 |" in report and "**holds**" in report and "**reversed**" in report
    # the claims' problems by id (spolake view --demo-report links each): seed 1's skill prompts are its odd ones
    (listed,) = [line for line in report.splitlines() if line.startswith("- seed 1: ")]
    assert listed.removeprefix("- seed 1: ").split(", ") == sorted(f"countdown/1001/{i}" for i in range(1, 30, 2))
    # the reading under the claims: the targets that miss (the +0.10 one, GRPO + lake solutions) and pass@1 beside nats
    assert "8 of 10 targets hold. Those that do not:" in report
    assert "- SPO half-online ≥ GRPO + lake solutions pass@1 on the skill problems: **reversed**, -0.050" in report
    assert f"; SPO half-online {skill['SPO half-online']:.3f} / {nats['SPO half-online'][0]:.2f};" in report
    assert (tmp_path / "pass_at_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "demo_metrics.json").read_text())["claims"][0]["verdict"] == "not shown"
    skill, other = (summary["starting_point"][0][g] for g in ("skill", "other"))
    assert skill == {"prompts": 2, "q0_prompts": 2, "q0_samples": 16, "pi0_success_per_sample": 1 / 16,
                     "pi0_solved_prompts": 1, "lake_solved_prompts": {"cot": 1, "human": 2}}
    assert other["pi0_success_per_sample"] == 12 / 16 and other["lake_solved_prompts"] == {"human": 2}
    assert "| 0 | skill | 2 | 0.0625 (16 samples) | 1 / 2 | cot 1, human 2 |" in report


def test_a_claim_holds_only_when_its_bound_is_reached_with_the_interval_above_it():
    from spo_lake.demo.report import Claim
    from spo_lake.demo.stats import Paired

    target = Claim("t", "a", "b", "pass@1", "skill", 0.10)
    assert target.verdict(Paired(0.12, 0.02, 0.2, ())) == "holds"
    assert target.verdict(Paired(0.08, 0.02, 0.2, ())) == "not shown"  # above 0 but short of the target
    assert target.verdict(Paired(-0.08, -0.12, -0.02, ())) == "reversed"
    slack = Claim("t", "a", "b", "pass@1", "other", -0.02)
    assert slack.verdict(Paired(-0.01, -0.015, 0.0, ())) == "holds"
    assert slack.verdict(Paired(-0.01, -0.03, 0.0, ())) == "not shown"
    assert slack.verdict(Paired(-0.05, -0.06, -0.03, ())) == "reversed"


def test_pts_curve_reads_the_most_pivotal_trajectory_with_its_prompt(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    lake.append("prompts", [{"prompt_id": "p", "task": "countdown", "prompt": "reach 3 from 1, 2"}])
    lake.append("trajectories", [{"trajectory_id": "t1", "prompt_id": "p", "source": "reference",
                                  "response_text": "1+2", "response_hash": "h"}])
    lake.append("values", [{"prompt_id": "p", "trajectory_id": "t1", "position": pos, "model_id": "m",
                            "temperature": 1.0, "top_p": 1.0, "n": 4, "n_success": s} for pos, s in [(1, 0), (2, 3), (3, 4)]])
    lake.append("pivots", [{"trajectory_id": "t1", "model_id": "m", "position": 1, "token_id": 7, "s_before": 0.0,
                            "s_after": 0.75, "threshold": 0.2}])
    lake.snapshot("demo-0")
    curve = pts_curve(lake, "demo-0")
    assert [p["s"] for p in curve["points"]] == [0.0, 0.75, 1.0] and len(curve["pivots"]) == 1
    assert curve["prompt"] == "reach 3 from 1, 2" and curve["response"] == "1+2"


@pytest.mark.parametrize("seeds, message", [("x", "--seeds takes comma-separated integers, got 'x'"),
                                            ("", "--seeds takes comma-separated integers, got ''"),
                                            ("1,1", "--seeds repeats a seed: '1,1'")])
def test_bad_seeds_are_one_line_before_anything_is_made(tmp_path, seeds, message):
    from typer.testing import CliRunner

    from spo_lake.cli.app import app

    result = CliRunner().invoke(app, ["demo", "--seeds", seeds, "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and result.output == f"error: {message}\n", result.output  # "a bug" before
    assert not (tmp_path / "out").exists()
