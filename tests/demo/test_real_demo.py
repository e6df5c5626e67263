"""The real-model demo's logic without a real model (fast tier): the arms' configs and lake selections, the strata from
synthetic Q0 rows, the second source, the lr choice, and the report's plain words. The plumbing on the real SmolLM2
is tests/demo/test_real_demo_plumbing.py (slow, real_model)."""
import dataclasses
import json

import pytest

from spo_lake.demo.experiment import COUNTDOWN, SMOLLM2, pyfunc_strata, rewrite, second_source, stratum
from spo_lake.demo.report import PI0, Claim, choose_lrs, decisions, display
from spo_lake.demo.run import _toml, lake_share, methods, offline_where, run_config, sweep_runs
from spo_lake.demo.stats import Paired
from spo_lake.lake import Lake
from spo_lake.rl.config import load_config, stream_counts
from spo_lake.tasks.pyfunc import load


def test_strata_boundaries():
    assert stratum(16, 0) == "never" and stratum(0, 0) == "never"
    assert stratum(16, 1) == "rare" and stratum(100, 9) == "rare"
    assert stratum(100, 10) == "common" and stratum(4, 4) == "common"


def test_every_real_arm_samples_the_same_online_rollouts_and_reads_only_training_problems(tmp_path):
    scale = SMOLLM2.full
    runs = sweep_runs(SMOLLM2, scale, tmp_path, seed=1)
    assert {name for name, _, _ in runs.values()} == set(SMOLLM2.arms)
    assert {lr for _, lr, _ in runs.values()} == set(scale.lrs) and len(runs) == len(SMOLLM2.arms) * len(scale.lrs)
    online = set()
    for label, (_, lr, config) in runs.items():
        path = tmp_path / "c.toml"
        path.write_text(_toml(config))
        loaded = load_config(path)
        counts = dict(zip((s.name for s in loaded.data.streams), stream_counts(loaded)))
        online.add(counts["online"])
        assert loaded.optim.lr == lr and f"lr{lr:g}" in loaded.run.name and loaded.eval.n == scale.eval_n
        assert loaded.eval.where == "p.prompt_id LIKE 'pyfunc/1/%'"  # held-out: pyfunc/(seed + 0)
        assert loaded.data.prompts_where == "p.prompt_id LIKE 'pyfunc/3/%'"  # training: pyfunc/(seed + 2)
        # every lake selection (stream, injected groups, SFT rows) names the training problems: the lake also holds
        # the held-out problems' reference solutions
        wheres = [s.where for s in loaded.data.streams if s.kind == "lake"] + [loaded.grpo.sft_where] * bool(
            loaded.grpo.sft_steps)
        assert all("prompt_id LIKE 'pyfunc/3/%'" in w for w in wheres), label
    assert online == {scale.online_per_step}
    # ≥ 4 evaluations per run besides step 0, in both modes of both experiments
    for exp in (COUNTDOWN, SMOLLM2):
        for s in (exp.quick, exp.full):
            assert s.train_steps // s.eval_every >= 4


def test_tiny_demo_sft_rows_are_the_training_problems_only(tmp_path):
    """The countdown lake holds the held-out problems' solver solutions; SFT→GRPO's SFT rows once selected them too."""
    config = run_config("SFT→GRPO", methods(COUNTDOWN.quick, offline_where(COUNTDOWN, 4))["SFT→GRPO"], tmp_path,
                        COUNTDOWN.quick, 4)
    assert config["sft_where"] == "passed AND NOT duplicate AND prompt_id LIKE 'countdown/4/%'"


def test_lake_share_per_arm():
    arms = methods(SMOLLM2.full)
    shares = {name: lake_share(m) for name, m in arms.items()}
    assert shares["GRPO"] == shares["SPO online"] == "0% of each batch"
    assert shares["SPO half-online"] == "50% of each batch"
    assert shares["GRPO + lake solutions"].startswith("50% of each batch (lake solutions injected")
    assert shares["SFT→GRPO"].startswith("100 % in its 12 SFT steps")


def test_second_source_rewrites_each_training_program_into_a_correct_other_one(tmp_path):
    path = tmp_path / "second.jsonl"
    assert second_source(SMOLLM2, SMOLLM2.quick, 0, path) == SMOLLM2.quick.train_prompts
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    prompts, humans = load(n=SMOLLM2.quick.train_prompts, seed=2)
    for row, prompt, human in zip(rows, prompts, humans, strict=True):
        assert row["prompt_id"] == prompt["prompt_id"] and row["response"] != human["response"]
        code = row["response"].removeprefix("```python\n").removesuffix("```")
        namespace: dict = {}
        exec(code + prompt["tests"]["program"], namespace)  # our own generated programs and tests, not a model's
        namespace["check"](namespace[prompt["tests"]["entry_point"]])
    assert rewrite("def f(x):\n    return x + 1\n") == "def f(x):\n    result = x + 1\n    return result\n"


def test_strata_pool_each_family_over_the_training_problems(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    train, held = load(n=16, seed=2)[0], load(n=16, seed=0)[0]
    lake.append("prompts", [{**p, "tests": json.dumps(p["tests"]), "metadata": json.dumps(p["metadata"])}
                            for p in train + held])
    family = {p["prompt_id"]: p["metadata"]["family"] for p in train + held}
    first = sorted({family[p["prompt_id"]] for p in train})
    # per family of the training problems: the first never solved, the second once (in 40 samples a problem), the
    # others 4 of 8
    rows, seen = [], set()
    for p in train:
        f = family[p["prompt_id"]]
        n, s = (8, 0) if f == first[0] else (40, int(f not in seen)) if f == first[1] else (8, 4)
        seen.add(f)
        rows.append({"prompt_id": p["prompt_id"], "model_id": "pi0@x", "temperature": 1.0, "top_p": 1.0, "n": n,
                     "n_success": s})
    rows.append({**rows[0], "model_id": "other@y", "n_success": rows[0]["n"]})  # another model's counts: ignored
    lake.append("values", rows)
    lake.snapshot("demo-0")
    strata = pyfunc_strata(lake, "pi0@x", "demo-0", "pyfunc/2/")
    assert strata["families"][first[0]]["stratum"] == "never"
    assert strata["families"][first[1]]["stratum"] == "rare"
    assert all(v["stratum"] == "common" for f, v in strata["families"].items() if f not in first[:2])
    for p in held:  # a held-out problem takes its family's stratum; a family no training problem has: unmeasured
        f = family[p["prompt_id"]]
        assert strata["prompts"][p["prompt_id"]] == strata["families"].get(f, {"stratum": "unmeasured"})["stratum"]
    assert any(family[p["prompt_id"]] not in strata["families"] for p in held)  # the case is exercised


def _seed(seed: int, rewards: dict[tuple[str, float], float]) -> dict:
    return {"seed": seed, "methods": [{"method": m, "lr": lr, "run_id": f"{m}-{lr}-s{seed}", "online_reward": r,
                                       "curve": [{"step": 0, "pass@1": 0.0}]} for (m, lr), r in rewards.items()]}


def test_each_arm_takes_the_lr_with_the_best_online_reward_over_seeds():
    rewards = [{("GRPO", 1e-5): 0.2, ("GRPO", 2e-5): 0.5, ("SPO half-online", 1e-5): 0.6,
                ("SPO half-online", 2e-5): 0.1},
               {("GRPO", 1e-5): 0.3, ("GRPO", 2e-5): 0.1, ("SPO half-online", 1e-5): 0.6,
                ("SPO half-online", 2e-5): 0.6}]
    chosen, sweep = choose_lrs([_seed(s, r) for s, r in enumerate(rewards)])
    # GRPO: 0.35 at 2e-5 against 0.25 at 1e-5, over both seeds (not seed 1's own best)
    assert [[(m["method"], m["lr"]) for m in s["methods"]] for s in chosen] == [
        [("GRPO", 2e-5), ("SPO half-online", 1e-5)]] * 2
    assert len(sweep) == 8 and sum(r["chosen"] for r in sweep) == 4
    one = [_seed(0, {("GRPO", 1e-5): None})]  # a single lr: kept, whatever its reward
    assert choose_lrs(one)[0][0]["methods"][0]["lr"] == 1e-5


ROWS = [[name, "0.000 ± 0.000", "0.000", "0.250", "0.400"] + ["–"] * 10 for name in (PI0, "GRPO", "SPO half-online")]


def test_plain_words_for_zeros_undecided_claims_and_collapses():
    labels = {"skill": "never+rare", "other": "common"}
    target = Claim("SPO half-online − the best online-only arm ≥ +0.10 pass@1 on the skill problems",
                   "SPO half-online", "GRPO", "pass@1", "skill", 0.10, target=True)
    collapse = Claim("GRPO loses at most 0.02 pass@1 to π0 on the other problems", "GRPO", PI0, "pass@1", "other",
                     -0.02, target=True)
    claims = [(target, Paired(0.0, -0.1, 0.1, (0.0,))), (collapse, Paired(-0.2, -0.3, -0.1, (-0.2,)))]
    lines = decisions(claims, ROWS, labels, 4, "16 held-out problems × 2 samples, 8 steps, 1 seed(s)")
    assert lines[0].startswith("Neither π0 nor any arm solved a single never+rare problem in this run (16 held-out")
    assert "cannot decide any claim about that group" in lines[0]
    assert lines[1].startswith("Cannot decide at this size: SPO half-online − the best online-only arm ≥ +0.10 "
                               "pass@1 on the never+rare problems (measured +0.000, 95 % interval [-0.100, +0.100]; holding needs a mean "
                               "of at least +0.10 with the interval above +0.00")
    assert lines[2] == "GRPO collapsed the common problems: -0.200 pass@1 against π0 [-0.300, -0.100]."
    rows = [r[:1] + ["0.100"] + r[2:] for r in ROWS]  # something solved, a claim that holds
    held = decisions([(target, Paired(0.2, 0.12, 0.3, (0.2,)))], rows, labels, 4, "")
    assert held == ["SPO half-online − the best online-only arm ≥ +0.10 pass@1 on the never+rare problems: **holds** "
                    "(+0.200 [+0.120, +0.300])."]


def test_display_names_groups_and_k():
    labels = dict(SMOLLM2.labels)
    assert display("skill pass@k", labels, 4) == "never+rare pass@4"
    assert display("other Δ nats", labels, 4) == "common Δ nats"
    assert display("absorbs more of the skill's solutions than", labels, 4) == \
        "absorbs more of the never+rare problems' solutions than"
    assert display("skill pass@k", dict(COUNTDOWN.labels), 10) == "skill pass@10"


@pytest.mark.parametrize("arms, message", [("GRPO,PPO", "unknown arm 'PPO'"), ("Nope", "unknown arm 'Nope'")])
def test_unknown_arm_or_model_is_one_line(tmp_path, arms, message):
    from typer.testing import CliRunner

    from spo_lake.cli.app import app

    result = CliRunner().invoke(app, ["demo", "--model", "smollm2", "--arms", arms, "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and message in result.output and len(result.output.strip().splitlines()) == 1
    result = CliRunner().invoke(app, ["demo", "--model", "gpt5", "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and "--model 'gpt5': choose one of tiny, smollm2" in result.output
    assert not (tmp_path / "o").exists()


def test_partial_seed_reads_back_the_finished_runs_and_names_the_others(tmp_path):
    """A demo stopped before its end: `--partial` reports over the runs that finished, read from their directories."""
    from spo_lake.demo.run import partial_seed
    from spo_lake.rl.run import CHECKPOINT_PREFIX

    scale = dataclasses.replace(SMOLLM2.quick, train_steps=2)
    out = tmp_path / "seed-0"
    runs = sweep_runs(SMOLLM2, scale, out, 0, ("GRPO", "SPO half-online"))
    (_, _, done), (_, _, stopped) = runs["GRPO"], runs["SPO half-online"]
    for config, steps in ((done, 2), (stopped, 1)):  # SPO half-online stopped after its first step
        run_dir = out / "runs" / config["run_name"]
        (run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{steps}").mkdir(parents=True)
        records = [{"step": 0, "pass@1": 0.25, "pass@2": 0.5}] + [
            {"step": s, "seconds": 10.0 * s, "reward/online": 0.1 * s, **({"pass@1": 0.5, "pass@2": 0.75} if s == 2
                                                                            else {})} for s in range(1, steps + 1)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    seed = partial_seed(out, scale, 0, SMOLLM2, ("GRPO", "SPO half-online"))
    assert seed is not None and seed["unfinished"] == ["SPO half-online"]
    (grpo,) = seed["methods"]
    assert grpo["method"] == "GRPO" and grpo["curve"] == [{"step": 0, "pass@1": 0.25, "pass@2": 0.5},
                                                          {"step": 2, "pass@1": 0.5, "pass@2": 0.75}]
    assert grpo["wall_s"] == 30.0 and grpo["peak_rss_mb"] is None and grpo["online_reward"] == pytest.approx(0.2)
    assert grpo["lake_share"] == "0% of each batch"
    assert partial_seed(tmp_path / "seed-1", scale, 1, SMOLLM2) is None  # nothing finished
