#!/usr/bin/env bash
# Builds segtape and runs every test (ctest). Installs missing Debian packages
# when run as root.
#
# Usage: bash tests/run.sh [--sanitize] [--fuzz[=SECONDS]] [--tidy] [--full] [extra ctest arguments, e.g. -L memory]
#   (no option)  build in ./build and run ctest: every suite, the bad-input
#                catalog, the soak and kill tests, the package test; then
#                pip install ./python into build/python (a venv) and pytest;
#                the docs site (docs/build.sh, into build/site); the code's size
#                (lizard: functions, agent/ files)
#   --sanitize   also build in ./build-asan with ASan + UBSan and run every CPU test there
#   --fuzz       also run the safetensors parser's libFuzzer target (clang) for 60 s
#   --tidy       also run clang-tidy over engine/, nn/, agent/
#   --full       all of the above: what CI runs (CI=true or SEGTAPE_CI_FULL=1 imply it)
# docs/hardening.md describes the checks.
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

do_sanitize=0 do_fuzz=0 do_tidy=0 fuzz_seconds=${SEGTAPE_FUZZ_SECONDS:-60}
if [[ "${CI:-}" == "true" || "${SEGTAPE_CI_FULL:-0}" == "1" ]]; then do_sanitize=1 do_fuzz=1 do_tidy=1; fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sanitize) do_sanitize=1 ;;
    --fuzz) do_fuzz=1 ;;
    --fuzz=*) do_fuzz=1 fuzz_seconds=${1#--fuzz=} ;;
    --tidy) do_tidy=1 ;;
    --full) do_sanitize=1 do_fuzz=1 do_tidy=1 ;;
    *) break ;;
  esac
  shift
done

segtape_install_debs "${SEGTAPE_DEBS_BUILD[@]}" "${SEGTAPE_DEBS_TEST[@]}" "${SEGTAPE_DEBS_PYTHON[@]}"
segtape_install_pytest_deps

failed=()
stage_start=$SECONDS
stage() {  # stage NAME RC: records and reports a finished stage
  echo "segtape: == $1: $([[ $2 -eq 0 ]] && echo passed || echo FAILED) in $((SECONDS - stage_start)) s"
  [[ $2 -eq 0 ]] || failed+=("$1")
  stage_start=$SECONDS
}

rc=0
segtape_configure_build || rc=$?
stage "build ($SEGTAPE_BUILD)" $rc
skip_sanitized=()
if ((do_sanitize)); then
  rc=0
  segtape_sanitize "$@" || rc=$?
  stage "ASan + UBSan build and ctest ($SEGTAPE_SANITIZE_BUILD)" $rc
  # The tests the sanitizer build ran are not run a second time here
  # (docs/hardening.md, "Time in CI"); where it did not build, all are.
  if ((SEGTAPE_SANITIZE_BUILT)); then
    list=$(segtape_unsanitized_tests "$@") && skip_sanitized=(-I "$list")
  fi
fi
rc=0
(cd "$SEGTAPE_BUILD" && OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ctest --output-on-failure -j "$SEGTAPE_JOBS" "${skip_sanitized[@]}" "$@") || rc=$?
stage "ctest ($SEGTAPE_BUILD${skip_sanitized:+: the tests the sanitizer build did not run})" $rc
rc=0
segtape_python_tests || rc=$?
stage "Python package: pip install ./python and pytest (python/tests, the notebook)" $rc
rc=0
bash "$SEGTAPE_ROOT/docs/build.sh" "$SEGTAPE_BUILD/agent/segtape" || rc=$?
stage "docs: the site, strict (docs/build.sh: the command-line reference from --help, docs/tests, mkdocs build --strict)" $rc
rc=0
segtape_size || rc=$?
stage "code size: functions <= $SEGTAPE_MAX_FUNCTION_NLOC lines of code, agent/ files <= $SEGTAPE_MAX_AGENT_FILE_LINES lines (lizard)" $rc

if ((do_sanitize)); then
  rc=0
  segtape_python_sanitize || rc=$?
  stage "Python package under ASan + UBSan" $rc
fi
if ((do_tidy)); then
  rc=0
  segtape_tidy || rc=$?
  stage "clang-tidy" $rc
fi
if ((do_fuzz)); then
  rc=0
  segtape_fuzz "$fuzz_seconds" || rc=$?
  stage "safetensors fuzzing (${fuzz_seconds} s)" $rc
fi

if ((${#failed[@]})); then
  printf 'segtape: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "segtape: all passed in ${SECONDS} s"
