"""`spolake chain` end to end: tiny π0, countdown, real lake, real sandbox, `spolake train` children."""
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.identity import model_identity
from spo_lake.pipelines.q0 import q0
from spo_lake.pipelines.refprobs import refprobs
from spo_lake.rl.batches import batch_sources
from spo_lake.rl.config import load_config
from spo_lake.rl.data import LakeStream, StreamSettings
from spo_lake.rl.run import checkpoint_dirs, read_metrics
from tests.helpers import alive

STEPS = 4  # online rollouts per step: 4 (batch 8, half online)


def countdown_lake(root: Path, model: Path) -> Lake:
    """4 countdown problems with solver solutions, π0's Q0 counts and cached log-probs of the solutions."""
    policy = TransformersPolicy.from_pretrained(str(model))
    lake = Lake.init(root)
    ingest_dataset(lake, "countdown", None, n=4, seed=0)
    q0(lake, policy, k=4, max_new_tokens=16, show_progress=False)
    refprobs(lake, policy, where="t.source = 'human'", show_progress=False)
    return lake


@pytest.fixture()
def lake(tmp_path, fast_model_dir) -> Lake:
    return countdown_lake(tmp_path / "lake", fast_model_dir)


def write_config(tmp_path: Path, model: Path, steps: int = STEPS) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f"""
model = "{model}"
steps = {steps}
batch_size = 8
lr = 5e-4
warmup_steps = 1
max_new_tokens = 16
model_update_interval = 2
checkpoint_every = 2
judge_workers = 1
loss = "squared"

[[streams]]
name = "online"
kind = "online"
fraction = 0.5

[[streams]]
name = "lake"
kind = "lake"
fraction = 0.5
where = "passed OR source = 'spo'"

[chain]
name = "c"
dir = "{tmp_path / 'chains'}"

[[chain.between]]
run = "evaluate"

[[chain.between]]
run = "dedup"

[[chain.between]]
run = "refprobs"
model = "{model}"
where = "t.source = 'spo'"
""")
    return path


def chain_cmd(lake: Lake, config: Path, runs: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spo_lake.cli.app", "--lake", lake.root, "chain", "--config", str(config),
            "--runs", str(runs), "--quiet", *extra]


def count(lake: Lake, sql: str, snapshot: str | None = None) -> int:
    return lake.sql(f"SELECT count(*) AS n FROM {sql}", snapshot).column("n")[0].as_py()


@pytest.mark.parametrize("how", ["kill", "ctrl-c"])
def test_a_stopped_chain_stops_its_training_child_which_records_its_run_interrupted(tmp_path, lake, fast_model_dir,
                                                                                   how):
    """`kill PID` (SIGTERM to the chain alone) or a terminal's Ctrl-C (SIGINT to the chain and its child, which the
    chain then terminates too): the chain exits 143 or 130 and its `spolake train` child stops, recording its run
    interrupted. The child used to be SIGKILLed, and its run stayed `running` for ever."""
    config = write_config(tmp_path, fast_model_dir, steps=10_000)
    process = subprocess.Popen(chain_cmd(lake, config, 2), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    metrics = tmp_path / "chains" / "c" / "runs" / "c-run-1" / "metrics.jsonl"
    deadline = time.monotonic() + 1200  # bounds a hang, never judges a slow start
    while not (metrics.exists() and metrics.read_text()) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, process.stderr.read().decode()[-2000:]
    (child,) = map(int, Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split())
    signum = signal.SIGTERM if how == "kill" else signal.SIGINT
    if how == "kill":
        process.send_signal(signum)
    else:
        os.killpg(process.pid, signum)
    assert process.wait(timeout=600) == 128 + signum, process.stderr.read().decode()[-2000:]
    deadline = time.monotonic() + 120  # the child records its end on its own time, if after the chain's exit
    while alive(child):
        assert time.monotonic() < deadline, "the training child did not stop"
        time.sleep(0.1)
    statuses = lake.sql("SELECT run_id, arg_max(status, created_at) AS status FROM runs WHERE kind = 'train' "
                        "GROUP BY run_id").to_pylist()
    assert statuses == [{"run_id": "c-run-1", "status": "interrupted"}]


def test_a_killed_chain_resumes_and_each_run_reads_what_the_earlier_ones_wrote(tmp_path, lake, fast_model_dir):
    config = write_config(tmp_path, fast_model_dir, steps=6)
    root = tmp_path / "chains" / "c"
    # Kill the chain (and its training child) once run 2 has a checkpoint but has not finished.
    process = subprocess.Popen(chain_cmd(lake, config, 2), start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 1200  # bounds a hang: run 1 and run 2's start take minutes on a loaded machine
    while not checkpoint_dirs(root / "runs" / "c-run-2") and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()[-2000:]
    assert checkpoint_dirs(root / "runs" / "c-run-2"), "no checkpoint of run 2 within the bound: the chain hung"
    killed = json.loads((root / "manifest.json").read_text())
    assert [r["status"] for r in killed["runs"]] == ["finished", "pinned"]
    run1_metrics = (root / "runs" / "c-run-1" / "metrics.jsonl").read_text()

    again = subprocess.run(chain_cmd(lake, config, 2), capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert "finished earlier, skipped" in said and "--resume" in said
    assert (root / "runs" / "c-run-1" / "metrics.jsonl").read_text() == run1_metrics  # run 1 was not re-trained

    manifest = json.loads((root / "manifest.json").read_text())
    assert [(r["run"], r["run_id"], r["snapshot"], r["status"]) for r in manifest["runs"]] == \
        [(1, "c-run-1", "c-run-1", "finished"), (2, "c-run-2", "c-run-2", "finished")]
    for r in manifest["runs"]:
        assert r["snapshot_versions"] == lake.get_snapshot(r["snapshot"]).versions
        resolved = load_config(r["config"])  # re-trains the run exactly: same snapshot, same everything
        assert (resolved.data.snapshot, resolved.run.name, resolved.model.path, resolved.run.seed) == \
            (r["snapshot"], r["run_id"], str(fast_model_dir), r["run"] - 1)
        assert Path(r["checkpoint"]).name == "step-0000006"
    assert [m["step"] for m in read_metrics(root / "runs" / "c-run-2")] == list(range(1, 7))

    # Run 1's rollouts (with verdicts, deduped, with π0 log-probs) are in run 2's snapshot and not in run 1's.
    rows = "trajectories WHERE run_id = 'c-run-1'"
    assert count(lake, rows, "c-run-1") == 0
    assert count(lake, rows, "c-run-2") == count(lake, rows) == 6 * 4
    pi0 = model_identity(str(fast_model_dir))
    for table, key in (("evaluations", "trajectory_id"), ("duplicates", "trajectory_id"),
                       ("(SELECT DISTINCT trajectory_id FROM logprobs WHERE model_id = '" + pi0 + "')",
                        "trajectory_id")):
        assert count(lake, f"{table} x JOIN {rows.replace('WHERE', 't ON t.trajectory_id = x.' + key + ' AND')}",
                     "c-run-2") >= 6 * 4, table
    # the killed child's rollouts were not written twice
    assert count(lake, "trajectories WHERE run_id = 'c-run-2'") == 6 * 4

    # Run 2's batches by source: its own 24 rollouts, and 24 lake rows whose sources are those the trainer's own
    # stream reader draws at that snapshot (solver solutions, π0's correct Q0 samples and run 1's rollouts, which
    # the stream takes whatever their verdict, so that what run 2 can read never depends on what π0 sampled).
    table = batch_sources(lake, root / "runs" / "c-run-2").to_pylist()
    online = [(r["stream"], r["source"], r["sequences"]) for r in table if r["kind"] == "online"]
    assert online == [("online", "spo", 24)]
    config = load_config(manifest["runs"][1]["config"])
    settings = StreamSettings(pi0_id=config.model.pi0_id, beta=config.algorithm.beta, seed=config.run.seed,
                              max_response_tokens=config.data.max_response_tokens, page_size=config.data.page_size,
                              q0_prior=config.algorithm.q0_prior)
    policy = TransformersPolicy.from_pretrained(str(fast_model_dir))
    stream = LakeStream(lake, "c-run-2", config.data.streams[1], 1, settings, policy)
    drawn = [e.trajectory_id for e in stream.take(6 * 4)]
    sources = lake.sql("SELECT trajectory_id, source FROM trajectories").to_pylist()
    expected = Counter({r["trajectory_id"]: r["source"] for r in sources}[t] for t in drawn)
    assert {r["source"]: r["sequences"] for r in table if r["kind"] == "lake"} == expected
    # run 2's selection is run 1's: exactly run 1's 24 rollouts more (nothing else was written between the two)
    before = LakeStream(lake, "c-run-1", config.data.streams[1], 1, settings, policy)
    assert stream.size - before.size == 6 * 4
    csv = subprocess.run([sys.executable, "-m", "spo_lake.cli.app", "--lake", lake.root, "report", "batch",
                          str(root / "runs" / "c-run-2"), "--format", "csv"], capture_output=True, text=True)
    assert csv.returncode == 0 and csv.stdout.splitlines()[0].startswith('"stream","kind","source","sequences"')


def test_from_previous_checkpoint_trains_run_2_from_run_1s_weights_with_pi0_as_reference(lake, fast_model_dir,
                                                                                        tmp_path):
    config = write_config(tmp_path, fast_model_dir, steps=2)
    result = subprocess.run(chain_cmd(lake, config, 2, "--from-previous-checkpoint", "--set", "lr=1e-3"),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads((tmp_path / "chains" / "c" / "manifest.json").read_text())["runs"]
    second = json.loads(Path(runs[1]["run_dir"], "manifest.json").read_text())["config"]
    assert second["model"] == runs[0]["checkpoint"] and second["reference"] == str(fast_model_dir)
    assert second["lr"] == 1e-3
    # the weights run 2 started from are run 1's: its rollouts of step 0 carry the checkpoint as their model
    models = lake.sql("SELECT DISTINCT model_id FROM trajectories WHERE run_id = 'c-run-2'").column(0).to_pylist()
    assert models == [runs[0]["checkpoint"]]

    # the same command with another setting is refused: the chain was started with a different config
    changed = subprocess.run(chain_cmd(lake, config, 3, "--from-previous-checkpoint"), capture_output=True,
                             text=True, timeout=1200)
    assert changed.returncode != 0 and "different base_config" in changed.stderr


def test_a_bad_between_step_is_named_with_its_line(tmp_path, fast_model_dir):
    from spo_lake.chain import load_chain

    config = write_config(tmp_path, fast_model_dir)
    config.write_text(config.read_text() + '\n[[chain.between]]\nrun = "dedup"\nmodel = "x"\n')
    with pytest.raises(ValueError, match=r"run.toml.*chain.between\[3\] \(dedup\): unknown key\(s\) \['model'\]"):
        load_chain(config)


def test_a_failing_run_stops_the_chain_with_one_line_and_a_bad_config_names_its_line(lake, fast_model_dir,
                                                                                   tmp_path):
    config = write_config(tmp_path, fast_model_dir)
    failed = subprocess.run(chain_cmd(lake, config, 2, "--set", 'streams.lake.where="no_such_column"'),
                            capture_output=True, text=True, timeout=1200)
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines()[-1] == \
        "error: chain c: run 1 (c-run-1) exited with 1; re-run the same command to continue it"
    assert "no_such_column" in failed.stderr  # the child's own one-line reason
    runs = json.loads((tmp_path / "chains" / "c" / "manifest.json").read_text())["runs"]
    assert [(r["run_id"], r["status"]) for r in runs] == [("c-run-1", "pinned")]

    config.write_text(config.read_text().replace("steps = 4", "steps = 0"))
    bad = subprocess.run(chain_cmd(lake, config, 1), capture_output=True, text=True, timeout=1200)
    assert bad.returncode == 1 and bad.stderr.strip() == f"error: {config}:line 3: config: steps must be >= 1, got 0"
