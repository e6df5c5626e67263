#!/usr/bin/env bash
# Set up (idempotent), check the import layering, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/lint-imports --no-cache  # dependencies point one way (.importlinter)
exec .venv/bin/python -m pytest -q "$@"
