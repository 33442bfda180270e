#!/usr/bin/env bash
# Reproduces the learning results in docs/agent.md (about 3 minutes on 2 cores).
# Usage: bash agent/experiments.sh [segtape binary] ; results under runs/experiments/
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${1:-build-main/agent/segtape}
[[ -x $BIN ]] || bash agent/run.sh --help >/dev/null
OUT=runs/experiments
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1
run() {  # name, args...
  local name=$1
  shift
  "$BIN" train --force --out "$OUT/$name" --eval-steps 1000 "$@" >"$OUT/$name.log" 2>&1
  printf "%-22s %s\n" "$name" "$(grep -E '^  eval' "$OUT/$name.log" | sed 's/^  eval //')"
}
run recall-default                              # recall, lag 8, tbptt:32 (the README's main job)
run tmaze --env tmaze --corridor 10 --steps 30016
run dialogue --env dialogue --steps 20000
for K in 8 32; do
  for L in 2 4 8 16 32; do run "recall-K$K-L$L" --history "tbptt:$K" --lag "$L"; done
done
