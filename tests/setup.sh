# Sourced by tests/run.sh and agent/run.sh: installs what is missing (as root)
# and configures + builds segtape in ./build. Not meant to be run on its own.
set -euo pipefail

SEGTAPE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SEGTAPE_BUILD=${SEGTAPE_BUILD:-$SEGTAPE_ROOT/build}
SEGTAPE_JOBS=${SEGTAPE_JOBS:-$(nproc 2>/dev/null || echo 2)}

# Debian packages segtape builds against (docs/design.md says why each is there).
SEGTAPE_DEBS_BUILD=(build-essential cmake libopenblas-dev nlohmann-json3-dev libcli11-dev libfmt-dev)
SEGTAPE_DEBS_TEST=(libgtest-dev libbenchmark-dev libtorch-dev python3 python3-pip clang libclang-rt-14-dev)

segtape_missing_debs() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

segtape_install_debs() {
  local missing
  missing=$(segtape_missing_debs "$@" | tr '\n' ' ')
  [[ -z "${missing// /}" ]] && return 0
  if [[ $(id -u) -eq 0 ]]; then
    echo "segtape: installing Debian packages: $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "segtape: missing Debian packages: $missing" >&2
    echo "segtape: install them with: sudo apt-get install $missing (or run this script as root)" >&2
    exit 1
  fi
}

# Python packages are used only by interoperability tests (safetensors files
# written and read by Hugging Face's own library), never by the product.
segtape_install_pytest_deps() {
  python3 -c "import safetensors, numpy" 2>/dev/null && return 0
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip install -q safetensors numpy 2>/dev/null ||
      python3 -m pip install -q --break-system-packages safetensors numpy 2>/dev/null ||
      echo "segtape: could not pip-install safetensors/numpy: the interop tests will skip" >&2
  fi
}

segtape_configure_build() {
  cmake -S "$SEGTAPE_ROOT" -B "$SEGTAPE_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$SEGTAPE_BUILD" -j "$SEGTAPE_JOBS"
}
