# Sourced by tests/run.sh and agent/run.sh: installs what is missing (as root)
# and configures + builds segtape in ./build. Not meant to be run on its own.
set -euo pipefail

SEGTAPE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SEGTAPE_BUILD=${SEGTAPE_BUILD:-$SEGTAPE_ROOT/build}
SEGTAPE_JOBS=${SEGTAPE_JOBS:-$(nproc 2>/dev/null || echo 2)}

# Debian packages segtape builds against (docs/design.md says why each is there).
SEGTAPE_DEBS_BUILD=(build-essential cmake libopenblas-dev nlohmann-json3-dev libcli11-dev libfmt-dev libprotobuf-dev protobuf-compiler
                    libopenmpi-dev openmpi-bin)
SEGTAPE_DEBS_TEST=(libgtest-dev libbenchmark-dev libtorch-dev python3 python3-pip clang libclang-rt-14-dev clang-tidy iproute2)
# The Python package's build and tests (docs/python.md says why each is there):
# Debian's Python, its headers and venv; PyTorch 1.13 (python3-torch: the same
# LibTorch as libtorch-dev, CPU-only) for the parity tests and the notebook;
# pytest, and nbclient + ipykernel to execute the notebook; matplotlib for its figures.
SEGTAPE_DEBS_PYTHON=(python3-dev python3-venv python3-numpy python3-torch python3-pytest python3-nbclient
                     python3-nbformat python3-ipykernel python3-matplotlib)

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

# The Python package (python/): a virtual environment over Debian's Python
# ($SEGTAPE_PYTHON_EXE, by default /usr/bin/python3, whose site packages hold python3-torch) in
# $SEGTAPE_BUILD/python, nanobind, scikit-build-core, safetensors, tensorboard
# (its event-file reader checks `segtape train --log-dir`), gymnasium
# (segtape.gym's tests) and popgym 1.0.7 (POPGym's memory tasks through
# segtape.gym; it needs only numpy and gymnasium) from PyPI,
# then `pip install ./python` with its CMake build kept in
# $SEGTAPE_BUILD/python-pkg (so a rerun rebuilds only what changed), then pytest
# over python/tests (the notebook included). segtape_python_tests builds the
# extension alone, against the test build's own libraries (cmake --install
# into $SEGTAPE_BUILD/python-prefix, SEGTAPE_PYTHON_PREBUILT): a user's
# `pip install ./python` compiles the same sources in its own CMake build, as
# the sanitizer build compiles them with SEGTAPE_PYTHON. Extra arguments of
# segtape_python_install go to pip's --config-settings.
SEGTAPE_PYTHON_EXE=${SEGTAPE_PYTHON_EXE:-/usr/bin/python3}
segtape_python_venv() {  # VENV: the virtual environment and the packages above, where missing
  local venv=$1
  if [[ ! -x "$venv/bin/python" ]]; then
    "$SEGTAPE_PYTHON_EXE" -m venv --system-site-packages "$venv" || return 1
  fi
  "$venv/bin/python" -c "import nanobind, scikit_build_core, safetensors, tensorboard, gymnasium, popgym" 2>/dev/null ||
    "$venv/bin/python" -m pip install -q nanobind scikit-build-core safetensors tensorboard gymnasium popgym==1.0.7 || return 1
}
segtape_python_install() {  # VENV PKG_BUILD_DIR [config settings...]
  local venv=$1 pkg=$2
  shift 2
  segtape_python_venv "$venv" || return 1
  local settings=(--config-settings=build-dir="$pkg") s
  for s in "$@"; do settings+=(--config-settings="$s"); done
  CMAKE_BUILD_PARALLEL_LEVEL=$SEGTAPE_JOBS "$venv/bin/python" -m pip install -q --no-build-isolation --force-reinstall \
    --no-deps "${settings[@]}" "$SEGTAPE_ROOT/python" || return 1
}
segtape_python_tests() {
  local venv=$SEGTAPE_BUILD/python
  # Without the CUDA backend: the main build compiles and tests it (emulated
  # where there is no GPU), and a third compilation of its kernels by nvcc
  # here would test nothing more on a machine without a GPU; CI's 30 minutes
  # are tight (docs/hardening.md, "Time in CI"). A user's `pip install
  # ./python` still builds it where nvcc is found.
  local prefix=$SEGTAPE_BUILD/python-prefix
  cmake --install "$SEGTAPE_BUILD" --prefix "$prefix" >/dev/null || return 1
  segtape_python_install "$venv" "$SEGTAPE_BUILD/python-pkg" cmake.define.SEGTAPE_PYTHON_PREBUILT="$prefix" || return 1
  # Run from the tests folder, so that `import segtape` is the installed package, not python/segtape.
  (cd "$SEGTAPE_ROOT/python/tests" &&
    SEGTAPE_README_CURVE=$SEGTAPE_BUILD/tests/readme_curve SEGTAPE_CLI=$SEGTAPE_BUILD/agent/segtape \
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider -p no:hypothesispytest "$@" .)
}
# The same tests that load no LibTorch, with the extension and the C++ library
# built with ASan + UBSan (Python itself is not instrumented: libasan is
# preloaded; leak checking is off, since CPython keeps memory until exit).
# The extension is the sanitizer build's own target (_segtape, SEGTAPE_PYTHON=ON
# there), linked to the library that segtape_sanitize compiled and tested, not
# a second compilation of it by pip; it runs from a copy of python/segtape in
# $SEGTAPE_SANITIZE_BUILD/python-stage, put first on PYTHONPATH.
segtape_python_sanitize() {
  local venv=$SEGTAPE_BUILD/python stage=$SEGTAPE_SANITIZE_BUILD/python-stage preload so
  segtape_python_venv "$venv" || return 1
  segtape_sanitize_configure || return 1
  cmake --build "$SEGTAPE_SANITIZE_BUILD" -j "$SEGTAPE_JOBS" --target _segtape || return 1
  so=$(find "$SEGTAPE_SANITIZE_BUILD/python" -maxdepth 1 -name '_segtape*.so' | head -1)
  [[ -n "$so" ]] || { echo "segtape: no _segtape module in $SEGTAPE_SANITIZE_BUILD/python" >&2; return 1; }
  rm -rf "$stage" && mkdir -p "$stage" && cp -r "$SEGTAPE_ROOT/python/segtape" "$stage/segtape" &&
    cp "$so" "$stage/segtape/" && mkdir -p "$stage/segtape/include" &&
    cp "$SEGTAPE_ROOT/agent/torch_memory.h" "$stage/segtape/include/" || return 1
  # libstdc++ preloaded too: ASan's __cxa_throw interceptor needs it loaded
  # first, and python3 itself does not link it.
  preload="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)"
  (cd "$SEGTAPE_ROOT/python/tests" &&
    export PYTHONPATH=$stage${PYTHONPATH:+:$PYTHONPATH} LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0 &&
    # (the staged package, or this stage would test the Release one again)
    { [[ "$("$venv/bin/python" -c 'import segtape; print(segtape._C.__file__)')" == "$stage"/* ]] ||
      { echo "segtape: import segtape did not load $stage" >&2; false; }; } &&
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    SEGTAPE_README_CURVE=$SEGTAPE_SANITIZE_BUILD/tests/readme_curve OPENBLAS_NUM_THREADS=1 \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -p no:hypothesispytest test_api.py test_errors.py test_readme_loop.py)
}

# The test build: RelWithDebInfo with line tables only (-g1, in place of -g):
# file:line in gdb's and perf's stacks, at three quarters of the compile time
# (tests/agent_test.cpp: 35 s of CPU at -g, 28 s at -g1); LibTorch's files at
# -g0 (CMakeLists.txt, segtape_torch).
segtape_configure_build() {
  cmake -S "$SEGTAPE_ROOT" -B "$SEGTAPE_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" "$@" >/dev/null
  cmake --build "$SEGTAPE_BUILD" -j "$SEGTAPE_JOBS"
}

# The code's size (docs/design.md, "Size"): no function of engine/, nn/ or
# agent/ longer than 150 lines of code (lizard's NLOC; lizard from PyPI, in
# the Python package's virtual environment), no file of agent/ longer than
# 700 lines.
SEGTAPE_MAX_FUNCTION_NLOC=${SEGTAPE_MAX_FUNCTION_NLOC:-150} SEGTAPE_MAX_AGENT_FILE_LINES=${SEGTAPE_MAX_AGENT_FILE_LINES:-700}
segtape_size() {
  local venv=$SEGTAPE_BUILD/python
  if [[ ! -x "$venv/bin/python" ]]; then "$SEGTAPE_PYTHON_EXE" -m venv --system-site-packages "$venv" || return 1; fi
  "$venv/bin/python" -c "import lizard" 2>/dev/null || "$venv/bin/python" -m pip install -q lizard || return 1
  local long rc=0
  # (-C: no complexity limit here, only the length; -w prints one line per function over it)
  long=$(cd "$SEGTAPE_ROOT" && "$venv/bin/python" -m lizard -l cpp -C 1000000 -Tnloc=$SEGTAPE_MAX_FUNCTION_NLOC -w engine nn agent) || true
  if [[ -n "$long" ]]; then
    echo "segtape: size: functions over $SEGTAPE_MAX_FUNCTION_NLOC lines of code:" >&2
    echo "$long" >&2
    rc=1
  fi
  local f n
  while IFS= read -r f; do
    n=$(wc -l <"$SEGTAPE_ROOT/$f")
    if ((n > SEGTAPE_MAX_AGENT_FILE_LINES)); then
      echo "segtape: size: $f has $n lines (at most $SEGTAPE_MAX_AGENT_FILE_LINES in agent/)" >&2
      rc=1
    fi
  done < <(cd "$SEGTAPE_ROOT" && find agent -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) | sort)
  local longest
  longest=$(cd "$SEGTAPE_ROOT" && "$venv/bin/python" -m lizard -l cpp engine nn agent 2>/dev/null |
            awk '$1 ~ /^[0-9]+$/ && NF >= 6 && $NF ~ /@/ {print $1, $NF}' | sort -n -r | head -1) || true
  echo "segtape: size: longest function ${longest:-?} (NLOC, location)"
  return $rc
}

# ---- Hardening stages (docs/hardening.md), run by tests/run.sh --sanitize /
# --fuzz / --tidy and all three in CI. Each returns non-zero on a finding.

SEGTAPE_SANITIZE_BUILD=${SEGTAPE_SANITIZE_BUILD:-$SEGTAPE_ROOT/build-asan}
SEGTAPE_FUZZ_BUILD=${SEGTAPE_FUZZ_BUILD:-$SEGTAPE_ROOT/build-fuzz}

# The sanitizer build: engine, nn, agent, the tests and the Python extension
# with AddressSanitizer (leaks included) and UndefinedBehaviorSanitizer; no
# LibTorch (it is not built with ASan), no CUDA, no benchmarks. The extension
# needs nanobind: the Python package's virtual environment provides it.
segtape_sanitize_configure() {
  segtape_python_venv "$SEGTAPE_BUILD/python" || return 1
  cmake -S "$SEGTAPE_ROOT" -B "$SEGTAPE_SANITIZE_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSEGTAPE_SANITIZE=address,undefined -DSEGTAPE_WITH_TORCH=OFF -DSEGTAPE_WITH_CUDA=OFF \
    -DSEGTAPE_BUILD_BENCH=OFF -DSEGTAPE_NATIVE=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
    -DSEGTAPE_PYTHON=ON -DPython_EXECUTABLE="$SEGTAPE_BUILD/python/bin/python" >/dev/null || return 1
}

# Every CPU test (not `parity`: LibTorch; not GPU tests) under the sanitizers,
# but for three long learning runs (Learning.ExactLearns*, the two-layer LSTM's
# Lm.LstmStacks...: 60-80 s of CI's time there) whose code paths shorter tests
# run under ASan too (the exact histories' replay, LSTM stacks, dropout, resume);
# they run in the main build.
SEGTAPE_SANITIZE_SKIP=${SEGTAPE_SANITIZE_SKIP-'^(Learning\.ExactLearns.*|Lm\.LstmStacksWithDropoutAndTiedWeightsLearnAndResume)$'}
SEGTAPE_SANITIZE_BUILT=0
SEGTAPE_SANITIZE_SELECT=(-LE 'parity|cuda|gpu' ${SEGTAPE_SANITIZE_SKIP:+-E "$SEGTAPE_SANITIZE_SKIP"})
segtape_sanitize() {  # sets SEGTAPE_SANITIZE_BUILT=1 once the build is made
  # (|| return: errexit is off inside a function called from `f || ...`)
  segtape_sanitize_configure || return 1
  cmake --build "$SEGTAPE_SANITIZE_BUILD" -j "$SEGTAPE_JOBS" || return 1
  SEGTAPE_SANITIZE_BUILT=1
  (cd "$SEGTAPE_SANITIZE_BUILD" &&
    ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 LSAN_OPTIONS=report_objects=1 \
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
    ctest --output-on-failure -j "$SEGTAPE_JOBS" "${SEGTAPE_SANITIZE_SELECT[@]}" "$@")
}
# segtape_unsanitized_tests [ctest arguments]: writes, for the main build's
# `ctest -I FILE`, the numbers of its tests that segtape_sanitize's selection
# does not name, and prints FILE. (ctest -E cannot take hundreds of names.)
segtape_unsanitized_tests() {
  local file=$SEGTAPE_BUILD/unsanitized-tests.txt
  local listed='s/^ *Test *#\([0-9]*\): \([^ ]*\).*$/\1 \2/p'
  (cd "$SEGTAPE_SANITIZE_BUILD" && ctest -N "${SEGTAPE_SANITIZE_SELECT[@]}" "$@") | sed -n "$listed" | cut -d' ' -f2 \
    >"$file.sanitized" || return 1
  [[ -s "$file.sanitized" ]] || return 1
  (cd "$SEGTAPE_BUILD" && ctest -N) | sed -n "$listed" |
    awk 'NR == FNR { ran[$1] = 1; next } !($2 in ran) { printf ",%s", $1 }' "$file.sanitized" - |
    sed 's/^/0,0,1/' >"$file" || return 1
  echo "$file"
}

# The safetensors parser's libFuzzer target, built with clang (ASan + UBSan),
# run for SECONDS on a copy of tests/fuzz/corpus (the committed corpus is
# never written). A crash leaves its input in build-fuzz/artifacts/: add it to
# tests/fuzz/corpus as a regression seed and fix the parser.
segtape_fuzz() {
  local seconds=${1:-60} cxx
  cxx=$(command -v clang++-14 || command -v clang++ || true)
  if [[ -z "$cxx" ]]; then
    echo "segtape: fuzz: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2
    return 1
  fi
  local dir=$SEGTAPE_FUZZ_BUILD bin=$SEGTAPE_FUZZ_BUILD/safetensors_fuzz
  mkdir -p "$dir"
  local src
  for src in tests/fuzz/safetensors_fuzz.cpp nn/safetensors.cpp nn/include/segtape/nn/safetensors.h engine/include/segtape/error.h; do
    [[ "$SEGTAPE_ROOT/$src" -nt "$bin" ]] && rm -f "$bin"
  done
  if [[ ! -x "$bin" ]]; then
    local flags=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
                 -I"$SEGTAPE_ROOT/engine/include" -I"$SEGTAPE_ROOT/nn/include")
    "$cxx" "${flags[@]}" -c "$SEGTAPE_ROOT/tests/fuzz/safetensors_fuzz.cpp" -o "$dir/fuzz.o" &
    local pid=$!
    "$cxx" "${flags[@]}" -c "$SEGTAPE_ROOT/nn/safetensors.cpp" -o "$dir/safetensors.o" || { wait $pid; return 1; }
    wait $pid || return 1
    "$cxx" "${flags[@]}" "$dir/fuzz.o" "$dir/safetensors.o" -o "$bin" || return 1
  fi
  rm -rf "$dir/corpus" "$dir/artifacts"
  cp -r "$SEGTAPE_ROOT/tests/fuzz/corpus" "$dir/corpus" || return 1
  mkdir -p "$dir/artifacts"
  if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/fuzz.log" 2>&1; then
    tail -n 60 "$dir/fuzz.log" >&2
    echo "segtape: fuzz: the safetensors parser failed; the input is in $dir/artifacts/" >&2
    return 1
  fi
  echo "segtape: fuzz: $(grep -o 'number_of_executed_units: *[0-9]*' "$dir/fuzz.log" | grep -o '[0-9]*$') executions in ${seconds} s, no crash (log: $dir/fuzz.log)"
}

# clang-tidy (.clang-tidy) over engine/, nn/ and agent/ sources, with the
# main build's compilation database (every source it compiles, CUDA host code
# included; .cu files are nvcc's). Findings are compared with
# cmake/clang-tidy-baseline.txt (known findings in code awaiting its owner's
# fix, "path: check" per finding): a finding not in it fails.
# agent/retention_torch.cpp is left out: it is LibTorch glue, and parsing
# LibTorch's headers takes clang-tidy ~100 s of a 2-core CI run
# (SEGTAPE_TIDY_SKIP='' puts it back).
SEGTAPE_TIDY_SKIP=${SEGTAPE_TIDY_SKIP-'agent/retention_torch\.cpp'}
segtape_tidy() {
  local runner
  runner=$(command -v run-clang-tidy-14 || command -v run-clang-tidy || true)
  if [[ -z "$runner" ]]; then
    echo "segtape: tidy: run-clang-tidy not found (apt-get install clang-tidy)" >&2
    return 1
  fi
  if [[ ! -f "$SEGTAPE_BUILD/compile_commands.json" ]]; then
    cmake -S "$SEGTAPE_ROOT" -B "$SEGTAPE_BUILD" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null || return 1
  fi
  local log=$SEGTAPE_BUILD/clang-tidy.log found=$SEGTAPE_BUILD/clang-tidy-findings.txt files
  files=$(grep -cE "\"file\": \"$SEGTAPE_ROOT/(engine|nn|agent)/.*\.cpp\"" "$SEGTAPE_BUILD/compile_commands.json" || true)
  if [[ "${files:-0}" -eq 0 ]]; then
    echo "segtape: tidy: no engine/nn/agent sources in $SEGTAPE_BUILD/compile_commands.json" >&2
    return 1
  fi
  # (GCC compiles segtape: its -W options and #pragma GCC are unknown to clang, not findings.)
  "$runner" -p "$SEGTAPE_BUILD" -j "$SEGTAPE_JOBS" -quiet \
    -extra-arg=-Wno-unknown-warning-option -extra-arg=-Wno-unknown-pragmas \
    "^$SEGTAPE_ROOT/${SEGTAPE_TIDY_SKIP:+(?!($SEGTAPE_TIDY_SKIP)\$)}(engine|nn|agent)/.*\.cpp\$" >"$log" 2>&1 || true
  sed 's/\x1b\[[0-9;]*m//g' "$log" |
    grep -E "^$SEGTAPE_ROOT/.*:[0-9]+:[0-9]+: (warning|error): .*\[[^]]+\]$" |
    sed -E 's/,-warnings-as-errors\]$/]/' | sort -u |
    sed -E "s#^$SEGTAPE_ROOT/##; s#^([^:]+):[0-9]+:[0-9]+: .*\[([^],]+)[^]]*\]\$#\1: \2#" | sort >"$found"
  local baseline=$SEGTAPE_ROOT/cmake/clang-tidy-baseline.txt new gone
  new=$(comm -23 "$found" <(grep -v '^#' "$baseline" 2>/dev/null | sed '/^$/d' | sort) || true)
  gone=$(comm -13 "$found" <(grep -v '^#' "$baseline" 2>/dev/null | sed '/^$/d' | sort) || true)
  echo "segtape: tidy: $files sources in the build (SEGTAPE_TIDY_SKIP aside), $(wc -l <"$found") findings, $(grep -v '^#' "$baseline" 2>/dev/null | sed '/^$/d' | wc -l) known (cmake/clang-tidy-baseline.txt); log: $log"
  [[ -z "$gone" ]] || printf 'segtape: tidy: fixed, remove from the baseline:\n%s\n' "$gone"
  if [[ -n "$new" ]]; then
    printf 'segtape: tidy: new findings (fix them, or NOLINT(check) a false positive with a reason):\n%s\n' "$new" >&2
    grep -F -f <(echo "$new" | cut -d: -f1 | sort -u) <(sed 's/\x1b\[[0-9;]*m//g' "$log") | grep -E "(warning|error):" >&2 || true
    return 1
  fi
}
