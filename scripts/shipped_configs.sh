#!/usr/bin/env bash
# The figures of docs/results-shipped-configs.md: every countdown config in configs/, each run exactly as its header
# documents, on its own copy of the lake the headers prepare. Usage: bash scripts/shipped_configs.sh [OUT_DIR]
# (default shipped-configs/). Rerunning skips what is done. Held-out pass@k: OUT/runs/<config>/metrics.jsonl.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$(mkdir -p "${1:-shipped-configs}" && cd "${1:-shipped-configs}" && pwd)"
S="$REPO/.venv/bin/spolake"
cd "$OUT"
if [ ! -f prep.done ]; then
  rm -rf base runs
  export SPOLAKE_LAKE="$OUT/base"
  $S init
  $S model tiny --out runs/tiny
  $S prompts add --dataset countdown --n 200 --seed 0
  $S prompts add --dataset countdown --n 50 --seed 1
  $S q0 --model runs/tiny --k 32 --max-new-tokens 24 --where "p.prompt_id LIKE 'countdown/0/%'"
  $S refprobs --model runs/tiny --where "t.source = 'human'"
  touch prep.done
fi
for c in spo_countdown ppo_countdown spo_countdown_mc; do
  [ -f "$c.done" ] && continue
  rm -rf "lake-$c" "runs/$c"; cp -a base "lake-$c"
  export SPOLAKE_LAKE="$OUT/lake-$c"
  if [ "$c" = spo_countdown_mc ]; then  # its header adds judged human solutions' PTS estimates
    $S judge --where "t.source = 'human'"
    $S pts --model runs/tiny --k 8 --max-new-tokens 48 --s0-range 0.05 0.95 \
        --where "t.source = 'human' AND t.prompt_id LIKE 'countdown/0/1_'"
  fi
  $S train --config "$REPO/configs/$c.toml" --set run_name="$c"
  touch "$c.done"
done
for c in spo_countdown ppo_countdown spo_countdown_mc; do
  "$REPO/.venv/bin/python" -c "import json, sys
evals = [e for e in map(json.loads, open(sys.argv[2])) if 'pass@1' in e]
print(sys.argv[1], ' '.join(f\"step {e['step']}: pass@1 {e['pass@1']:.3f} pass@10 {e['pass@10']:.3f}\" for e in evals))" \
    "$c" "runs/$c/metrics.jsonl"
done
