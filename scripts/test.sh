#!/usr/bin/env bash
# Set up (idempotent), check the import layering, lint and types, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/lint-imports --no-cache  # dependencies point one way (.importlinter)
.venv/bin/ruff check .            # pyflakes, pycodestyle at 120 columns, isort, bugbear, pyupgrade (pyproject.toml)
.venv/bin/mypy                    # types of spo_lake/, default mode (pyproject.toml [tool.mypy])
exec .venv/bin/python -m pytest -q "$@"
