#!/usr/bin/env bash
# Installs segtape from a build directory into a temporary prefix, builds the
# consumer project next to this script against it with find_package(segtape),
# and runs it. Usage: tests/package/test.sh BUILD_DIR   (ctest label `package`)
set -euo pipefail
build=$(cd "${1:?usage: test.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/segtape-package.XXXXXX")
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
for f in include/segtape/ops.h include/segtape/nn/layers.h include/segtape/agent/trainer.h \
         lib/cmake/segtape/segtapeConfig.cmake lib/cmake/segtape/segtapeConfigVersion.cmake \
         lib/libsegtape_engine.a lib/libsegtape_nn.a lib/libsegtape_dist.a lib/libsegtape_agent.a bin/segtape; do
  [[ -e "$work/prefix/$f" ]] || { echo "package: $f was not installed" >&2; exit 1; }
done
"$work/prefix/bin/segtape" --version

cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" >/dev/null
out=$("$work/build/consumer")
echo "$out"
[[ "$out" == "segtape $("$work/prefix/bin/segtape" --version | cut -d' ' -f2): loss "* ]] ||
  { echo "package: unexpected consumer output" >&2; exit 1; }

# The version file: another major version is refused.
if cmake -S "$here" -B "$work/build-v9" -DCMAKE_PREFIX_PATH="$work/prefix" -DSEGTAPE_WANT_VERSION=9.0 >/dev/null 2>&1; then
  echo "package: find_package(segtape 9.0) should have failed" >&2
  exit 1
fi
echo "package: ok"
