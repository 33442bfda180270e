// The benchmark workload's training loop (bench/workload.h: GRUCell(32, H) ->
// Linear(H, 16) -> cross-entropy, Adam, K = 32 steps per segment) in C++, timed
// as a user runs it: bench/python_bench.py runs this program and the same loop
// written in Python in turn and compares them.
//   build/bench/loop_bench [--batch 1] [--hidden 128] [--segments 200] [--infer 1] [--gemv auto|on|off] [--packed best|avx2|off]
// --gemv and --packed set segtape's kernel switches (segtape/kernels.h: GEMV
// or GEMM for one-row products; the packed GRU weight products or OpenBLAS).
// Prints one number: microseconds per training step (with --infer 1: per
// inference step, the same forward under no-grad) over the timed segments
// (after 10 warm-up segments). `loop_bench --kernels 1` prints the CPU kernels
// instead, OpenBLAS's and segtape's packed one (`openblas Zen`, `packed avx2`).
// docs/figures/callgrind-step.sh runs it under callgrind to count
// instructions per step.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "segtape/blas.h"
#include "segtape/error.h"
#include "segtape/kernels.h"
#include "workload.h"

int main(int argc, char** argv) {
  using namespace segtape::bench;
  int64_t B = 1, H = 128, segments = 200, infer = 0, kernels = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--gemv" || a == "--packed") {
      try {
        segtape::kernels::set_option(a.substr(2), argv[i + 1]);
      } catch (const segtape::Error& e) {
        std::fprintf(stderr, "loop_bench: %s\n", e.what());
        return 2;
      }
    } else if (a == "--batch") B = v;
    else if (a == "--hidden") H = v;
    else if (a == "--segments") segments = v;
    else if (a == "--infer") infer = v;
    else if (a == "--kernels") kernels = v;
    else {
      std::fprintf(stderr, "usage: loop_bench [--batch N] [--hidden N] [--segments N] [--infer 0|1] [--kernels 1] "
                           "[--gemv auto|on|off] [--packed best|avx2|off]\n");
      return 2;
    }
  }
  if (B < 1 || H < 1 || segments < 1 || infer < 0 || infer > 1 || argc % 2 == 0) {
    std::fprintf(stderr, "loop_bench: --batch, --hidden and --segments take positive integers, --infer 0 or 1\n");
    return 2;
  }
  if (kernels) {
    std::printf("openblas %s\npacked %s\n", segtape::blas_kernels().c_str(), segtape::packed_kernel().c_str());
    return 0;
  }
  const Data data(B);
  SegtapeModel model(B, H, data);
  auto segment = [&] { infer ? model.infer_segment() : model.train_segment(); };
  for (int s = 0; s < 10; ++s) segment();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < segments; ++s) segment();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%.3f\n", us / double(segments * kK));
  return 0;
}
