#!/usr/bin/env bash
# The fault run: interrupts `segtape train` at random moments, KILLS times,
# with SIGKILL, SIGINT and SIGTERM in turn (KILL, INT, KILL, TERM, ...),
# while it writes checkpoints (one every 32 steps, so most of its time is
# spent writing them); every other SIGKILL is aimed at a write in progress
# (its temporary file exists). SIGINT and SIGTERM stop the run at its next
# segment boundary with a checkpoint. After every interruption the
# checkpoint on disk must load (`segtape eval`): no run folder is ever left
# without one once the first is written. Then `--resume` runs to the end,
# and the final checkpoint must be byte-identical to that of a run that was
# never interrupted (resume is bit-exact on CPU).
# Usage: tests/kill_test.sh [KILLS] [SEGTAPE_BIN] [WORKLOAD]
#   KILLS: default 20 (ctest: 50 each for the agent and lm; label `soak`)
#   WORKLOAD: agent (recall, the default agent's A2C) or lm (--task lm on
#   tests/data/shakespeare-20k.txt, a one-layer GRU with dropout)
# SEGTAPE_KILL_SEED fixes the random delays (printed on every run).
set -euo pipefail
# Job control: a background job started without it has SIGINT ignored (POSIX),
# so a SIGINT sent before segtape installs its handlers would be lost and the
# run would go on to its end; with it, such a SIGINT ends the run as SIGKILL does.
set -m
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kills=${1:-20}
bin=${2:-${SEGTAPE_BIN:-${SEGTAPE_BUILD:-$root/build}/agent/segtape}}
workload=${3:-agent}
[[ -x "$bin" ]] || { echo "kill_test: no segtape program at $bin (build first, or pass its path)" >&2; exit 1; }
seed=${SEGTAPE_KILL_SEED:-$(( $(date +%s) % 32768 ))}
RANDOM=$seed
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/segtape-kill.XXXXXX")
trap 'rm -rf "$work"' EXIT
steps=960000  # far more than the interruptions get through: the run must outlast them
case $workload in
  agent) args=(--env recall --history tbptt:32 --steps "$steps" --batch 4 --hidden 32 --seed 5 --eval-steps 32) ;;
  lm) args=(--task lm --data "$root/tests/data/shakespeare-20k.txt" --split 0.1 --history tbptt:32 --steps "$steps" --batch 4
            --hidden 32 --embed 16 --layers 1 --dropout 0.2 --seed 5 --eval-steps 32) ;;
  *) echo "kill_test: WORKLOAD is agent or lm, not '$workload'" >&2; exit 2 ;;
esac
run="$work/run" ck="$work/run/checkpoint.safetensors"
signals=(KILL INT KILL TERM)

# How long the program takes to start (it may load LibTorch): delays are drawn after that.
startup_ms=100000
for _ in 1 2 3; do
  t0=$(date +%s%N); "$bin" --version >/dev/null; ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  (( ms < startup_ms )) && startup_ms=$ms
done

# The same run, never interrupted, alongside; checkpointed every 3200 steps as
# the final resume below is (--checkpoint-every is recorded in the checkpoint).
"$bin" train "${args[@]}" --checkpoint-every 3200 --out "$work/straight" >"$work/straight.log" 2>&1 &
straight_pid=$!

killed=0 attempts=0 finished=0 evals=() mid_write=0
declare -A by_signal graceful
while (( killed < kills )); do
  if [[ -f "$ck" ]]; then
    "$bin" train --resume "$run" --checkpoint-every 32 >"$work/log" 2>&1 &
  else  # killed before its first checkpoint: start again
    "$bin" train "${args[@]}" --checkpoint-every 32 --out "$run" --force >"$work/log" 2>&1 &
  fi
  pid=$!
  attempts=$(( attempts + 1 ))
  delay_ms=$(( startup_ms + RANDOM % 400 ))
  sleep "$(( delay_ms / 1000 )).$(printf %03d $(( delay_ms % 1000 )))"
  sig=${signals[$(( attempts % ${#signals[@]} ))]}
  if [[ $sig == KILL ]] && (( attempts % 4 == 2 )); then
    # Every other SIGKILL is aimed: wait for this process's next temporary
    # checkpoint file to appear (a write under way), then kill at once.
    for (( spin = 0; spin < 200000; spin++ )); do
      compgen -G "$run/.checkpoint.safetensors.tmp.$pid.*" >/dev/null && break
      kill -0 "$pid" 2>/dev/null || break
    done
  fi
  if kill -"$sig" "$pid" 2>/dev/null; then
    # (SIGINT / SIGTERM: the run stops at its next segment boundary and
    # writes its checkpoint, or, before its handlers are installed, ends as
    # SIGKILL would)
    wait "$pid" 2>/dev/null || true
    killed=$(( killed + 1 )) by_signal[$sig]=$(( ${by_signal[$sig]:-0} + 1 ))
    if [[ $sig != KILL ]] && grep -q "stopped by SIG$sig at step" "$work/log"; then graceful[$sig]=$(( ${graceful[$sig]:-0} + 1 )); fi
    # A SIGKILL between creating the temporary file and renaming it leaves the
    # temporary behind (the old checkpoint stays in place; the next --resume
    # removes it): count those.
    if compgen -G "$run/.checkpoint.safetensors.tmp.$pid.*" >/dev/null; then mid_write=$(( mid_write + 1 )); fi
  else
    wait "$pid" || { cat "$work/log" >&2; echo "kill_test: segtape train failed (seed $seed)" >&2; exit 1; }
    finished=1
    break
  fi
  # What the kill left must load: a copy is evaluated while the run goes on.
  if [[ -f "$ck" ]]; then
    cp "$ck" "$work/after-kill-$killed.safetensors"
    "$bin" eval --checkpoint "$work/after-kill-$killed.safetensors" --steps 32 >"$work/eval-$killed.log" 2>&1 &
    evals+=("$!:$killed:$delay_ms")
  fi
done
for e in "${evals[@]}"; do
  IFS=: read -r epid k ms <<<"$e"
  if ! wait "$epid"; then
    cat "$work/eval-$k.log" >&2
    cp "$work/after-kill-$k.safetensors" "${TMPDIR:-/tmp}/segtape-kill-unloadable.safetensors" 2>/dev/null || true
    echo "kill_test: after kill $k (at $ms ms) the checkpoint does not load (seed $seed; kept in ${TMPDIR:-/tmp}/segtape-kill-unloadable.safetensors)" >&2
    exit 1
  fi
done
if (( ! finished )); then
  # (checkpoints only every 3200 steps from here: that does not change the result, only the time)
  "$bin" train --resume "$run" --checkpoint-every 3200 >"$work/log" 2>&1 || { cat "$work/log" >&2; echo "kill_test: final --resume failed (seed $seed)" >&2; exit 1; }
fi

wait "$straight_pid" || { cat "$work/straight.log" >&2; echo "kill_test: the unbroken run failed" >&2; exit 1; }
if ! cmp -s "$ck" "$work/straight/checkpoint.safetensors"; then
  echo "kill_test: the resumed run's final checkpoint differs from the unbroken run's (seed $seed)" >&2
  exit 1
fi
echo "kill_test ($workload): $killed interruptions in $attempts starts (SIGKILL ${by_signal[KILL]:-0}, SIGINT ${by_signal[INT]:-0}" \
     "(${graceful[INT]:-0} stopped at a segment boundary), SIGTERM ${by_signal[TERM]:-0} (${graceful[TERM]:-0}); seed $seed, start-up ${startup_ms} ms), $mid_write SIGKILLs mid-write (temporary file left," \
     "checkpoint intact); ${#evals[@]} checkpoints left by them, every one loaded; the resumed run's final checkpoint is" \
     "byte-identical to an unbroken run's"
(( killed == kills )) || { echo "kill_test: the run ended after only $killed kills: raise steps" >&2; exit 1; }
# Most SIGINTs and SIGTERMs come after the handlers are installed: each such
# stop must have been the graceful one (its line), not an abrupt end.
for s in INT TERM; do
  (( ${by_signal[$s]:-0} < 4 || ${graceful[$s]:-0} >= 1 )) ||
    { echo "kill_test: no SIG$s of ${by_signal[$s]} stopped the run at a segment boundary (seed $seed)" >&2; exit 1; }
done
