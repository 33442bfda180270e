#!/usr/bin/env bash
# The workload's training step (bench/loop_bench) under each OpenBLAS kernel
# set, interleaved: OpenBLAS's own choice (OPENBLAS_CORETYPE unset), then each
# forced core in turn, round after round. Prints a markdown table of µs per
# step (median, min–max over the rounds) and each core's speed-up over the
# default. Debian 12's OpenBLAS 0.3.21 does not know some newer CPUs and
# falls back to its generic SSE3 kernels (Prescott); this measures what that
# costs on the machine it runs on.
#
#   bash docs/figures/blas-cores.sh [--build DIR] [--rounds 5] [--segments 100] [--cores Haswell,SkylakeX]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build-bench rounds=5 segments=100 cores=Haswell,SkylakeX
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --segments) segments="$2"; shift 2 ;;
    --cores) cores="$2"; shift 2 ;;
    *) echo "blas-cores.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin="$build/bench/loop_bench"
[[ -x "$bin" ]] || { echo "blas-cores.sh: $bin is missing (cmake --build $build --target loop_bench)" >&2; exit 1; }
IFS=, read -r -a forced <<<"$cores"
default_core=$(env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 "$bin" --segments 1 2>&1 | sed -n 's/^Core: //p' | head -1)
sizes=("1 128" "32 128" "32 512")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for s in "${sizes[@]}"; do
    read -r B H <<<"$s"
    for core in default "${forced[@]}"; do
      if [[ $core == default ]]; then
        us=$(env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=1 "$bin" --batch "$B" --hidden "$H" --segments "$segments")
      else
        us=$(OPENBLAS_CORETYPE="$core" OPENBLAS_NUM_THREADS=1 "$bin" --batch "$B" --hidden "$H" --segments "$segments")
      fi
      echo "$B $H $core $us" >>"$out"
    done
  done
done
python3 - "$out" "$default_core" "$rounds" "$segments" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" \
  "$(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')" "$cores" <<'PY'
import statistics, sys
path, default_core, rounds, segments, cpu, model, cores = sys.argv[1:8]
rows = {}
for line in open(path):
    B, H, core, us = line.split()
    rows.setdefault((B, H), {}).setdefault(core, []).append(float(us))
names = ['default'] + cores.split(',')
print(f"`bash docs/figures/blas-cores.sh --rounds {rounds} --segments {segments}` on {cpu} (family 6 model {model}): "
      f"OpenBLAS's own choice is **{default_core}**. Training step, one thread, µs per step (median, min–max over "
      f"{rounds} interleaved rounds).\n")
print("| B, H | " + " | ".join(f"{default_core} (default)" if n == 'default' else f"OPENBLAS_CORETYPE={n}" for n in names) + " |")
print("|---|" + "---|" * len(names))
for (B, H), d in rows.items():
    base = statistics.median(d['default'])
    cells = []
    for n in names:
        v = d[n]; m = statistics.median(v)
        cells.append(f"{m:.1f} ({min(v):.1f}–{max(v):.1f})" + ("" if n == 'default' else f", {base / m:.2f}× faster"))
    print(f"| {B}, {H} | " + " | ".join(cells) + " |")
PY
