#!/usr/bin/env bash
# The main job: builds segtape and trains the default agent on CPU (delayed
# recall, lag 8, truncated BPTT with K = 32), with a progress bar, a summary
# and a plot. Installs missing Debian packages when run as root.
# Usage: bash agent/run.sh [extra `segtape train` arguments, e.g. --env tmaze]
source "$(dirname "${BASH_SOURCE[0]}")/../tests/setup.sh"
segtape_install_debs "${SEGTAPE_DEBS_BUILD[@]}"
# Only the program is needed here: no tests, no benchmarks, no LibTorch.
SEGTAPE_BUILD=${SEGTAPE_BUILD_MAIN:-$SEGTAPE_ROOT/build-main}
cmake -S "$SEGTAPE_ROOT" -B "$SEGTAPE_BUILD" -DCMAKE_BUILD_TYPE=Release -DSEGTAPE_BUILD_TESTS=OFF \
  -DSEGTAPE_BUILD_BENCH=OFF -DSEGTAPE_WITH_TORCH=OFF -DSEGTAPE_WITH_CUDA=OFF >/dev/null
cmake --build "$SEGTAPE_BUILD" -j "$SEGTAPE_JOBS" --target segtape
cd "$SEGTAPE_ROOT"
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} "$SEGTAPE_BUILD/agent/segtape" train "$@"
