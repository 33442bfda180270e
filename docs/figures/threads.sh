#!/usr/bin/env bash
# Times the workload's loop (bench/loop_bench) on one and on two OpenBLAS
# threads, alternated round by round, and prints a markdown table: µs per
# step (median, min–max over the rounds) and two / one round by round.
#
#   bash docs/figures/threads.sh [--rounds 7]
#
# Build: the working tree's build-ba (Release, -march=native, no CUDA, no
# LibTorch, no tests), as docs/figures/before-after.sh makes it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source docs/figures/build-ba.sh
parse_rounds threads.sh 7 "$@"
build_ba . loop_bench
# B H inference segments
cases=("1 128 0 200" "1 128 1 200" "32 128 0 40")
out=$(mktemp)
for ((r = 1; r <= rounds; r++)); do
  # Odd rounds run one thread first, even rounds two: no count always goes first.
  order=(1 2)
  ((r % 2)) || order=(2 1)
  for th in "${order[@]}"; do
    for c in "${cases[@]}"; do
      read -r B H infer segments <<<"$c"
      us=$(OPENBLAS_NUM_THREADS=$th OMP_NUM_THREADS=$th build-ba/bench/loop_bench --batch "$B" --hidden "$H" --segments "$segments" --infer "$infer")
      echo "$B $H $infer $th $us" >>"$out"
    done
  done
done
python3 - "$out" "$rounds" <<'PY'
import statistics as st, sys
path, rounds = sys.argv[1:3]
d = {}
for line in open(path):
    B, H, infer, th, us = line.split()
    d.setdefault((B, H, infer), {}).setdefault(th, []).append(float(us))
print(f"`bash docs/figures/threads.sh --rounds {rounds}`: µs per step, median (min–max) over {rounds} rounds; two / one round by round, median (min–max).")
print()
print("| B, H | one thread | two threads | two / one |")
print("|---|---|---|---|")
for (B, H, infer), v in d.items():
    one, two = v["1"], v["2"]
    r = sorted(t / o for t, o in zip(two, one))
    cell = lambda x: f"{st.median(x):.2f} ({min(x):.2f}–{max(x):.2f})"
    name = f"{B}, {H} {'inference' if infer == '1' else 'training'}"
    print(f"| {name} | {cell(one)} | {cell(two)} | {st.median(r):.3f} ({r[0]:.3f}–{r[-1]:.3f}) |")
PY
rm -f "$out"
