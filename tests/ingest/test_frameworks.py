"""`spolake ingest --from trl|verl|prime-rl`: other trainers' rollout dumps land with their provenance. verl and
prime-rl from fixtures built from their writers' code (tests/fixtures/*/README.md); TRL from a real GRPO run's
`log_completions` files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spo_lake import Lake
from spo_lake.cli.app import app
from spo_lake.ingest.datasets import ingest_dataset

FIXTURES = Path(__file__).parents[1] / "fixtures"


def spolake(lake: Path, *args) -> tuple[int, str, str]:
    out = CliRunner().invoke(app, ["--lake", str(lake), *map(str, args)])
    return out.exit_code, out.stdout, out.stderr


def trajectories(lake: Path) -> list[dict]:
    return Lake.open(lake).sql("""
        SELECT t.*, e.reward FROM trajectories t LEFT JOIN evaluations e USING (trajectory_id)
        ORDER BY t.policy_version, t.response_text""").to_pylist()


def test_verl_rollout_dump_needs_a_reward_map_then_lands_with_its_steps(tmp_path):
    lake = tmp_path / "lake"
    code, _, err = spolake(lake, "ingest", FIXTURES / "verl" / "rollout", "--task", "countdown")  # auto-detected
    assert code == 1 and err.strip() == (
        f"error: {FIXTURES / 'verl' / 'rollout' / '1.jsonl'}:line 1: field 'score': a score in the trainer's own "
        "convention; say how it maps to the lake's 0 (pass) / -1 (fail) with --reward-map (e.g. >=1 or 1=0,0=-1)")
    assert not lake.exists()
    code, out, err = spolake(lake, "ingest", FIXTURES / "verl" / "rollout", "--task", "countdown", "--reward-map", ">=1")
    assert code == 0, err
    got = trajectories(lake)
    assert [(r["source"], r["run_id"], r["policy_version"], r["reward"]) for r in got] == [
        ("verl", "rollout", 0, 0.0), ("verl", "rollout", 0, -1.0), ("verl", "rollout", 1, 0.0),
        ("verl", "rollout", 1, -1.0)]
    meta = json.loads(got[3]["metadata"])
    assert meta == {"acc": False, "pred": None, "ground_truth": "10", "verl_step": 2, "reward_input": -0.5,
                         "reward_map": ">=1"}
    assert spolake(lake, "ingest", FIXTURES / "verl" / "rollout", "--from", "verl", "--task", "countdown",
                   "--reward-map", ">=1")[2].startswith(f"{FIXTURES / 'verl' / 'rollout'}: 0 new, 4 already present")
    spolake(lake, "ingest", FIXTURES / "verl" / "rollout" / "2.jsonl", "--from", "verl", "--task", "countdown",
            "--reward-map", ">=1", "--run-id", "ppo-7")
    assert Lake.open(lake).sql("SELECT count(*) AS n FROM trajectories WHERE run_id = 'ppo-7'").column("n")[0].as_py() == 2


def test_prime_rl_episodes_land_per_trace_and_errored_ones_are_counted(tmp_path):
    lake = tmp_path / "lake"
    code, out, err = spolake(lake, "ingest", FIXTURES / "prime-rl" / "run", "--task", "countdown", "--reward-map",
                             ">=1", "--format", "json")
    assert code == 0, err
    summary = json.loads(out.splitlines()[0])
    assert (summary["new"], summary["rewardless"], summary["errored"], summary["skipped"]) == (3, 1, 1, 1)
    got = trajectories(lake)  # `effective` repeats `all`: read once
    assert [(r["response_text"], r["run_id"], r["policy_version"], r["model_id"], r["reward"]) for r in got] == [
        ("4", "run-7", 0, "Qwen/Qwen3-0.6B", 0.0), ("5", "run-7", 0, "Qwen/Qwen3-0.6B", -1.0),
        ("four", "run-7", 1, "Qwen/Qwen3-0.6B", None)]
    assert got[0]["token_ids"] == [19, 151645] and got[0]["behavior_logprobs"] == pytest.approx([-0.1, -0.2])
    assert json.loads(got[2]["metadata"])["prime_rl"]["errors"] == ["judge timed out"]
    prompt = Lake.open(lake).sql("SELECT prompt FROM prompts").column("prompt").to_pylist()
    assert prompt == ["Answer with a number.\n\n2+2?"]


def test_a_bad_dump_line_names_file_line_and_field_and_leaves_the_lake_unchanged(tmp_path):
    lake = tmp_path / "lake"
    dump = tmp_path / "verl"
    shutil.copytree(FIXTURES / "verl" / "rollout", dump)
    assert spolake(lake, "ingest", dump / "1.jsonl", "--from", "verl", "--task", "countdown", "--reward-map",
                   ">=1")[0] == 0
    before = Lake.open(lake).versions()
    (dump / "2.jsonl").write_text(json.dumps({"input": "q", "score": 1.0, "step": 2}) + "\n")
    code, _, err = spolake(lake, "ingest", dump, "--task", "countdown", "--reward-map", ">=1")
    assert code == 1 and err.strip() == (f"error: {dump / '2.jsonl'}:line 1: missing required field 'output' "
                                         "(a verl rollout dump line)")
    assert Lake.open(lake).versions() == before


def test_trl_log_completions_files_of_a_real_grpo_run(tmp_path, fast_model_dir):
    from tests.trl_lake.run_grpo import grpo_trainer

    lake = Lake.init(tmp_path / "lake")
    ingest_dataset(lake, "countdown", None, n=4, seed=0)
    out = tmp_path / "grpo-run"
    trainer = grpo_trainer(lake, str(fast_model_dir), str(out), "r", 2, log_completions=True)
    trainer.train()
    assert sorted(p.name for p in (out / "completions").iterdir()) == ["completions_00001.parquet",
                                                                       "completions_00002.parquet"]
    code, _, err = spolake(lake.root, "ingest", out, "--task", "countdown")  # the verifier's column needs no map
    assert code == 0, err
    got = lake.sql("SELECT t.run_id, t.policy_version, t.metadata, e.verifier FROM trajectories t "
                   "JOIN evaluations e USING (trajectory_id) WHERE t.source = 'trl-grpo' ORDER BY 2").to_pylist()
    assert [(r["run_id"], r["policy_version"], r["verifier"]) for r in got] == [("grpo-run", 0, "imported")] * 2 + [
        ("grpo-run", 1, "imported")] * 2
    assert all("advantage" in json.loads(r["metadata"]) for r in got)
