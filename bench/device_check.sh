#!/usr/bin/env bash
# GPU verification of the CUDA backend, for a machine with a GPU (written for
# the lent H200 with a CUDA PyTorch; docs/cuda.md lists what is pending):
#
#   1. the programs: with SEGTAPE_DEVICE_PACK=DIR, the ones bench/device_pack.sh
#      built and packed on another machine (the lent H200 has no OpenBLAS,
#      GoogleTest, CLI11, ... to build segtape with; they run with DIR/lib and
#      the machine's CUDA libraries: CUDA 13's runtime and cuBLAS, torch's
#      cuDNN and NCCL wheels); otherwise configure and build here with CUDA (no
#      LibTorch in this build: its CUDA runtime and segtape's never share a
#      process), CMAKE_CUDA_ARCHITECTURES 90
#   2. the cuda tests (cuda_test, cuda_nn_test, cuda_device_loop_test; they must pass, none skipped for
#      want of a GPU: three skip by design where one is present, the tests of
#      the no-GPU message and of the emulated device), then the CPU engine suites of
#      the same build; CudaDist.* again on its own: data parallelism's gradient
#      averaging on the device, by NCCL on the tape's stream with one rank when
#      the build found NCCL; cuda_test under compute-sanitizer's memcheck
#      (without the deliberate out-of-memory test) where it is installed
#   3. cuda_bench: segtape's training step on the GPU at issue 19's five sizes,
#      stepped (eager, graph-replayed) and as one gru_sequence per segment (the
#      fused kernels where they fit: a cluster, or the grid plan at (32, 512)
#      and (64, 1024)); the sequence modes again at (1, 128), (32, 128),
#      (32, 512) and (64, 1024) with --fused-gru off (cuDNN's GRU), one run;
#      graph, graph-bf16 (bfloat16 products), sequence-graph-tf32 and
#      sequence-graph-bf16 (the fused kernels with bfloat16 products where
#      they fit) at (32, 128), (64, 1024) and (512, 1024), one run (issue
#      51's bf16 against TF32)
#   4. when python3's torch has CUDA: bench/torch_cuda (a project of its own,
#      -DCMAKE_PREFIX_PATH=torch.utils.cmake_prefix_path) builds
#      cuda_bench_torch, the same workload in LibTorch: eager, CUDA-graph
#      captured, and torch::nn::GRU (cuDNN) over the segment, with TF32 (its
#      default) and without; steps 3 and 4 in SEGTAPE_DEVICE_ROUNDS (3)
#      interleaved rounds, segtape then LibTorch, the table their medians
#   5. the agent on the GPU: device_loop_bench (the rollout and GAE on the device,
#      B = 4096, H = 128, graphs on and off; docs/device-loop.md); PPO on
#      device-recall (B = 1024) with --device-loop on and off, and on at
#      B = 4096, H = 128 (issue 51's training throughput); bench/lm_cuda.py
#      (issue 47: --task lm's tokens/s against PyTorch's cuDNN GRU and LSTM);
#      `segtape train --device cuda` (recall, 6000 steps), with
#      its segments as CUDA graphs (the default), with --cuda-graphs off and
#      with --precision bf16;
#      `segtape train --device cuda --algo ppo` (recall, 1024 steps), its update
#      windows as fused sequences where they fit and with the kernel switch
#      fused_gru off (step by step: `--kernel fused_gru=off`, where the program
#      has that option; segtape/kernels.h); `segtape retention --device cuda --no-libtorch` (100 steps)
#   6. $OUT/results.md: the test summary, the benchmark table, the agent's summary,
#      the size check's host estimate against each GPU run's peak resident memory
#
# Every step has a time limit under one overall deadline (6 min by default,
# SEGTAPE_DEVICE_DEADLINE seconds), so the script ends well inside 8 minutes
# whatever hangs; logs of every step are in $OUT.
#
#   OUT=/tmp/out bash bench/device_check.sh        (OUT defaults to ./device-check-out)
#   SEGTAPE_DEVICE_PACK=.device-pack OUT=/tmp/dc bash bench/device_check.sh   (the lent H200:
#   bench/device_pack.sh, run beforehand elsewhere, says how to call it there)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/device-check-out}
mkdir -p "$OUT"
JOBS=$(nproc 2>/dev/null || echo 4)
DEADLINE=$((SECONDS + ${SEGTAPE_DEVICE_DEADLINE:-360}))
BUILD=${SEGTAPE_DEVICE_BUILD:-$ROOT/build-device}
BUILD_TORCH=${SEGTAPE_DEVICE_BUILD_TORCH:-$ROOT/build-device-torch}
# A pack: bench/device_pack.sh's folder (its segtape-pack.tgz is unpacked into
# $TMPDIR/segtape-pack, outside $OUT) or an unpacked one
PACK=${SEGTAPE_DEVICE_PACK:-}
if [[ -n "$PACK" && -f "$PACK/segtape-pack.tgz" && ! -d "$PACK/bin" ]]; then
  unpacked=${TMPDIR:-/tmp}/segtape-pack
  rm -rf "$unpacked" && mkdir -p "$unpacked" && tar xzf "$PACK/segtape-pack.tgz" -C "$unpacked" && PACK=$unpacked
fi
[[ -n "$PACK" ]] && PACK=$(cd "$PACK" 2>/dev/null && pwd || echo "$PACK")
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
status=0
# The python3 that has torch (the lent H200's is /opt/torch/.venv's), nvcc, compute-sanitizer
PY=python3
for p in python3 /opt/torch/.venv/bin/python3; do "$p" -c 'import torch' 2>/dev/null && PY=$p && break; done
NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)

log() { echo "[${SECONDS}s] $*" | tee -a "$SUMMARY"; }

# step NAME LIMIT_SECONDS COMMAND...: runs with output in $OUT/NAME.log, within the deadline.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS))
  if ((left < 15)); then
    log "SKIPPED $name: the overall deadline is reached"
    return 124
  fi
  ((limit > left)) && limit=$left
  log "== $name (limit ${limit} s)"
  local rc=0
  timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    log "   ok"
  else
    log "   FAILED: exit $rc$( ((rc == 124)) && echo ' (time limit)'); last lines of $name.log:"
    tail -n 25 "$OUT/$name.log" | sed 's/^/   | /' | tee -a "$SUMMARY"
  fi
  return $rc
}

# ---- 0. the machine
{
  echo "## nvidia-smi"; nvidia-smi 2>&1 || true
  echo "## nvcc"; echo "$NVCC"; "$NVCC" --version 2>&1 || true
  echo "## compute-sanitizer"; echo "$SANITIZER"
  echo "## glibc"; ldd --version 2>&1 | head -1
  echo "## cmake"; cmake --version 2>&1 | head -1
  echo "## compiler"; c++ --version 2>&1 | head -1
  echo "## cuDNN"; grep -hE '^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)' /usr/local/cuda/include/cudnn_version.h /usr/include/cudnn_version.h 2>/dev/null
  echo "## torch ($PY)"; "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
  echo "## nproc"; echo "$JOBS"
} >"$OUT/machine.txt" 2>&1
log "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'nvidia-smi failed')"

# builder DIR: the command that builds several targets of DIR in one parallel
# run (cmake --build --target a b builds them one after the other).
builder() {
  if [[ -f "$1/build.ninja" ]]; then echo ninja -C "$1" -j "$JOBS"; else echo make -C "$1" -j "$JOBS"; fi
}

# ---- 4, started first: the LibTorch program (bench/torch_cuda: a project of its
# own, needing torch alone) builds in the background, on the CPU, while the
# steps below use the GPU; step 4 waits for it. Torch's CMake package looks
# for nvcc on PATH (and its architectures: 9.0, not the GPU's auto-detection).
torch_prefix=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
torch_cuda=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
torch_job=
if [[ -n "$torch_prefix" && "$torch_cuda" == "1" && -n "$NVCC" ]]; then
  (
    export PATH="$(dirname "$NVCC"):$PATH" TORCH_CUDA_ARCH_LIST=9.0
    timeout --kill-after=5 100 cmake -S "$ROOT/bench/torch_cuda" -B "$BUILD_TORCH" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$torch_prefix" -DCMAKE_CUDA_COMPILER="$NVCC" -DCUDA_TOOLKIT_ROOT_DIR="${NVCC%/bin/nvcc}" \
      -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/configure-torch.log" 2>&1 &&
      # shellcheck disable=SC2046 # builder's words are meant to split
      timeout --kill-after=5 200 $(builder "$BUILD_TORCH") cuda_bench_torch >"$OUT/build-torch.log" 2>&1
  ) &
  torch_job=$!
  log "LibTorch's program building in the background (configure-torch.log, build-torch.log; torch from $PY)"
fi

# ---- 1. the programs: packed elsewhere (SEGTAPE_DEVICE_PACK), or built here with CUDA
# prog NAME: where program NAME is (tests/cuda_test, bench/cuda_bench, agent/segtape, ...)
built=0
if [[ -n "$PACK" ]]; then
  # Each program runs through a wrapper that gives it, and it alone, the pack's
  # libraries, then CUDA 13's runtime and cuBLAS, then torch's cuDNN and NCCL
  # wheels: the pack's C++ runtime (Debian 12's) must not reach python3,
  # cmake or the compiler of this machine (step 4).
  prog() { echo "$PACK/run/$(basename "$1")"; }
  stale=
  if [[ -f "$PACK/sources.sha256" ]] && ! (cd "$ROOT" && sha256sum -c --quiet "$PACK/sources.sha256" >"$OUT/pack-sources.log" 2>&1); then
    stale=$(grep -c 'FAILED' "$OUT/pack-sources.log" || true)
  fi
  if [[ -n "$stale" && "${SEGTAPE_DEVICE_STALE_OK:-0}" != 1 ]]; then
    log "FAILED: the pack is stale: $stale of the sources it was built from differ in this tree (pack-sources.log; $(head -1 "$PACK/MANIFEST" 2>/dev/null)): run bench/device_pack.sh again (SEGTAPE_DEVICE_STALE_OK=1 runs it anyway)"
    status=1
  elif [[ -x "$PACK/bin/cuda_test" ]]; then
    built=1
    site=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null || true)
    [[ -n "$site" ]] || site=$(ls -d /opt/torch/.venv/lib/python3*/site-packages 2>/dev/null | head -1)
    libs="$PACK/lib"
    for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/cuda/targets/x86_64-linux/lib \
      "$site"/nvidia/cudnn/lib "$site"/nvidia/nccl/lib "$site"/nvidia/*/lib; do
      [[ -d "$d" ]] && libs="$libs:$d"
    done
    libs="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    mkdir -p "$PACK/run"
    for p in "$PACK"/bin/*; do
      printf '#!/usr/bin/env bash\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$libs" "$p" >"$PACK/run/$(basename "$p")"
      chmod +x "$PACK/run/$(basename "$p")"
      missing=$(LD_LIBRARY_PATH=$libs ldd "$p" 2>&1 | grep "not found" | tr -s ' \t' ' ' | tr '\n' ';')
      [[ -n "$missing" ]] && log "   $(basename "$p"): libraries not found: $missing"
    done
    log "programs from the pack $PACK ($(head -1 "$PACK/MANIFEST" 2>/dev/null)); their LD_LIBRARY_PATH=$libs"
  else
    log "FAILED: no pack at '$PACK' (bench/device_pack.sh makes one; carry it)"
    status=1
  fi
else
  prog() { echo "$BUILD/$1"; }
  if step configure 90 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSEGTAPE_WITH_TORCH=OFF -DSEGTAPE_WITH_CUDA=ON; then
    if ! grep -q "CUDA backend on" "$OUT/configure.log"; then
      log "FAILED: the build has no CUDA backend (nvcc or cuDNN 9 not found): see configure.log"
      status=1
    fi
  else
    log "configure failed: missing packages? (segtape needs OpenBLAS, nlohmann-json, CLI11, fmt, GoogleTest, Google Benchmark; see configure.log; without them, bring a pack: bench/device_pack.sh)"
    status=1
  fi
  # shellcheck disable=SC2046 # builder's words are meant to split
  if ((status == 0)) && step build 240 $(builder "$BUILD") cuda_test cuda_nn_test cuda_device_loop_test cuda_bench device_loop_bench segtape gradcheck_test packed_test \
    formula_test segment_test memory_test errors_test safetensors_test; then
    built=1
    # nvcc's code generation: sm_90 SASS and compute_90 PTX.
    echo "   kernels: $(grep -o -- '--generate-code=[^ ]*' "$BUILD/engine/CMakeFiles/segtape_cuda_kernels.dir/flags.make" 2>/dev/null)" |
      tee -a "$SUMMARY"
  else
    status=1
  fi
fi

# ---- 2. tests
if ((built)); then
  if [[ -n "$PACK" ]]; then  # the test programs themselves (the pack has no ctest files)
    step cuda-test 150 "$(prog tests/cuda_test)" || status=1
    step cuda-nn-test 150 "$(prog tests/cuda_nn_test)" || status=1
    step cuda-device-loop-test 60 "$(prog tests/cuda_device_loop_test)" || status=1
    skipped=$(cat "$OUT/cuda-test.log" "$OUT/cuda-nn-test.log" "$OUT/cuda-device-loop-test.log" 2>/dev/null | grep -c '^no usable GPU:' || true)
  else
    step cuda-tests 180 ctest --test-dir "$BUILD" -L cuda --output-on-failure -j 8 --output-junit "$OUT/cuda-tests.xml" || status=1
    skipped=$(grep '(Skipped)' "$OUT/cuda-tests.log" 2>/dev/null | grep -cvE 'WithoutAGpu|RefusesHostAccessLikeAGpu' || true)
  fi
  if [[ "${skipped:-0}" != "0" ]]; then
    log "FAILED: $skipped cuda tests skipped for want of a GPU: the tests found none (see the cuda test logs)"
    status=1
  fi
  if [[ -n "$PACK" ]]; then
    grep -q "NCCL found" "$PACK/MANIFEST" 2>/dev/null && log "   NCCL: built in" || log "   NCCL: see the pack's MANIFEST"
  else
    grep -q "NCCL found" "$OUT/configure.log" && log "   NCCL: built in" || log "   NCCL: not found by configure (CudaDist averages through host memory)"
  fi
  step nccl 60 "$(prog tests/cuda_nn_test)" --gtest_filter='CudaDist.*' || status=1
  if [[ -n "$PACK" ]]; then
    for t in gradcheck_test packed_test segment_test memory_test errors_test; do
      step "cpu-$t" 60 env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$(prog "tests/$t")" || status=1
    done
  else
    step cpu-tests 90 env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ctest --test-dir "$BUILD" -L 'gradcheck|segment|memory|errors' -j "$JOBS" --output-on-failure || status=1
  fi
  # The training test prints its loss curve summary and arena high-water.
  grep -h "loss: CPU" "$OUT/cuda-tests.log" "$OUT/cuda-test.log" "$BUILD/Testing/Temporary/LastTest.log" 2>/dev/null | head -1 >>"$SUMMARY" || true
  cp "$BUILD/Testing/Temporary/LastTest.log" "$OUT/ctest-last.log" 2>/dev/null || true
fi

# ---- 3 and 4. segtape, then LibTorch (optional: needs python3's torch with
# CUDA; built in the background above), in interleaved rounds
torch_ok=0
if [[ -n "$torch_job" ]]; then
  if wait "$torch_job"; then
    log "LibTorch's program built ($((SECONDS)) s into the run)"
    torch_ok=1
  else
    log "LibTorch comparison not available (its build failed or ran out of time; last lines below); segtape's numbers stand alone"
    tail -n 15 "$OUT/configure-torch.log" "$OUT/build-torch.log" 2>/dev/null | sed 's/^/   | /' | tee -a "$SUMMARY"
  fi
else
  log "no CUDA torch ($PY: prefix '${torch_prefix}', cuda ${torch_cuda}) or no nvcc: LibTorch comparison skipped"
fi
ROUNDS=${SEGTAPE_DEVICE_ROUNDS:-3}
if ((built)); then
  for ((r = 1; r <= ROUNDS; ++r)); do
    step "bench-segtape-$r" 90 "$(prog bench/cuda_bench)" --segments 50 --fused-gru-grid on || status=1
    grep -E '^segtape,' "$OUT/bench-segtape-$r.log" >"$OUT/bench-segtape-$r.csv" || true
    if ((torch_ok)); then
      step "bench-libtorch-$r" 90 "$BUILD_TORCH/cuda_bench_torch" --segments 50 &&
        grep -E '^libtorch,' "$OUT/bench-libtorch-$r.log" >"$OUT/bench-libtorch-$r.csv" || true
    fi
  done
  # the sequence modes again on cuDNN's GRU where the fused kernels ran above
  # (32, 512) and (64, 1024): the grid plan's sizes (fused_gru.h's grid_plan), TF32 beside it as cuDNN may use it
  step bench-segtape-cudnn 90 "$(prog bench/cuda_bench)" --fused-gru off --segments 50 --sizes 1x128,32x128,32x512,64x1024 \
    --modes sequence,sequence-graph,sequence-graph-tf32 || status=1
  grep -E '^segtape,' "$OUT/bench-segtape-cudnn.log" >"$OUT/bench-segtape-cudnn.csv" || true
  # issue 51's bf16 against TF32 (docs/precision.md): the cells as graphs in float32 and with bfloat16 products, the sequence
  # with TF32 and with bfloat16 products (the fused kernels where they fit, the grid plan on; else cells)
  step bench-segtape-bf16 120 "$(prog bench/cuda_bench)" --segments 50 --fused-gru-grid on --sizes 32x128,64x1024,512x1024 \
    --modes graph,graph-bf16,sequence-graph-tf32,sequence-graph-bf16 || status=1
  grep -E '^segtape,' "$OUT/bench-segtape-bf16.log" >"$OUT/bench-segtape-bf16.csv" || true
fi

# ---- 5. the agent and the retention lab on the GPU (after the benchmarks: they matter less)
if ((built)); then
  # first (the deadline may skip the later steps): issue 51's target, PPO training (rollout and update on the device) on device-recall at B = 4096, H = 128, 3 iterations of 128 steps
  step agent-ppo-device-loop-4096 150 "$(prog agent/segtape)" train --device cuda --algo ppo --env device-recall --batch 4096 --budget 1GiB \
    --hidden 128 --rollout 128 --steps 384 --device-loop on --out "$OUT/agent-ppo-device-loop-4096" --force || status=1
  step agent-train 120 "$(prog agent/segtape)" train --device cuda --steps 6000 --out "$OUT/agent-run" --force || status=1
  # the same run with every segment eager: what the trainer's CUDA graphs buy (docs/agent.md)
  step agent-train-eager 120 "$(prog agent/segtape)" train --device cuda --cuda-graphs off --steps 6000 --out "$OUT/agent-run-eager" --force || status=1
  # the same run with bfloat16 products (cuBLAS's bf16 GEMM; docs/precision.md): its loss beside float32's
  step agent-train-bf16 120 "$(prog agent/segtape)" train --device cuda --precision bf16 --steps 6000 --out "$OUT/agent-run-bf16" --force || status=1
  # PPO: the update windows as one fused gru_sequence each, then step by step (docs/agent.md, "Recurrent PPO")
  step agent-ppo 90 "$(prog agent/segtape)" train --device cuda --algo ppo --steps 1024 --out "$OUT/agent-ppo" --force || status=1
  if "$(prog agent/segtape)" train --help 2>/dev/null | grep -q -- '--kernel'; then
    step agent-ppo-steps 90 "$(prog agent/segtape)" train --kernel fused_gru=off --device cuda --algo ppo --steps 1024 \
      --out "$OUT/agent-ppo-steps" --force || status=1
  else
    log "agent-ppo-steps skipped: segtape train has no --kernel option to turn the fused GRU off (segtape/kernels.h)"
  fi
  # PPO on device-recall with each rollout on the device, then on the host (the same run; docs/device-loop.md)
  step agent-ppo-device-loop 90 "$(prog agent/segtape)" train --device cuda --algo ppo --env device-recall --batch 1024 --budget 256MiB \
    --steps 4096 --device-loop on --out "$OUT/agent-ppo-device-loop" --force || status=1
  step agent-ppo-host-loop 90 "$(prog agent/segtape)" train --device cuda --algo ppo --env device-recall --batch 1024 --budget 256MiB \
    --steps 4096 --device-loop off --out "$OUT/agent-ppo-host-loop" --force || status=1
  # issue 47's language models: segtape's --task lm against PyTorch's cuDNN GRU and LSTM, tokens/s (bench/lm_cuda.py)
  if "$PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    step lm-cuda 150 "$PY" "$ROOT/bench/lm_cuda.py" --segtape "$(prog agent/segtape)" --data "$ROOT/tests/data/shakespeare-20k.txt" \
      --out "$OUT/lm-cuda" || status=1
    # issue 51's bf16 at the same precision: segtape --precision bf16 against PyTorch under autocast, one round
    step lm-cuda-bf16 120 "$PY" "$ROOT/bench/lm_cuda.py" --segtape "$(prog agent/segtape)" --data "$ROOT/tests/data/shakespeare-20k.txt" \
      --precision bf16 --rounds 1 --out "$OUT/lm-cuda-bf16" || status=1
  else
    log "lm-cuda skipped: $PY has no CUDA torch"
  fi
  # the agent loop on the device (docs/device-loop.md): rollout + GAE at issue 51's B = 4096, H = 128, graphs on and off
  step device-loop 60 "$(prog bench/device_loop_bench)" --device cuda --batch 4096 --hidden 128 --rollout 128 --segment 32 || status=1
  step device-loop-eager 60 "$(prog bench/device_loop_bench)" --device cuda --graphs off --batch 4096 --hidden 128 --rollout 128 \
    --segment 32 || status=1
  step retention 90 "$(prog agent/segtape)" retention --device cuda --no-libtorch --steps 100 --out "$OUT/retention" || status=1
  # compute-sanitizer, last (the slowest step): no invalid device access in cuda_test (the out-of-memory test reports its deliberate failures)
  if [[ -n "$SANITIZER" ]]; then
    step memcheck 120 "$SANITIZER" --tool memcheck --error-exitcode 3 "$(prog tests/cuda_test)" --gtest_filter='-*OutOfMemory*' || status=1
  else
    log "compute-sanitizer not found: memcheck skipped"
  fi
fi

# ---- 6. the table
# A section of results.md: its title, then the last lines of each run's log.
runs() {
  echo "## $1"
  echo
  shift
  for name in "$@"; do
    # a segtape run's summary, whole (with --device cuda: its graphs and how its GRU ran, the recurrence line); else the log's end
    if grep -qx summary "$OUT/$name.log" 2>/dev/null; then sed -n '/^summary$/,$p' "$OUT/$name.log"; else tail -n 9 "$OUT/$name.log" 2>/dev/null; fi |
      sed 's/^/    /'
    echo
  done
}
{
  echo "# segtape CUDA device check"
  echo
  echo "Machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "Torch: $("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo none)"
  echo
  echo "## Tests"
  echo
  # ctest's summary line (a build here), or each test program's gtest totals (a pack)
  for f in "$OUT"/cuda-tests.log "$OUT"/cpu-tests.log "$OUT"/cuda-test.log "$OUT"/cuda-nn-test.log "$OUT"/cpu-*_test.log "$OUT"/memcheck.log; do
    [[ -f "$f" ]] || continue
    echo "- $(basename "$f" .log): $(grep -hE 'tests passed|tests failed|^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|ERROR SUMMARY' "$f" | tr '\n' ' ')"
  done
  echo
  echo "## Training step (GRUCell(32, H) -> Linear(H, 16) -> cross-entropy, K = 32, SGD), per step"
  echo
  echo "| engine | mode | B, H | µs / step, median | min–max (runs) | engine peak | engine reserved | device footprint | loss after run |"
  echo "|---|---|---|---|---|---|---|---|---|"
  # one row per engine, mode and size: the median of its runs (rounds), their
  # range; memory and loss from its first run (the same in every round)
  cat "$OUT"/bench-*.csv 2>/dev/null | grep -v '^engine,' | sort -t, -k3,3n -k4,4n -k1,1 -k2,2 -k5,5n |
    awk -F, '
      function mib(b) { return sprintf("%.1f MiB", b / 1048576) }
      function flush() {
        if (key == "") return
        med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        printf "| %s | %s | %s, %s | %.1f | %.1f–%.1f (%d) | %s | %s | %s | %.4f |\n", e, m, b, h, med, v[1], v[n], n, mib(pk), mib(rs), mib(fp), ls
      }
      { k = $1 "," $2 "," $3 "," $4
        if (k != key) { flush(); key = k; n = 0; e = $1; m = $2; b = $3; h = $4; pk = $6; rs = $7; fp = $8; ls = $9 }
        v[++n] = $5 }
      END { flush() }'
  echo
  echo "Each run: 50 segments of K = 32 steps after 4 warm-up segments; runs of different modes and engines interleaved round by round (segtape's sequence modes on cuDNN's GRU: one run)."
  echo "engine peak: segtape's segment-arena high-water / LibTorch's allocator peak (allocated bytes)."
  echo "engine reserved: segtape's fixed pools (arena, persistent, carry, workspaces) / LibTorch's reserved peak."
  echo "device footprint: drop of cudaMemGetInfo's free bytes from before the model to after the run (handles included)."
  echo
  runs "The agent on the GPU (segtape train --device cuda --steps 6000; then with --cuda-graphs off; then --precision bf16)" agent-train agent-train-eager agent-train-bf16
  runs "PPO on the GPU (segtape train --device cuda --algo ppo --steps 1024; then with --kernel fused_gru=off)" agent-ppo agent-ppo-steps
  runs "The agent loop on the device (device_loop_bench: rollout + GAE, B = 4096, H = 128; graphs on, then off)" device-loop device-loop-eager
  runs "PPO on device-recall, B = 1024, 4096 steps: --device-loop on, then off" agent-ppo-device-loop agent-ppo-host-loop
  runs "PPO training on the device, device-recall, B = 4096, H = 128, 384 steps (transitions/s: steps/s x 4096)" agent-ppo-device-loop-4096
  echo "## Language models: segtape against PyTorch's cuDNN GRU and LSTM (bench/lm_cuda.py)"
  echo
  cat "$OUT/lm-cuda/lm-cuda.md" 2>/dev/null || echo "(not run)"
  echo
  cat "$OUT/lm-cuda-bf16/lm-cuda.md" 2>/dev/null || echo "(bf16: not run)"
  echo
  echo "## The size check with --device cuda (host memory: the estimate against the measured peak)"
  echo
  for run in agent-run agent-run-eager agent-ppo; do
    "$PY" - "$OUT/$run/metrics.json" "$run" <<'PY' 2>/dev/null || echo "- $run: no metrics.json"
import json, sys
j = json.load(open(sys.argv[1]))
e, p = j["memory_estimate"]["resident_bytes"], j["peak_rss_bytes"]
print(f"- {sys.argv[2]}: estimate {e / 2**20:.1f} MiB, peak RSS {p / 2**20:.1f} MiB, ratio {e / p:.3f}"
      + ("" if e >= p else " (BELOW the peak: the CUDA libraries' host memory is not counted)"))
PY
  done
  echo
  echo "## The retention lab, segtape on the GPU (--steps 100)"
  echo
  tail -n 20 "$OUT/retention.log" 2>/dev/null | sed 's/^/    /'
  echo
  echo "## Summary log"
  echo
  sed 's/^/    /' "$SUMMARY"
} >"$OUT/results.md"

log "done in ${SECONDS} s: $( ((status == 0)) && echo 'all checks passed' || echo 'SOME CHECKS FAILED') (results.md)"
exit $status
