"""`record_rollouts`: real TRL GRPO runs on the fast tiny model write their rollouts into a real lake. The tests count
rows and check provenance; what the model samples (and so the rewards) is not what they check."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spo_lake import Lake
from spo_lake.cli.app import app
from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.trl_lake import record_rollouts
from tests.trl_lake.run_grpo import grpo_trainer

SCRIPT = Path(__file__).with_name("run_grpo.py")
ROOT = Path(__file__).parents[2]


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake.init(tmp_path / "lake")
    ingest_dataset(lake, "countdown", None, n=4, seed=0)
    return lake


def rows(lake: Lake, where: str = "TRUE") -> list[dict]:
    return lake.sql(f"SELECT * FROM trajectories WHERE source = 'trl-grpo' AND {where} ORDER BY created_at").to_pylist()


def test_every_completion_of_every_step_lands_with_its_provenance(lake, fast_model_dir, tmp_path):
    steps, generations = 3, 2
    trainer = grpo_trainer(lake, str(fast_model_dir), str(tmp_path / "out"), "run-a", steps)
    recorder = record_rollouts(trainer, lake, flush_rows=4)  # 2 rows a step: commits of 4, then the last 2 at the end
    assert trainer.train().global_step == steps
    got = rows(lake)
    assert len(got) == steps * generations == recorder.rows == recorder.committed
    assert {r["run_id"] for r in got} == {"run-a"}
    assert sorted(r["policy_version"] for r in got) == [0, 0, 1, 1, 2, 2]  # the step that sampled it
    assert all(r["prompt_id"].startswith("countdown/") and r["model_id"] == str(fast_model_dir) for r in got)
    assert all(r["token_ids"] and len(r["token_ids"]) <= 4 and r["temperature"] == 1.0 for r in got)
    verdicts = lake.sql("SELECT trajectory_id, verifier FROM evaluations WHERE verifier <> 'imported'").to_pylist()
    assert sorted(v["trajectory_id"] for v in verdicts) == sorted(r["trajectory_id"] for r in got)  # judged once each
    assert lake.history("trajectories")[0]["version"] >= 2  # committed in batches, not row by row nor at once
    out = CliRunner().invoke(app, ["--lake", str(lake.root), "report", "passk", "--group-by", "run_id", "--k", "1",
                                   "--format", "json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert ("run-a", 6) in [(r["group"], r["samples"]) for r in report]  # (the dataset's solutions: no run)


def test_a_plain_reward_function_is_recorded_through_the_reward_map(lake, fast_model_dir, tmp_path):
    trainer = grpo_trainer(lake, str(fast_model_dir), str(tmp_path / "out"), "run-b", 1)
    trainer.reward_funcs[0] = lambda completions, **_: [0.25 * i for i in range(len(completions))]
    trainer.reward_funcs[0].__name__ = "score"
    recorder = record_rollouts(trainer, lake, reward_map=">=0.25")
    trainer.train()
    got = lake.sql("""SELECT json_extract(t.metadata, '$.reward_input')::DOUBLE AS score, e.reward, e.verifier
                      FROM trajectories t JOIN evaluations e USING (trajectory_id) WHERE t.source = 'trl-grpo'
                      ORDER BY 1""").to_pylist()
    assert got == [{"score": 0.0, "reward": -1.0, "verifier": "imported"},
                   {"score": 0.25, "reward": 0.0, "verifier": "imported"}]
    assert recorder.committed == 2


def _start(lake: Lake, model_dir: Path, out: Path, run_id: str, steps: int, flush_rows: int) -> subprocess.Popen:
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, str(SCRIPT), str(lake.root), str(model_dir), str(out), run_id, str(steps),
                             str(flush_rows)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(done, proc: subprocess.Popen) -> None:
    """Until done() (the bound only guards against a hung run; it does not decide a verdict)."""
    deadline = time.monotonic() + 600
    while not done():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "the run made no progress in 10 minutes"
        time.sleep(0.2)


def _calls_whole(got: list[dict]) -> bool:
    """Every reward call in the lake with both its completions, and the calls numbered from 0 without a gap."""
    calls = sorted(json.loads(r["metadata"])["trl"]["call"] for r in got)
    return calls == sorted(list(range(len(got) // 2)) * 2)


def test_a_killed_run_leaves_whole_batches_and_a_terminated_one_flushes(lake, fast_model_dir, tmp_path):
    # both at once (the lake is shared): `killed` commits every 4 rows, `stopped` only when it ends
    killed = _start(lake, fast_model_dir, tmp_path / "killed", "killed", 500, 4)
    stopped = _start(lake, fast_model_dir, tmp_path / "stopped", "stopped", 500, 1000)
    _wait_for(lambda: len(rows(lake, "run_id = 'killed'")) >= 8, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    got = rows(lake, "run_id = 'killed'")
    assert len(got) % 4 == 0 and _calls_whole(got)  # each commit a whole batch of 4: 2 calls of 2 completions

    _wait_for((tmp_path / "stopped" / "stepped").exists, stopped)
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait() == 143, stopped.stdout.read() if stopped.stdout else ""
    recorded = json.loads((tmp_path / "stopped" / "recorded.json").read_text())
    got = rows(lake, "run_id = 'stopped'")
    assert len(got) == recorded["rows"] == recorded["committed"] >= 2 and _calls_whole(got)


def test_two_runs_writing_one_lake_at_once_lose_nothing(lake, fast_model_dir, tmp_path):
    other = _start(lake, fast_model_dir, tmp_path / "two", "two", 8, 2)  # another process, writing while this trains
    trainer = grpo_trainer(lake, str(fast_model_dir), str(tmp_path / "one"), "one", 3)
    record_rollouts(trainer, lake, flush_rows=2)
    _wait_for((tmp_path / "two" / "stepped").exists, other)
    trainer.train()
    assert other.wait() == 0, other.stdout.read() if other.stdout else ""
    counts = lake.sql("SELECT run_id, count(*) AS n FROM trajectories WHERE source = 'trl-grpo' GROUP BY 1 "
                      "ORDER BY 1").to_pylist()
    assert counts == [{"run_id": "one", "n": 6}, {"run_id": "two", "n": 16}]
