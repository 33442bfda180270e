# Sourced by the figure scripts that time bench programs in a build-ba
# directory (before-after.sh, threads.sh, inference-floor.sh): a Release
# build with -march=native (SEGTAPE_NATIVE's default), no CUDA, no LibTorch,
# no tests, configured once per source tree.
#   build_ba SOURCE_DIR TARGET...   builds TARGETs in SOURCE_DIR/build-ba
build_ba() {
  local dir="$1"
  shift
  local flags=(-DCMAKE_BUILD_TYPE=Release -DSEGTAPE_WITH_CUDA=OFF -DSEGTAPE_WITH_TORCH=OFF -DSEGTAPE_BUILD_TESTS=OFF)
  [[ -f "$dir/build-ba/CMakeCache.txt" ]] || cmake -S "$dir" -B "$dir/build-ba" "${flags[@]}" >/dev/null
  cmake --build "$dir/build-ba" -j2 --target "$@" >/dev/null
}
