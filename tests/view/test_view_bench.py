"""bench/view_bench.py's dry run keeps the benchmark working (its figures are in docs/viewer.md)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration  # a whole script in a subprocess, as tests/test_gpu_check.py's dry run
def test_view_bench_dry_run(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "view_bench.py"), "--dry-run", "--keep",
                             str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "300 trajectories shown" in result.stdout
    assert (tmp_path / "site" / "index.html").is_file()
