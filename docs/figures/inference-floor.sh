#!/usr/bin/env bash
# Issue 18's inference step at B = 1, H = 128 against its floor on this CPU:
# the time to read the step's weights once from L2 (bench/read_floor) and
# the inference step (bench/loop_bench --infer 1), alternated round by round
# on one thread; prints a markdown table (median, min–max over the rounds).
#
#   bash docs/figures/inference-floor.sh [--rounds 9]
#
# Build: the working tree's build-ba (Release, -march=native, no CUDA, no
# LibTorch, no tests), as docs/figures/before-after.sh makes it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source docs/figures/build-ba.sh
parse_rounds inference-floor.sh 9 "$@"
build_ba . loop_bench read_floor
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
out=$(mktemp)
for ((r = 1; r <= rounds; r++)); do
  floor=$(build-ba/bench/read_floor --samples 5 | sed -E 's/.*one read ([0-9.]+) us.*/\1/')
  step=$(build-ba/bench/loop_bench --batch 1 --hidden 128 --infer 1 --segments 2000)
  echo "$floor $step" >>"$out"
done
bytes=$(build-ba/bench/read_floor --samples 1 | sed -E 's/.*W, ([0-9]+) bytes.*/\1/')
python3 - "$out" "$rounds" "$bytes" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" <<'PY'
import statistics as st, sys
path, rounds, nbytes, cpu = sys.argv[1:5]
floor, step = zip(*(map(float, l.split()) for l in open(path)))
cell = lambda x: f"{st.median(x):.2f} ({min(x):.2f}–{max(x):.2f})"
ratio = sorted(s / f for s, f in zip(step, floor))
rest = sorted(s - f for s, f in zip(step, floor))
print(f"`bash docs/figures/inference-floor.sh --rounds {rounds}` on {cpu}, one thread: µs, median (min–max) over {rounds} rounds, "
      f"each round one read_floor (5 samples of 2,000 reads of the {int(nbytes):,} bytes of W_ih, W_hh and the head's W) and one "
      f"loop_bench --infer 1 (2,000 segments of 32 steps).")
print()
print("| weights read once (floor) | inference step | step / floor | step − floor |")
print("|---|---|---|---|")
print(f"| {cell(floor)} | {cell(step)} | {st.median(ratio):.2f} ({ratio[0]:.2f}–{ratio[-1]:.2f}) | {cell(rest)} |")
PY
rm -f "$out"
