#!/usr/bin/env bash
# ctest cuda_bench_modes_agree: cuda_bench's modes (eager, graph, sequence,
# sequence-graph, sequence-graph-tf32) on the CPU (--device cpu: no GPU needed, graph replay is
# ignored there) must compute the same training: each mode's final loss
# within 1e-5 relative of eager's at every size. Not a benchmark: the times
# it prints mean nothing.
#   bench/modes_agree.sh PATH/TO/cuda_bench
set -euo pipefail
out=$("$1" --device cpu --segments 3 --sizes 2x16,5x24)
echo "$out"
echo "$out" | awk -F, '
  NR == 1 { next }
  { n++; key = $3 "," $4 }
  $2 == "eager" { ref[key] = $9; next }
  !(key in ref) { print "no eager row before " $2 " at B,H = " key; bad = 1; next }
  { d = $9 - ref[key]; if (d < 0) d = -d
    if (d > 1e-5 * ref[key]) { print $2 " at B,H = " key ": final loss " $9 ", eager " ref[key]; bad = 1 } }
  END { if (n != 10) { print "expected 10 rows (5 modes x 2 sizes), got " n; bad = 1 }
        if (!bad) print "all modes agree"
        exit bad }'
