#!/usr/bin/env bash
# The packed GRU weight products (engine/cpu/packed.h) on and off: bench/loop_bench's
# training step at each size with --packed best (the best kernel the CPU
# has: AVX-512F, else AVX2 + FMA) and --packed off (OpenBLAS's GEMM for
# every product), one OpenBLAS thread, interleaved round after round (which
# goes first alternates). A size BxH:infer times the inference step instead.
# Prints a markdown table of µs per step (median, min–max), the ratio of the
# medians, and the ratios of the two back-to-back runs of each round.
#
#   bash docs/figures/packed-choice.sh [--build DIR] [--rounds 5] [--segments 40] [--sizes 32x128,32x512,64x1024,1x128:infer]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-bench rounds=5 segments=40 sizes=32x128,32x512,64x1024
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --segments) segments="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    *) echo "packed-choice.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin="$build/bench/loop_bench"
[[ -x "$bin" ]] || { echo "packed-choice.sh: $bin is missing (cmake --build $build --target loop_bench)" >&2; exit 1; }
IFS=, read -r -a list <<<"$sizes"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for size in "${list[@]}"; do
    infer=0
    [[ $size == *:infer ]] && infer=1 size=${size%:infer}
    b=${size%x*} h=${size#*x}
    order=(best off)
    ((r % 2 == 0)) && order=(off best)  # alternate which goes first
    for p in "${order[@]}"; do
      us=$(OPENBLAS_NUM_THREADS=1 "$bin" --packed "$p" --batch "$b" --hidden "$h" --segments "$segments" --infer "$infer" 2>/dev/null)
      echo "$b $h $infer $p $us" >>"$out"
    done
  done
done
# OpenBLAS's kernel set as it chose it (OPENBLAS_CORETYPE, when set, chooses it),
# and the packed kernel --packed best takes, as the program reports them.
kernels=$("$bin" --packed best --kernels 1)
core=$(sed -n 's/^openblas //p' <<<"$kernels")
packed=$(sed -n 's/^packed //p' <<<"$kernels")
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
python3 - "$out" "$rounds" "$segments" "$sizes" "$core" "$packed" "$cpu" <<'PY'
import os, statistics, sys
path, rounds, segments, sizes, core, packed, cpu = sys.argv[1:8]
forced = os.environ.get('OPENBLAS_CORETYPE')
env = f"OPENBLAS_CORETYPE={forced} " if forced else ""
rows = {}
for line in open(path):
    b, h, infer, p, us = line.split()
    rows.setdefault((b, h, infer), {}).setdefault(p, []).append(float(us))
print(f"`{env}bash docs/figures/packed-choice.sh --rounds {rounds} --segments {segments} --sizes {sizes}` on {cpu} "
      f"(OpenBLAS kernels: {core}; packed kernel: {packed}): one thread, µs per step (median, min–max over {rounds} interleaved rounds).\n")
print("| B, H | step | packed (--packed best) | OpenBLAS GEMM (--packed off) | packed / GEMM, of the medians | packed / GEMM, round by round: median (min–max) |")
print("|---|---|---|---|---|---|")
for (b, h, infer), d in rows.items():
    on, off = d['best'], d['off']
    mo, mf = statistics.median(on), statistics.median(off)
    per = [x / y for x, y in zip(on, off)]  # the two runs of one round ran back to back
    print(f"| {b}, {h} | {'inference' if infer == '1' else 'training'} | {mo:.1f} ({min(on):.1f}–{max(on):.1f}) | "
          f"{mf:.1f} ({min(off):.1f}–{max(off):.1f}) | {mo / mf:.2f} | {statistics.median(per):.2f} ({min(per):.2f}–{max(per):.2f}) |")
PY
