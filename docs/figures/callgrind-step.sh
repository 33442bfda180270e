#!/usr/bin/env bash
# Instructions per step of the benchmark workload (bench/workload.h) at
# B = 1, H = 128, counted by callgrind: training step (forward + backward +
# Adam, K = 32 steps per segment) and inference step. Instruction counts do not
# depend on the machine's load, unlike times on a shared VM.
#
#   bash docs/figures/callgrind-step.sh [--section NAME] [--build DIR]
#
# Builds bench/loop_bench in DIR (default build-cg: Release, -march=x86-64-v3,
# since valgrind 3.19 runs no AVX-512; OpenBLAS picks its kernel from the CPUID
# valgrind reports, AVX2 here, and segtape's packed kernel its AVX2 form), runs it under callgrind with 10 and 30 timed
# segments (each after the same 10 warm-up segments) and divides the
# difference by the 20 x 32 extra steps, so start-up and warm-up cancel.
# Prints a markdown section: per-step instructions and the functions with the
# most (self cost). With --section NAME it also replaces the text between
# <!-- callgrind-NAME:begin --> and <!-- callgrind-NAME:end --> in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
section="" build=build-cg
while [[ $# -gt 0 ]]; do
  case "$1" in
    --section) section="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    *) echo "usage: callgrind-step.sh [--section NAME] [--build DIR]" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || { echo "callgrind-step.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSEGTAPE_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
    -DSEGTAPE_WITH_CUDA=OFF -DSEGTAPE_WITH_TORCH=OFF -DSEGTAPE_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$build" -j2 --target loop_bench >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mode in 0 1; do
  for n in 10 30; do
    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$mode.$n" \
      "$build/bench/loop_bench" --batch 1 --hidden 128 --segments $n --infer $mode >/dev/null 2>"$tmp/log.$mode.$n"
    callgrind_annotate --threshold=100 "$tmp/cg.$mode.$n" >"$tmp/ann.$mode.$n"
  done
done
commit=$(git rev-parse --short HEAD)
dirty=$(git diff --quiet HEAD -- engine nn bench/workload.h bench/loop_bench.cpp CMakeLists.txt && echo "" || echo " + uncommitted changes to the engine or its build")
python3 - "$tmp" "$commit$dirty" "$section" <<'PY'
import re, sys
tmp, commit, section = sys.argv[1:4]
steps = 20 * 32
def parse(path):
    total, funcs = 0, {}
    for line in open(path):
        m = re.match(r'^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(\S.*)$', line)
        if not m: continue
        n, what = int(m.group(1).replace(',', '')), m.group(2)
        if what.startswith('PROGRAM TOTALS'): total = n; continue
        if ':' not in what: continue
        name = what.split(':', 1)[1]
        name = re.sub(r'\s+\[[^\]]*\]$', '', name)
        funcs[name] = funcs.get(name, 0) + n
    return total, funcs
out = []
out.append(f"Counted by `bash docs/figures/callgrind-step.sh` at {commit} (valgrind's callgrind, B = 1, H = 128, one thread; "
           "instructions of 20 × 32 steps, the difference of a 30- and a 10-segment run).\n")
for mode, label in ((0, 'training step'), (1, 'inference step')):
    t10, f10 = parse(f'{tmp}/ann.{mode}.10')
    t30, f30 = parse(f'{tmp}/ann.{mode}.30')
    per = (t30 - t10) / steps
    out.append(f"**{label}: {per:,.0f} instructions per step.** Functions with the most (self cost, per step):\n")
    out.append("| function | instructions / step | share |")
    out.append("|---|---|---|")
    diff = {k: (f30.get(k, 0) - f10.get(k, 0)) / steps for k in set(f30) | set(f10)}
    top = sorted(diff.items(), key=lambda kv: -kv[1])[:12]
    for k, v in top:
        k = k if len(k) < 90 else k[:87] + '...'
        k = k.replace('|', '\\|')
        out.append(f"| `{k}` | {v:,.0f} | {100 * v / per:.1f} % |")
    out.append("")
text = "\n".join(out)
print(text)
if section:
    path = 'docs/benchmarks.md'
    doc = open(path).read()
    b, e = f'<!-- callgrind-{section}:begin -->', f'<!-- callgrind-{section}:end -->'
    if b not in doc or e not in doc:
        sys.exit(f"callgrind-step.sh: docs/benchmarks.md has no {b} ... {e} markers")
    i, j = doc.index(b), doc.index(e)
    open(path, 'w').write(doc[:i] + b + "\n\n" + text + "\n" + doc[j:])
    print(f"wrote section callgrind-{section} of {path}", file=sys.stderr)
PY
