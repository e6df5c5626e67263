"""`kill` on a running `spolake demo` stops what it started: the model builds side by side and the training runs are
child processes that a SIGTERM to the demo alone would not reach."""
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spo_lake.lake import Lake
from spo_lake.models.tiny import is_built
from spo_lake.rl.run import checkpoint_dirs
from tests.helpers import alive


def descendants(pid: int) -> list[int]:
    """Every process below `pid` now (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def wait_for(condition, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.5)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_demo_when(out: Path, started, what: str) -> dict[int, str]:
    """Start `spolake demo --quick --out OUT`, SIGTERM it once `started()` holds and it has children; return the
    processes below it then ({pid: command line}), after checking that it exited with 143."""
    proc = subprocess.Popen([sys.executable, "-m", "spo_lake.cli.app", "demo", "--quick", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (started() and descendants(proc.pid)) or proc.poll() is not None, what, 1200)
        assert proc.poll() is None, f"the demo ended before {what}: {proc.stderr.read()[-2000:]}"
        below = {pid: cmdline(pid) for pid in descendants(proc.pid)}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=600) == 143
        return below
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# starts the demo twice: builds transformers, samples and trains
@pytest.mark.integration
def test_a_killed_demo_stops_its_model_builds_and_its_training_runs(tmp_path, fast_model_dir):
    builds = tmp_path / "builds"
    below = kill_demo_when(builds, lambda: (builds / "seed-0" / "logs" / "model-pi0.log").exists(),
                           "the model builds")
    assert sum("multiprocessing" in line for line in below.values()) >= 2  # the two build workers
    wait_for(lambda: not any(alive(p) for p in below), "the build workers to stop", 120)
    assert not is_built(builds / "seed-0" / "models" / "pi0")  # stopped, not waited for

    runs = tmp_path / "runs"
    for name in ("pi0", "cot"):  # built models are kept: the demo goes straight to its recipe, then trains
        shutil.copytree(fast_model_dir, runs / "seed-0" / "models" / name)
    below = kill_demo_when(runs, lambda: any((runs / "seed-0" / "runs").glob("*/metrics.jsonl")),
                           "the first training step")
    assert any("spo_lake.cli.app" in line and " train " in line for line in below.values())  # the runs
    wait_for(lambda: not any(alive(p) for p in below), "the training runs to stop", 120)
    assert not any(checkpoint_dirs(run) for run in (runs / "seed-0" / "runs").iterdir())  # no run got to its end
    # the terminated `spolake train` child recorded its end (it used to die as it was: its run stayed `running`)
    statuses = Lake.open(runs / "seed-0" / "lake").sql(
        "SELECT arg_max(status, created_at) AS status FROM runs WHERE kind = 'train' GROUP BY run_id").to_pylist()
    assert statuses and {r["status"] for r in statuses} == {"interrupted"}, statuses
