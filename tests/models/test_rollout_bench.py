"""bench/rollout_bench.py's dry run: every row (sampling vs HF generate and the matmul limit, continuous vs static
batches, scoring) still runs, on the fast tiny model."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_the_rollout_bench_dry_run_prints_every_row(fast_model_dir):
    done = subprocess.run([sys.executable, "bench/rollout_bench.py", "--model", str(fast_model_dir), "--dry-run",
                           "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    for row in ("ours/generate", "ours/limit", "vllm", "continuous/static", "ours/forward"):
        assert row in done.stdout, done.stdout
