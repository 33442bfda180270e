#!/usr/bin/env bash
# Where a training segment's GPU time goes: Nsight Compute (ncu) times every
# kernel of cuda_bench's eager sequence mode (one gru_sequence per segment:
# the fused kernels or cuDNN's GRU, the head, the loss, backward, SGD) at
# the given sizes, and this sums them by kernel name, per segment. Run
# after bench/device_check.sh on the GPU machine (it unpacks the programs):
#
#   OUT=/tmp/out bash bench/device_profile.sh [PROGRAM] [SIZES]
#     PROGRAM  cuda_bench (default: the device check's unpacked pack's wrapper)
#     SIZES    1x128,32x128,32x512 by default
#
# Writes $OUT/profile-BxH.csv (ncu's raw rows) and $OUT/profile.md (per
# size: each kernel's launches and microseconds per segment, largest
# first, and their sum; bench/ncu_summary.py, which also runs on the CSVs
# where they were fetched to). ncu serializes the kernels and takes the clocks as
# they are (--clock-control none): the sum is the kernels' own time, without
# the gaps between them that a graph replay shortens; the 4 warm-up
# segments are counted with the timed ones (6 segments in all).
set -uo pipefail
OUT=${OUT:-./device-profile-out}
mkdir -p "$OUT"
PROG=${1:-${TMPDIR:-/tmp}/segtape-pack/run/cuda_bench}
SIZES=${2:-1x128,32x128,32x512}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
PY=python3
for p in python3 /opt/torch/.venv/bin/python3; do "$p" -c 'import csv' 2>/dev/null && PY=$p && break; done
if [[ -z "$NCU" ]]; then
  echo "ncu not found: no profile" | tee "$OUT/profile.md"
  exit 1
fi
segments=2
: >"$OUT/profile.md"
status=0
for size in ${SIZES//,/ }; do
  csv=$OUT/profile-$size.csv
  if ! timeout --kill-after=5 120 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
    "$PROG" --segments "$segments" --sizes "$size" --modes sequence >"$csv" 2>"$OUT/profile-$size.err"; then
    echo "ncu over $size failed: $(tail -n 3 "$OUT/profile-$size.err" | tr '\n' ' ')" | tee -a "$OUT/profile.md"
    status=1
    continue
  fi
  "$PY" "$(dirname "${BASH_SOURCE[0]}")/ncu_summary.py" "$csv" "$size" $((segments + 4)) >>"$OUT/profile.md" || status=1
done
cat "$OUT/profile.md"
exit $status
