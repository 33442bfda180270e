#!/usr/bin/env bash
# Rebuilds the segtape program and regenerates every figure and number of
# docs/retention.md (the retention lab at its default sizes):
#   docs/figures/retention.svg   memory vs step for every case, segtape and LibTorch panels
#   docs/figures/retention.json  per case and engine: growth per step, peak, time, budget step, errors
#   docs/figures/retention.csv   every measurement (engine, case, step, bytes)
#   docs/figures/retention.txt   the terminal table and the explainer's report of every pitfall
#   docs/figures/tape.dot        the tape of pitfall 1 after 3 steps, parameters named
#   docs/figures/tape-tbptt.dot  tbptt's second segment: h arrives as the carried state (highlighted)
#                                (tape.svg and tape-tbptt.svg too when Graphviz is installed)
# LibTorch's panel is drawn when libtorch-dev is installed (else one panel, with a note saying why).
# Usage: bash docs/figures/regenerate.sh [extra `segtape retention` arguments]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/setup.sh"
cmake -S "$SEGTAPE_ROOT" -B "$SEGTAPE_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$SEGTAPE_BUILD" -j "$SEGTAPE_JOBS" --target segtape
cd "$SEGTAPE_ROOT"
figures=docs/figures
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# One BLAS thread: the lab's matrices are small, and timings stay comparable.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
"$SEGTAPE_BUILD/agent/segtape" retention --out "$out" --explain --dot "$figures/tape.dot" "$@" | tee "$figures/retention.txt"
cp "$out/retention.svg" "$out/retention.json" "$out/retention.csv" "$figures/"
if command -v dot >/dev/null; then
  for g in tape tape-tbptt; do dot -Tsvg "$figures/$g.dot" -o "$figures/$g.svg"; done
else
  echo "(Graphviz not installed: $figures/tape.dot and tape-tbptt.dot not rendered; apt-get install graphviz)"
fi
echo "regenerated: $(cd "$figures" && ls retention.* tape*)"
