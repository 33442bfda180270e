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

# The one option of threads.sh and inference-floor.sh:
#   parse_rounds NAME DEFAULT "$@"   sets rounds from --rounds N (DEFAULT
#   without it); any other argument ends the script with an error naming NAME
parse_rounds() {
  local name="$1"
  rounds="$2"
  shift 2
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --rounds) rounds="$2"; shift 2 ;;
      *) echo "$name: unknown argument $1" >&2; exit 2 ;;
    esac
  done
}
