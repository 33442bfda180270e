#!/usr/bin/env bash
# Times the workload's loop (bench/loop_bench: B, H, train or inference) built
# at a base commit against the working tree, interleaved (before, after; then
# after, before; ...) and prints a markdown table of µs per step (median and
# min–max over the rounds) with after / before.
#
#   bash docs/figures/before-after.sh BASE [--rounds 7] [--segments 300] [--sizes 1x128,1x128:infer,32x128,32x128:infer]
#
# --sizes: B x H, ":infer" for the inference step (default: the four above).
#
# Both builds: Release, -march=native (SEGTAPE_NATIVE), no CUDA, no LibTorch,
# no tests; the base in a git worktree under /tmp. One thread.
set -euo pipefail
cd "$(dirname "$0")/../.."
base="${1:?usage: before-after.sh BASE [--rounds N] [--segments N] [--sizes BxH[:infer],...]}"; shift
rounds=7 segments=300 sizes=1x128,1x128:infer,32x128,32x128:infer
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --segments) segments="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    *) echo "before-after.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
rev=$(git rev-parse --short "$base")
wt=/tmp/segtape-before-$rev
git worktree prune
[[ -d "$wt" ]] || git worktree add -q --detach "$wt" "$rev"
# The base may predate loop_bench's --infer: the working tree's loop_bench source is used for both.
cp bench/loop_bench.cpp "$wt/bench/loop_bench.cpp"
source docs/figures/build-ba.sh
for dir in "$wt" "$PWD"; do build_ba "$dir" loop_bench; done
cases=()
IFS=, read -r -a list <<<"$sizes"
for s in "${list[@]}"; do
  [[ $s =~ ^([0-9]+)x([0-9]+)(:infer)?$ ]] || { echo "before-after.sh: --sizes wants BxH or BxH:infer, got '$s'" >&2; exit 2; }
  cases+=("${BASH_REMATCH[1]} ${BASH_REMATCH[2]} $([[ -n ${BASH_REMATCH[3]} ]] && echo 1 || echo 0)")
done
out=$(mktemp)
for ((r = 1; r <= rounds; r++)); do
  for c in "${cases[@]}"; do
    read -r B H infer <<<"$c"
    # Odd rounds run before first, even rounds after first: no side always goes first.
    order=(before after)
    ((r % 2)) || order=(after before)
    for side in "${order[@]}"; do
      dir=$([[ $side == before ]] && echo "$wt" || echo "$PWD")
      us=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$dir/build-ba/bench/loop_bench" --batch "$B" --hidden "$H" --segments "$segments" --infer "$infer")
      echo "$B $H $infer $side $us" >>"$out"
    done
  done
done
dirty=$(git diff --quiet HEAD -- engine nn CMakeLists.txt && echo "" || echo " + uncommitted changes")
# OpenBLAS's kernel set as it chose it (OPENBLAS_CORETYPE, when set, chooses it).
core=$(OPENBLAS_VERBOSE=2 "$PWD/build-ba/bench/loop_bench" --segments 1 2>&1 | sed -n 's/^Core: //p' | head -1)
python3 - "$out" "$rev" "$(git rev-parse --short HEAD)$dirty" "$rounds" "$segments" "$core" "$sizes" <<'PY'
import os, statistics, sys
path, before, after, rounds, segments, core, sizes = sys.argv[1:8]
forced = os.environ.get('OPENBLAS_CORETYPE')
env = f"OPENBLAS_CORETYPE={forced} " if forced else ""
rows = {}
for line in open(path):
    B, H, infer, side, us = line.split()
    rows.setdefault((B, H, infer), {}).setdefault(side, []).append(float(us))
given = "" if sizes == "1x128,1x128:infer,32x128,32x128:infer" else f" --sizes {sizes}"
print(f"`{env}bash docs/figures/before-after.sh {before} --rounds {rounds} --segments {segments}{given}`: {before} against {after}, "
      f"{rounds} interleaved rounds, one thread, OpenBLAS kernels {core}, µs per step (median, min–max over the rounds; each round one run of "
      f"{segments} segments of 32 steps after 10 warm-up segments).\n")
print("| B, H | step | before | after | after / before | round by round: median (min–max) |")
print("|---|---|---|---|---|---|")
for (B, H, infer), d in rows.items():
    b, a = d['before'], d['after']
    mb, ma = statistics.median(b), statistics.median(a)
    paired = [y / x for x, y in zip(b, a)]  # after / before within each round
    print(f"| {B}, {H} | {'inference' if infer == '1' else 'training'} | {mb:.2f} ({min(b):.2f}–{max(b):.2f}) | "
          f"{ma:.2f} ({min(a):.2f}–{max(a):.2f}) | {ma / mb:.3f} | "
          f"{statistics.median(paired):.3f} ({min(paired):.3f}–{max(paired):.3f}) |")
PY
rm -f "$out"
