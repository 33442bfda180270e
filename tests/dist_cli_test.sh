#!/usr/bin/env bash
# `mpirun -np 2 segtape train` as a user runs it (docs/distributed.md):
#   1. two ranks of B streams learn recall (lag 4) as one process with both
#      ranks' streams (--batch 2B --env-shards 2) does: both over 99 % greedy
#      eval accuracy, within 1 point; parameters within 1e-5 relative L2 after
#      300 updates
#   2. --resume with -np 2 ends bit-identical to an unbroken run; resuming
#      with another rank count is refused, naming both, and changes nothing
#   3. a rank killed (SIGKILL) mid-run: mpirun ends non-zero within 30 s,
#      saying which rank; the last checkpoint resumes
#   4. a rank that hangs (SIGSTOP): the other waits --dist-timeout 3 s, says
#      so and ends the job
#   5. ranks started with different configurations: refused before training,
#      naming the setting; nothing written
#   6. a language model (--task lm): two ranks of B streams read the text's
#      streams as one process of 2B does (parameters within 1e-5 relative L2);
#      with dropout (each rank's masks its own) resume is bit-identical
#   7. ranks on one machine share its memory: two that each fit alone but
#      not together are refused up front, each counting the other's need
# Usage: dist_cli_test.sh path/to/segtape [mpiexec]
set -euo pipefail
S=$(realpath "$1")
MPI=${2:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
W=$(mktemp -d)
bg=()
cleanup() {
  for p in "${bg[@]}"; do kill -9 -- "$p" 2>/dev/null || true; done
  pkill -CONT -f "$W" 2>/dev/null || true
  pkill -9 -f "$W" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
run2() { "$MPI" -np 2 --oversubscribe "$S" "$@"; }
small=(--env recall --lag 4 --hidden 32 --embed 8 --history tbptt:8)

# Relative L2 distance of two checkpoints' parameters (policy.*), stdlib only.
rel_l2() {
  python3 - "$1" "$2" <<'EOF'
import array, json, math, struct, sys
def params(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k.startswith('policy.'):
            s, e = v['data_offsets']
            out[k] = array.array('f', b[8 + n + s:8 + n + e])
    return out
a, b = params(sys.argv[1]), params(sys.argv[2])
assert a.keys() == b.keys() and a
d = sum((x - y) ** 2 for k in a for x, y in zip(a[k], b[k]))
m = sum(y * y for k in b for y in b[k])
print(f"{math.sqrt(d / m):.3e}")
EOF
}
json_get() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
# The pid of rank $2 of the run writing to $1 (its command line names $1).
rank_pid() {
  local p
  for p in $(pgrep -f -- "--out $1"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return 0; fi
  done
  return 1
}
wait_rows() {  # until metrics.csv has $2 data rows (30 s at most)
  for _ in $(seq 300); do
    [ -f "$1/metrics.csv" ] && [ "$(($(wc -l < "$1/metrics.csv") - 1))" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "no $2 metrics rows in $1 after 30 s"
}

echo "== 1. two ranks against one process with both ranks' streams"
learn=(--env recall --lag 4 --hidden 64 --history tbptt:8 --steps 2400)
run2 train "${learn[@]}" --batch 8 --out "$W/two" > "$W/two.log"
"$S" train "${learn[@]}" --batch 16 --env-shards 2 --out "$W/one" > "$W/one.log"
grep -q "data parallel: 2 ranks (mpi) x 8 streams" "$W/two.log" || fail "the two-rank run does not say it is data parallel"
a2=$(json_get "$W/two/metrics.json" eval_accuracy)
a1=$(json_get "$W/one/metrics.json" eval_accuracy)
d=$(rel_l2 "$W/two/checkpoint.safetensors" "$W/one/checkpoint.safetensors")
echo "eval accuracy: 2 ranks x 8 streams $a2, 1 process x 16 streams $a1; parameters' relative L2 distance $d"
python3 -c "import sys; a,b,d=map(float,sys.argv[1:]); sys.exit(0 if a>0.99 and b>0.99 and abs(a-b)<=0.01 and 0<d<=1e-5 else 1)" "$a2" "$a1" "$d" ||
  fail "accuracies $a2 / $a1 (both > 0.99, within 0.01) or distance $d (in (0, 1e-5]) off"
json_get "$W/two/metrics.json" dist > /dev/null || fail "metrics.json has no dist section"

echo "== 2. resume with the same and with another rank count"
run2 train "${small[@]}" --batch 8 --steps 400 --out "$W/unbroken" > /dev/null
run2 train "${small[@]}" --batch 8 --steps 200 --out "$W/broken" > /dev/null
run2 train --resume "$W/broken" --steps 400 > "$W/resume.log"
[ "$(rel_l2 "$W/broken/checkpoint.safetensors" "$W/unbroken/checkpoint.safetensors")" = "0.000e+00" ] ||
  fail "the resumed two-rank run is not bit-identical to the unbroken one"
cp "$W/broken/checkpoint.safetensors" "$W/before"
set +e
"$S" train --resume "$W/broken" --steps 600 > "$W/one-rank.log" 2>&1; rc1=$?
"$MPI" -np 3 --oversubscribe "$S" train --resume "$W/broken" --steps 600 > "$W/three-ranks.log" 2>&1; rc3=$?
set -e
[ "$rc1" = 2 ] && grep -q "written by a run of 2 rank(s) (mpirun -np 2); this run has 1" "$W/one-rank.log" ||
  { cat "$W/one-rank.log"; fail "one process resumed a two-rank checkpoint (rc $rc1)"; }
[ "$rc3" != 0 ] && grep -q "written by a run of 2 rank(s) (mpirun -np 2); this run has 3" "$W/three-ranks.log" ||
  { cat "$W/three-ranks.log"; fail "three ranks resumed a two-rank checkpoint (rc $rc3)"; }
cmp -s "$W/before" "$W/broken/checkpoint.safetensors" || fail "a refused resume changed the checkpoint"
"$S" eval --checkpoint "$W/broken/checkpoint.safetensors" --steps 100 > /dev/null || fail "eval refused a two-rank checkpoint"

echo "== 3. a rank killed mid-run"
"$MPI" -np 2 --oversubscribe "$S" train "${small[@]}" --batch 8 --steps 100000000 --log-every 64 --checkpoint-every 64 --out "$W/killed" > "$W/killed.log" 2>&1 &
mp=$!; bg+=("$mp")
wait_rows "$W/killed" 3
r1=$(rank_pid "$W/killed" 1) || fail "rank 1 of the run in $W/killed not found"
kill -9 "$r1"
t0=$(date +%s)
for _ in $(seq 300); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
kill -0 "$mp" 2>/dev/null && fail "mpirun still runs 30 s after rank 1 was killed"
set +e; wait "$mp"; rc=$?; set -e
echo "mpirun ended $(( $(date +%s) - t0 )) s after the kill, exit code $rc"
[ "$rc" != 0 ] || fail "mpirun exited 0 after a rank was killed"
grep -q "rank 1" "$W/killed.log" || { cat "$W/killed.log"; fail "nothing says rank 1 died"; }
step=$(python3 -c "import sys,struct,json; b=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',b[:8])[0]; print(json.loads(b[8:8+n])['__metadata__']['dist.ranks'])" "$W/killed/checkpoint.safetensors")
[ "$step" = 2 ] || fail "the killed run's checkpoint is not a two-rank checkpoint"
"$MPI" -np 2 --oversubscribe "$S" train --resume "$W/killed" --steps 100000000 --log-every 4096 --dist-timeout 30 > "$W/killed-resume.log" 2>&1 &
mp=$!; bg+=("$mp")
for _ in $(seq 300); do grep -q '^step ' "$W/killed-resume.log" && break; sleep 0.1; done
grep -q '^step ' "$W/killed-resume.log" || fail "the resumed run logged no step in 30 s"
kill -INT "$mp"  # mpirun sends its ranks SIGTERM: they agree on a step, checkpoint and stop
for _ in $(seq 300); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
kill -0 "$mp" 2>/dev/null && fail "the resumed run still runs 30 s after SIGINT"
set +e; wait "$mp"; rc=$?; set -e
grep -q "resume with: mpirun -np 2 segtape train --resume" "$W/killed-resume.log" || { cat "$W/killed-resume.log"; fail "the killed run did not resume and stop cleanly (rc $rc)"; }

# SIGINT to one rank alone (not through mpirun): every rank stops at the
# same step, and rank 0 records SIGINT, the signal that was sent (it said SIGTERM).
"$MPI" -np 2 --oversubscribe "$S" train "${small[@]}" --batch 8 --steps 100000000 --log-every 64 --out "$W/int1" > "$W/int1.log" 2>&1 &
mp=$!; bg+=("$mp")
wait_rows "$W/int1" 2
r1=$(rank_pid "$W/int1" 1) || fail "rank 1 of the run in $W/int1 not found"
kill -INT "$r1"
for _ in $(seq 300); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
kill -0 "$mp" 2>/dev/null && fail "the run still runs 30 s after SIGINT to rank 1"
set +e; wait "$mp"; rc=$?; set -e
grep -q "stopped by SIGINT at step" "$W/int1.log" && grep -q '"interrupted": "SIGINT"' "$W/int1/metrics.json" ||
  { cat "$W/int1.log"; fail "SIGINT to rank 1 alone is not recorded as SIGINT (rc $rc)"; }

echo "== 4. a rank that hangs"
"$MPI" -np 2 --oversubscribe "$S" train "${small[@]}" --batch 8 --steps 100000000 --log-every 64 --dist-timeout 3 --out "$W/hung" > "$W/hung.log" 2>&1 &
mp=$!; bg+=("$mp")
wait_rows "$W/hung" 2
r1=$(rank_pid "$W/hung" 1) || fail "rank 1 of the run in $W/hung not found"
kill -STOP "$r1"
t0=$(date +%s)
for _ in $(seq 300); do kill -0 "$mp" 2>/dev/null || break; sleep 0.1; done
kill -0 "$mp" 2>/dev/null && fail "mpirun still runs 30 s after rank 1 hung (--dist-timeout 3)"
set +e; wait "$mp"; rc=$?; set -e
kill -9 "$r1" 2>/dev/null || true
echo "mpirun ended $(( $(date +%s) - t0 )) s after rank 1 stopped, exit code $rc"
[ "$rc" != 0 ] || fail "mpirun exited 0 with a hung rank"
# (rank 0 waits in the next collective after the stop: an update's gradient
# all-reduce, or the periodic comparison of the replicas' parameter checksums)
grep -qE "rank 0 of 2 waited [0-9]+ s for (the gradient all-reduce|the comparison of the parameter checksums) \(--dist-timeout 3\): another rank died or hangs" "$W/hung.log" ||
  { cat "$W/hung.log"; fail "rank 0 did not say it waited for a hung rank"; }

echo "== 5. ranks with different configurations"
set +e
mm=(--env recall --lag 4 --embed 8 --history tbptt:8 --batch 8 --steps 400 --out "$W/mismatch")
"$MPI" -np 1 --oversubscribe "$S" train "${mm[@]}" --hidden 32 : -np 1 "$S" train "${mm[@]}" --hidden 24 > "$W/mismatch.log" 2>&1; rc=$?
set -e
[ "$rc" = 2 ] || { cat "$W/mismatch.log"; fail "mismatched ranks: exit code $rc, not 2"; }
grep -q "hidden is '32' on rank 0, but rank 1 has '24'" "$W/mismatch.log" || { cat "$W/mismatch.log"; fail "the mismatch is not named"; }
[ ! -e "$W/mismatch" ] || fail "a refused run left $W/mismatch behind"
# A flag that does not parse on one rank (before MPI starts): that rank's
# line names it; the job ends, nothing written.
set +e
"$MPI" -np 1 --oversubscribe "$S" train "${mm[@]}" --hidden 32 : -np 1 "$S" train "${mm[@]}" --hidden abc > "$W/unparsed.log" 2>&1; rc=$?
set -e
[ "$rc" != 0 ] && grep -q "segtape: error (rank 1 of 2): Could not convert: --hidden = abc" "$W/unparsed.log" ||
  { cat "$W/unparsed.log"; fail "a flag that does not parse on rank 1: exit code $rc, or the rank not named"; }
[ ! -e "$W/mismatch" ] || fail "a refused run left $W/mismatch behind"
# A mismatch found only after the command lines are read (--checkpoint-every)
# is still refused before --out is touched: --force over a finished run must
# not have removed it. And --resume on one rank with --out on the other is
# refused at once, naming --resume (it waited --dist-timeout, then misled).
set +e
"$MPI" -np 1 --oversubscribe "$S" train "${small[@]}" --batch 8 --steps 400 --out "$W/unbroken" --force --checkpoint-every 64 : \
  -np 1 "$S" train "${small[@]}" --batch 8 --steps 400 --out "$W/unbroken" --force --checkpoint-every 128 > "$W/ck-every.log" 2>&1; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "checkpoint_every is '64' on rank 0, but rank 1 has '128'" "$W/ck-every.log" ||
  { cat "$W/ck-every.log"; fail "different --checkpoint-every: exit code $rc, or the setting not named"; }
[ -e "$W/unbroken/checkpoint.safetensors" ] && [ -e "$W/unbroken/metrics.json" ] || fail "the refused --force run removed the old run's files"
set +e
t0=$(date +%s)
"$MPI" -np 1 --oversubscribe "$S" train --resume "$W/unbroken" --steps 600 --dist-timeout 60 : \
  -np 1 "$S" train "${small[@]}" --batch 8 --steps 600 --out "$W/other" --dist-timeout 60 > "$W/resume-mix.log" 2>&1; rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--resume is 'given' on rank 0, but rank 1 has 'not given'" "$W/resume-mix.log" ||
  { cat "$W/resume-mix.log"; fail "--resume on one rank only: exit code $rc, or not named"; }
[ $(( $(date +%s) - t0 )) -lt 30 ] || fail "--resume on one rank only waited for the collective timeout"
[ ! -e "$W/other" ] || fail "a refused run left $W/other behind"
# --log-dir given to rank 1 only: rank 0 alone writes the TensorBoard log, so
# the flag would be ignored; refused at once, naming it.
set +e
"$MPI" -np 1 --oversubscribe "$S" train "${small[@]}" --batch 8 --steps 200 --out "$W/tb-mix" : \
  -np 1 "$S" train "${small[@]}" --batch 8 --steps 200 --out "$W/tb-mix" --log-dir "$W/tb-mix-log" > "$W/tb-mix.log" 2>&1; rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--log-dir is 'not given' on rank 0, but rank 1 has '$W/tb-mix-log'" "$W/tb-mix.log" ||
  { cat "$W/tb-mix.log"; fail "--log-dir on rank 1 only: exit code $rc, or not named"; }
[ ! -e "$W/tb-mix" ] && [ ! -e "$W/tb-mix-log" ] || fail "a refused run left $W/tb-mix or its log folder behind"
echo "== 6. a language model over two ranks"
text="$(dirname "$(realpath "$0")")/data/shakespeare-20k.txt"
lm=(--task lm --data "$text" --hidden 64 --embed 32 --history tbptt:16)  # (one epoch: 18000 tokens / 16 streams - 1 = 1124 steps)
run2 train "${lm[@]}" --batch 8 --out "$W/lm2" > "$W/lm2.log"
"$S" train "${lm[@]}" --batch 16 --out "$W/lm1" > "$W/lm1.log"
d=$(rel_l2 "$W/lm2/checkpoint.safetensors" "$W/lm1/checkpoint.safetensors")
echo "lm: 2 ranks x 8 streams against 1 process x 16: parameters' relative L2 distance $d"
python3 -c "import sys; d=float(sys.argv[1]); sys.exit(0 if d<=1e-5 else 1)" "$d" || fail "lm: the two-rank run is $d from one process"
run2 train "${lm[@]}" --batch 8 --dropout 0.3 --steps 1124 --out "$W/lmu" > /dev/null
run2 train "${lm[@]}" --batch 8 --dropout 0.3 --out "$W/lmb" --steps 592 > /dev/null  # (a chunk boundary: 37 x 16)
run2 train --resume "$W/lmb" --steps 1124 > /dev/null
[ "$(rel_l2 "$W/lmb/checkpoint.safetensors" "$W/lmu/checkpoint.safetensors")" = "0.000e+00" ] ||
  fail "lm with dropout: the resumed two-rank run is not bit-identical to the unbroken one"
echo "== 7. two ranks that fit this machine alone, not together"
# history full's estimate is its growth limit's arena (about twice --budget:
# the arena and its nodes), which it would only reach step by step: a run
# whose estimate is about 0.6 of the memory available is refused before it
# allocates, and would be slow to reach it if it were not.
avail=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
budget=$(( avail * 3 / 10 ))KiB
set +e
timeout 120 "$MPI" -np 2 --oversubscribe "$S" train --history full --budget "$budget" --steps 1000000 --out "$W/shared" > "$W/shared.log" 2>&1; rc=$?
set -e
line=$(grep -m1 "other rank of this run on this machine" "$W/shared.log" || true)
[ "$rc" != 0 ] && [ -n "$line" ] || { cat "$W/shared.log"; fail "two ranks of --budget $budget each were not refused up front (rc $rc)"; }
[ ! -e "$W/shared" ] || fail "the refused run made its folder"
# Its numbers: this rank's need alone fits (need <= reach), with the other's it does not.
python3 - "$line" <<'EOF2' || fail "the refusal's numbers do not say that one rank fits and two do not: $line"
import re, sys
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
b = lambda v, u: float(v) * units[u]
line = sys.argv[1]
need = b(*re.search(r"this run needs up to ([0-9.]+) (\w+)", line).groups())
other = b(*re.search(r"other rank of this run on this machine ([0-9.]+) (\w+)", line).groups())
reach = b(*re.search(r"may reach \(.*?\) ([0-9.]+) (\w+):", line).groups())
print(f"one rank needs {need / 2**30:.2f} GiB, the other {other / 2**30:.2f} GiB more, this process may reach {reach / 2**30:.2f} GiB")
sys.exit(0 if need <= reach < need + other else 1)
EOF2
echo "all passed"
