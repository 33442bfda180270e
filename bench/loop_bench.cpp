// The benchmark workload's training loop (bench/workload.h: GRUCell(32, H) ->
// Linear(H, 16) -> cross-entropy, Adam, K = 32 steps per segment) in C++, timed
// as a user runs it: bench/python_bench.py runs this program and the same loop
// written in Python in turn and compares them.
//   build/bench/loop_bench [--batch 1] [--hidden 128] [--segments 200] [--infer 1]
// Prints one number: microseconds per training step (with --infer 1: per
// inference step, the same forward under no-grad) over the timed segments
// (after 10 warm-up segments). docs/figures/callgrind-step.sh runs it under
// callgrind to count instructions per step.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "workload.h"

int main(int argc, char** argv) {
  using namespace segtape::bench;
  int64_t B = 1, H = 128, segments = 200, infer = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--batch") B = v;
    else if (a == "--hidden") H = v;
    else if (a == "--segments") segments = v;
    else if (a == "--infer") infer = v;
    else {
      std::fprintf(stderr, "usage: loop_bench [--batch N] [--hidden N] [--segments N] [--infer 0|1]\n");
      return 2;
    }
  }
  if (B < 1 || H < 1 || segments < 1 || infer < 0 || infer > 1 || argc % 2 == 0) {
    std::fprintf(stderr, "loop_bench: --batch, --hidden and --segments take positive integers, --infer 0 or 1\n");
    return 2;
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
