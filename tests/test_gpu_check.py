"""scripts/gpu_check.sh runs only when a GPU is lent: its --dry-run (CPU, tiny sizes) keeps it from rotting."""
import json
import math
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# runs every training variant of the GPU check on a dry model
@pytest.mark.integration
def test_gpu_check_dry_run_writes_every_figure(tmp_path):
    out = tmp_path / "figures.json"
    done = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] and report["vllm"] == {"skipped": "dry run (CPU)"}
    variants = report["models"]["dry"]["variants"]
    assert set(variants) == {"spo_cached", "spo_live", "ppo", "grpo"}
    for r in variants.values():
        for key in ("step_s", "response_tokens_per_s", "tflops", "mfu"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["variant"], key)
    assert {"ppo_over_spo_cached_step_s", "ppo_over_spo_live_step_s", "grpo_over_spo_cached_step_s"} <= set(
        report["models"]["dry"]["ratios"])
