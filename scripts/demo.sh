#!/usr/bin/env bash
# Set up (idempotent) and run the main job: `spolake demo`, end to end on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/spolake demo "$@"
