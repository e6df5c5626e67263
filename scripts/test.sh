#!/usr/bin/env bash
# Set up (idempotent), check the import layering and lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/lint-imports --no-cache  # dependencies point one way (.importlinter)
.venv/bin/ruff check .            # pyflakes, pycodestyle at 120 columns, isort, bugbear, pyupgrade (pyproject.toml)
exec .venv/bin/python -m pytest -q "$@"
