#!/usr/bin/env bash
# One-time (idempotent) set-up: bubblewrap for the sandbox, a venv with CPU torch, then the project.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "warning: bubblewrap (bwrap) is missing and this is not root: install it (apt-get install bubblewrap) to run generated code" >&2
  fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
# (pip warns about every empty local index entry on this kind of machine; those lines are noise)
quiet_pip() { .venv/bin/pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
.venv/bin/python -c "import torch" 2>/dev/null || quiet_pip torch==2.13.0
quiet_pip -e '.[test]'
