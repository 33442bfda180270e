#!/usr/bin/env bash
# Soak: `segtape train` for STEPS steps at a small size must keep its resident
# memory flat (growth under 1 MiB after warm-up) and its segment high-water
# identical in every metrics.csv row. Usage: tests/soak.sh [STEPS] [SEGTAPE_BIN]
# (default 100000 steps; ctest label `soak`; docs/hardening.md has the figures).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=${1:-100000}
bin=${2:-${SEGTAPE_BIN:-${SEGTAPE_BUILD:-$root/build}/agent/segtape}}
[[ -x "$bin" ]] || { echo "soak: no segtape program at $bin (build first, or pass its path)" >&2; exit 1; }
k=32
steps=$(( (steps + k - 1) / k * k ))          # whole segments: the last one is not shorter
log_every=$(( steps / 200 / k * k )); (( log_every >= 2 * k )) || log_every=$(( 2 * k ))
warm_step=$(( steps / 10 > 2000 ? steps / 10 : 2000 ))  # rows before this are warm-up
work=$(mktemp -d "${TMPDIR:-/tmp}/segtape-soak.XXXXXX")
trap 'rm -rf "$work"' EXIT

start=$(date +%s%N)
OPENBLAS_NUM_THREADS=1 "$bin" train --env recall --history tbptt:$k --steps "$steps" --batch 4 --hidden 32 --seed 3 \
  --log-every "$log_every" --eval-steps 64 --out "$work/run" >"$work/log" 2>&1 ||
  { cat "$work/log" >&2; echo "soak: segtape train failed" >&2; exit 1; }
secs=$(( ($(date +%s%N) - start) / 1000000 ))  # ms

# step,loss,accuracy,segment_peak_bytes,rss_bytes,steps_per_s
awk -F, -v warm="$warm_step" -v steps="$steps" -v secs="$secs" '
  NR == 1 { next }
  { rows++; peak[rows] = $4; rss[rows] = $5; step[rows] = $1 }
  END {
    if (rows < 10 || step[rows] != steps) { printf "soak: metrics.csv has %d rows ending at step %s, expected %d\n", rows, step[rows], steps; exit 1 }
    w = 0
    for (i = 1; i <= rows; i++) if (w == 0 && step[i] >= warm) w = i
    maxrss = rss[w]
    for (i = w; i <= rows; i++) if (rss[i] > maxrss) maxrss = rss[i]
    growth = maxrss - rss[w]
    bad = 0
    for (i = 1; i <= rows; i++) if (peak[i] != peak[1]) { printf "soak: segment high-water %d at step %d differs from %d at step %d\n", peak[i], step[i], peak[1], step[1]; bad = 1; break }
    printf "soak: %d steps in %.1f s, %d rows; RSS %.2f MiB at warm-up (step %d), %.2f MiB at the end, growth after warm-up %.1f KiB (limit 1024); segment high-water %d bytes in every row\n",
      steps, secs / 1000, rows, rss[w] / 1048576, step[w], rss[rows] / 1048576, growth / 1024, peak[1]
    if (growth >= 1048576) { print "soak: resident memory grew by 1 MiB or more after warm-up"; bad = 1 }
    exit bad
  }' "$work/run/metrics.csv"
