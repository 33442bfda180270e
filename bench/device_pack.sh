#!/usr/bin/env bash
# Builds here what bench/device_check.sh runs on the lent GPU machine, and
# packs it to travel there: that machine has nvcc, CMake, PyTorch (with its
# cuDNN and NCCL wheels) and the CUDA 13 runtime, but none of OpenBLAS,
# GoogleTest, CLI11, nlohmann-json or fmt, so the project cannot be
# configured there (docs/cuda.md, "bench/device_check.sh").
#
#   1. configure and build a Release CUDA build for sm_90 without -march=native
#      (that machine's CPU is another) and without LibTorch:
#      $SEGTAPE_PACK_BUILD (build-pack); cmake's own output in its pack.log
#   2. stage the programs device_check.sh runs in bin/, and in lib/ every
#      shared library they load here that is neither the C library's, the C++
#      runtime's nor CUDA's (OpenBLAS, gfortran, quadmath, fmt, protobuf):
#      the others come from that machine (device_check.sh's LD_LIBRARY_PATH);
#      a MANIFEST says what was built from which commit, sources.sha256 from
#      which files
#   3. archive them as $SEGTAPE_PACK/segtape-pack.tgz (.device-pack, ignored by
#      git), and refuse one over 56 MiB (the device tool carries 64 MiB with
#      the working tree)
#
#   bash bench/device_pack.sh
# then, with the device tool, in one call carrying .device-pack (device_check.sh
# unpacks it; $OUT takes 8 files back, so the logs come back as one archive):
#   D=/tmp/dc; SEGTAPE_DEVICE_PACK=.device-pack OUT=$D bash bench/device_check.sh; rc=$?;
#   tar czf $OUT/device-check.tgz -C $D .; cp $D/results.md $D/summary.txt $OUT/; exit $rc
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${SEGTAPE_PACK_BUILD:-$ROOT/build-pack}
PACK=${SEGTAPE_PACK:-$ROOT/.device-pack}
JOBS=${SEGTAPE_JOBS:-2}
# The programs device_check.sh runs from a pack (its `prog` names them).
PROGRAMS=(tests/cuda_test tests/cuda_nn_test tests/cuda_device_loop_test tests/gradcheck_test tests/packed_test tests/segment_test tests/memory_test
  tests/errors_test bench/cuda_bench bench/device_loop_bench agent/segtape)

mkdir -p "$BUILD"
echo "device_pack: configuring $BUILD (Release, sm_90, no -march=native, no LibTorch)"
# (no MPI: the check runs one process, and Open MPI's libraries would travel
# with libevent, hwloc and udev, built against this machine's glibc)
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSEGTAPE_NATIVE=OFF -DSEGTAPE_WITH_TORCH=OFF -DSEGTAPE_WITH_MPI=OFF \
  -DSEGTAPE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >"$BUILD/pack.log" 2>&1 ||
  { tail -n 20 "$BUILD/pack.log"; echo "device_pack: configure failed ($BUILD/pack.log)" >&2; exit 1; }
grep -q "CUDA backend on" "$BUILD/pack.log" ||
  { echo "device_pack: the build has no CUDA backend (nvcc or cuDNN 9 not found here): $BUILD/pack.log" >&2; exit 1; }
targets=()
for p in "${PROGRAMS[@]}"; do targets+=("$(basename "$p")"); done
echo "device_pack: building ${targets[*]} (-j$JOBS)"
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >>"$BUILD/pack.log" 2>&1 ||
  { grep -E "error|Error" "$BUILD/pack.log" | head -20; echo "device_pack: build failed ($BUILD/pack.log)" >&2; exit 1; }

STAGE=$BUILD/pack
rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/lib"
for p in "${PROGRAMS[@]}"; do cp "$BUILD/$p" "$STAGE/bin/"; done
# The libraries each program loads here, but for the C library's (libc, libm,
# libpthread, libdl, librt, the loader), the C++ runtime's (that machine's,
# newer, serves these programs; Debian 12's needs glibc 2.36) and CUDA's
# (found there).
cuda='^(libcuda\.so|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink|libcufft|libcurand)'
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s)'
for p in "$STAGE"/bin/*; do
  ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip || "$name" =~ $cuda ]] && continue
  cp -L "$path" "$STAGE/lib/$name"
done
{
  echo "commit $(git -C "$ROOT" rev-parse HEAD)$(git -C "$ROOT" diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(c++ --version | head -1), $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || /usr/local/cuda/bin/nvcc --version | grep -o 'release [0-9.]*')"
  grep -E "^CMAKE_BUILD_TYPE|^SEGTAPE_NATIVE|^CMAKE_CUDA_ARCHITECTURES|^SEGTAPE_WITH" "$BUILD/CMakeCache.txt"
  grep -E "CUDA backend on|NCCL" "$BUILD/pack.log" | head -3
  echo "CUDA libraries the programs load from that machine:"
  for p in "$STAGE"/bin/*; do ldd "$p" | awk '{ print $1 }'; done | sort -u | grep -E "$cuda" | sed 's/^/  /'
} >"$STAGE/MANIFEST"
# The sources the programs were built from: device_check.sh refuses a pack
# that another tree's sources built (a stale pack tests old code).
(cd "$ROOT" && git ls-files -- engine nn agent tests bench cmake CMakeLists.txt | grep -vE '\.(md|sh|py)$' |
  xargs sha256sum) >"$STAGE/sources.sha256"
# One gzip archive (OpenBLAS alone is 35 MiB unpacked): tar and gzip are on every machine.
rm -rf "$PACK"
mkdir -p "$PACK"
tar czf "$PACK/segtape-pack.tgz" -C "$STAGE" .
cp "$STAGE/MANIFEST" "$PACK/"
bytes=$(du -sb "$PACK" | cut -f1)
echo "device_pack: $PACK/segtape-pack.tgz: $(ls "$STAGE/bin" | wc -l) programs, $(ls "$STAGE/lib" | wc -l) libraries ($(ls "$STAGE/lib" | tr '\n' ' ')), $((bytes / 1048576)) MiB"
if ((bytes > 56 * 1048576)); then
  echo "device_pack: the pack is over 56 MiB: the device tool carries 64 MiB together with the working tree" >&2
  exit 1
fi
