#!/usr/bin/env bash
# Set up (idempotent), check the import layering, lint, types and the docs build, and run the whole test suite on one
# pytest worker per core (pytest-xdist: each module on one worker, in the order tests/conftest.py gives); `--fast`
# runs only the fast tier (docs/testing.md). Other arguments go to pytest.
set -euo pipefail
tier=()
if [[ "${1:-}" == "--fast" ]]; then shift; tier=(-m "not slow and not integration"); fi
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/lint-imports --no-cache  # dependencies point one way (.importlinter)
.venv/bin/ruff check .            # pyflakes, pycodestyle at 120 columns, isort, bugbear, pyupgrade (pyproject.toml)
.venv/bin/mypy                    # types of spo_lake/, default mode (pyproject.toml [tool.mypy])
# the docs (mkdocs.yml): a broken link between pages fails (not with --quiet: it hides the warnings strict counts);
# the site goes to a temporary directory, not the tree
site="$(mktemp -d)"; .venv/bin/mkdocs build --strict --site-dir "$site"; rm -rf "$site"
exec .venv/bin/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder "${tier[@]}" "$@"
