#!/usr/bin/env bash
# bench/compare's plumbing, quickly: the driver starts its timing workers and
# the untimed memory pass (compare_memory), reads their lines and prints the
# tables, with the peak line for the FLOP floor. Times are not checked (this is
# not a timed test); the memory pass's zero heap allocations for segtape's
# inference step and its filter are.
#   compare_smoke.sh BUILD_BENCH_DIR
set -euo pipefail
dir="$1"
out=$("$dir/compare" --threads 1 --rounds 1 --repetitions 1 --min-time 0.01 --filter 'segtape_infer|sgemm_peak|libtorch_infer')
fail() { echo "compare_smoke: $1"; echo "$out"; exit 1; }
grep -qE '^Peak sgemm \(2048 × 2048 square, 1 thread\): [0-9]*[1-9][0-9]*\.[0-9] GFLOP/s, the fastest of [1-9]' <<<"$out" ||
  fail "no measured peak"
grep -q '^| inference 1, 128 | [0-9.]* (' <<<"$out" || fail "no timed inference row"
grep -q '^| inference 1, 128 | 24.0 KiB | .* | 0 | ' <<<"$out" || fail "segtape's inference segment is not 24 KiB with 0 heap allocations per step"
# The filter reaches the memory pass: the training rows have no measurement.
grep -q '^| 1, 128 | 0.0 KiB |' <<<"$out" || fail "the memory pass ran a filtered-out benchmark"
# Two thread counts alternate within each round; segtape's round-by-round ratio table follows.
out=$("$dir/compare" --threads 1,2 --rounds 2 --repetitions 1 --min-time 0.01 --filter 'segtape_infer')
grep -q '^| B, H | 2 / 1 threads |$' <<<"$out" || fail "no thread-ratio table"
grep -qE '^\| inference 1, 128 \| [0-9]+\.[0-9]{3} \([0-9]+\.[0-9]{3}–[0-9]+\.[0-9]{3}\) \|$' <<<"$out" || fail "no round-by-round ratio for inference"
mem=$("$dir/compare_memory" --filter 'segtape_infer')
[[ "$mem" == "memory segtape_infer/1/128 24576 0 0 0" ]] || fail "compare_memory printed '$mem'"
# Bad flags are refused with the flag named.
set +e
msg=$("$dir/compare" --rounds 0 2>&1); rc=$?
set -e
[[ $rc == 2 && "$msg" == *"--rounds takes a number >= 1"* ]] || fail "--rounds 0: exit $rc, '$msg'"
echo "compare_smoke: ok"
