#!/usr/bin/env bash
# GEMV against GEMM for the products with one row (B = 1) under each OpenBLAS
# kernel set: bench/loop_bench at B = 1, H = 128, training and inference, with
# --gemv on and --gemv off (segtape/kernels.h; engine/cpu/blas.cpp), interleaved round
# after round. Prints a markdown table of µs per step (median, min–max) and
# which is faster; segtape's automatic choice is marked.
#
#   bash docs/figures/gemv-choice.sh [--build DIR] [--rounds 3] [--segments 200] [--cores Prescott,Haswell,SkylakeX,Cooperlake]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-bench rounds=3 segments=200 cores=Prescott,Haswell,SkylakeX,Cooperlake
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --segments) segments="$2"; shift 2 ;;
    --cores) cores="$2"; shift 2 ;;
    *) echo "gemv-choice.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin="$build/bench/loop_bench"
[[ -x "$bin" ]] || { echo "gemv-choice.sh: $bin is missing (cmake --build $build --target loop_bench)" >&2; exit 1; }
IFS=, read -r -a list <<<"$cores"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for core in "${list[@]}"; do
    for infer in 0 1; do
      for g in on off; do
        us=$(OPENBLAS_CORETYPE="$core" OPENBLAS_NUM_THREADS=1 "$bin" --gemv "$g" --batch 1 --hidden 128 --segments "$segments" --infer "$infer" 2>/dev/null)
        echo "$core $infer $g $us" >>"$out"
      done
    done
  done
done
python3 - "$out" "$rounds" "$segments" <<'PY'
import statistics, sys
path, rounds, segments = sys.argv[1:4]
rows = {}
for line in open(path):
    core, infer, g, us = line.split()
    rows.setdefault((core, infer), {}).setdefault(g, []).append(float(us))
auto_gemm = {"SkylakeX", "Cooperlake"}  # engine/cpu/blas.cpp keeps GEMM for these
print(f"`bash docs/figures/gemv-choice.sh --rounds {rounds} --segments {segments}`: B = 1, H = 128, one thread, "
      f"µs per step (median, min–max over {rounds} interleaved rounds); * marks segtape's automatic choice.\n")
print("| OpenBLAS kernels | step | GEMV (--gemv on) | GEMM (--gemv off) | GEMM / GEMV |")
print("|---|---|---|---|---|")
for (core, infer), d in rows.items():
    v, m = d['on'], d['off']
    mv, mm = statistics.median(v), statistics.median(m)
    star_v, star_m = ("", "*") if core in auto_gemm else ("*", "")
    print(f"| {core} | {'inference' if infer == '1' else 'training'} | {mv:.1f} ({min(v):.1f}–{max(v):.1f}){star_v} | "
          f"{mm:.1f} ({min(m):.1f}–{max(m):.1f}){star_m} | {mm / mv:.2f} |")
PY
