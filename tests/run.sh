#!/usr/bin/env bash
# Builds segtape and runs every test (ctest). Installs missing Debian packages
# when run as root. Usage: bash tests/run.sh [extra ctest arguments, e.g. -L memory]
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
segtape_install_debs "${SEGTAPE_DEBS_BUILD[@]}" "${SEGTAPE_DEBS_TEST[@]}"
segtape_install_pytest_deps
segtape_configure_build
cd "$SEGTAPE_BUILD"
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ctest --output-on-failure -j "$SEGTAPE_JOBS" "$@"
