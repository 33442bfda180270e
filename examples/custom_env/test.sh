#!/usr/bin/env bash
# Builds this example against an installed segtape and trains its env both
# ways: with its own program (train_count, through Trainer) and as a plug-in
# of the installed segtape program (`segtape train --env-plugin`), including
# --resume and eval loading the plug-in recorded in the checkpoint, and the
# plug-in errors. Usage: examples/custom_env/test.sh BUILD_DIR
# (ctest: custom_env, label package).
set -euo pipefail
build=$(cd "${1:?usage: test.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/segtape-custom-env.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "custom_env: $*" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1

cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" >/dev/null
segtape="$work/prefix/bin/segtape" plugin="$work/build/libcount_env.so"

# 1. Its own program: learns to count (chance is 1 in 9).
out=$("$work/build/train_count" 600)
echo "$out" | tail -1
acc=$(sed -n 's/^eval accuracy \([0-9.]*\)%.*/\1/p' <<<"$out")
awk -v a="$acc" 'BEGIN { exit !(a > 50) }' || fail "train_count: eval accuracy '$acc' % is not above 50 % (chance 11.11 %)"

# 2. The plug-in, from the installed program: --env knows its env, the run
#    writes its files and records the plug-in.
# (the output is captured first: `| grep -q` ends the pipe at its first match,
# and with pipefail a help text longer than one stdio buffer then fails by SIGPIPE)
help=$("$segtape" train --env-plugin "$plugin" --help)
grep -q "count-ones" <<<"$help" || fail "train --help does not list the plug-in's env"
run() { "$segtape" train --log-every 32 --checkpoint-every 64 "$@" >/dev/null; }
run --env-plugin "$plugin" --env count-ones --steps 192 --out "$work/run"
for f in metrics.csv metrics.json checkpoint.safetensors plot.svg; do
  [[ -s "$work/run/$f" ]] || fail "segtape train --env-plugin wrote no $f"
done
grep -q "\"env_plugin\": \"$plugin\"" "$work/run/metrics.json" || fail "metrics.json does not record the plug-in"

# 3. --resume and eval load the plug-in recorded in the checkpoint; the
#    resumed run ends bit-identical to one that never stopped.
run --resume "$work/run" --steps 384
run --env-plugin "$plugin" --env count-ones --steps 384 --out "$work/straight"
cmp -s "$work/run/checkpoint.safetensors" "$work/straight/checkpoint.safetensors" ||
  fail "a resumed plug-in run differs from one that never stopped"
evaluated=$("$segtape" eval --checkpoint "$work/run/checkpoint.safetensors" --steps 100)
grep -q "env count-ones" <<<"$evaluated" || fail "eval of a plug-in checkpoint"

# 4. Errors: one line naming the flag and the file, exit status 2.
refused() {  # expected message fragment, then the arguments
  local want_code=2 want err code=0
  want=$1
  shift
  err=$("$segtape" "$@" 2>&1 >/dev/null) || code=$?
  [[ $code == "$want_code" && $err == "segtape: error: "*"$want"* && $(wc -l <<<"$err") == 1 ]] ||
    fail "segtape $*: expected exit $want_code and one line with '$want', got $code: $err"
}
printf 'extern "C" int not_a_plugin() { return 0; }\n' | ${CXX:-c++} -x c++ -shared -fPIC -o "$work/other.so" -
refused "--env-plugin $work/none.so: no such file" train --env-plugin "$work/none.so" --env count-ones --out "$work/x"
refused "--env-plugin $work/other.so: not a segtape env plug-in" train --env-plugin "$work/other.so" --env count-ones --out "$work/x"
refused "--env-plugin $here/README.md: cannot load it as a shared library" train --env-plugin "$here/README.md" --out "$work/x"
refused "unknown env 'count-ones' (registered: recall, tmaze, dialogue," train --env count-ones --out "$work/x"
mv "$plugin" "$work/moved.so"
refused "comes from the plug-in $plugin (recorded in the checkpoint), which cannot be loaded" eval --checkpoint "$work/run/checkpoint.safetensors"
"$segtape" eval --env-plugin "$work/moved.so" --checkpoint "$work/run/checkpoint.safetensors" --steps 100 >/dev/null ||
  fail "eval with --env-plugin at the plug-in's new path"
[[ ! -e "$work/x" ]] || fail "a refused run made its directory"
echo "custom_env: ok"
