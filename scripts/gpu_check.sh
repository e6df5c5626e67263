#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py; docs/real-model.md): bf16 SPO and PPO steps at 135 M and ~1 B parameters and
# vLLM rollouts where importable, in at most 8 minutes on one H100/H200, writing a JSON of figures (--out FILE).
# Needs only torch and transformers (no lake, no package index). `--dry-run` runs it on CPU at tiny sizes (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
exec timeout 480 "$PYTHON" bench/gpu_check.py "$@"
