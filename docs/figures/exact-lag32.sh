#!/usr/bin/env bash
# The longer runs behind docs/exact-bptt.md's "What it learns" at lag 32:
# recall, lag 32, default model (vocab 4, H = 128, B = 32), one binary, one
# run each, the greedy eval of 500 fresh steps printed at the end of each.
# About 45 minutes on 2 cores. Usage: bash docs/figures/exact-lag32.sh [path/to/segtape]
set -euo pipefail
S=${1:-build/agent/segtape}
out=$(mktemp -d)
run() {
  local name=$1; shift
  "$S" train --env recall --lag 32 --out "$out/$name" --force "$@" > "$out/$name.log" 2>&1
  printf '%-40s %s\n' "$name $*" "$(grep -o 'eval accuracy *[0-9.]*%' "$out/$name.log")"
}
run tbptt64 --history tbptt:64 --steps 100000
run exact32_64 --history exact:32/64 --steps 100000
run exact32_64_lr1e-3 --history exact:32/64 --steps 100000 --lr 1e-3
run exact32_64_h256 --history exact:32/64 --steps 100000 --hidden 256
run exact32_64_400k --history exact:32/64 --steps 400000
run exact32_64_400k_lr6e-3 --history exact:32/64 --steps 400000 --lr 6e-3
echo "logs in $out"
