// The B = 1 inference floor of the benchmark workload (bench/workload.h:
// GRUCell(32, H) -> Linear(H, 16)): one inference step multiplies one row by
// W_ih [3H, 32], W_hh [3H, H] and the head's W [16, H], so it reads every
// weight once, with one multiply-add each, and no two steps can share a
// read (step t + 1 needs step t's state). At H = 128 that is 254 KB, more
// than the L1 cache of any x86 core and less than its L2: the step cannot be
// faster than reading 254 KB from L2 once. This program measures that read:
// the weights' floats in one 64-byte aligned array, summed into 64 lanes of
// multiply-adds (the FMA chains of a product, vectorised by the compiler),
// passes over it back to back (so it sits in L2, as between steps).
//   build-bench/bench/read_floor [--hidden 128] [--samples 31]
// Prints the bytes, and microseconds per pass and GB/s as the median (min-max)
// of the samples (each the mean of 2,000 passes, after 2,000 warm-up passes).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "workload_data.h"  // kI, kC

namespace {
constexpr int kLanes = 64;
constexpr int kPasses = 2000;

// Sum of w[i] * x over the array in kLanes chains (n a multiple of kLanes).
float pass(const float* __restrict w, size_t n, float x) {
  float acc[kLanes] = {};
  for (size_t i = 0; i < n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += w[i + size_t(k)] * x;
  float s = 0;
  for (float a : acc) s += a;
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  using segtape::bench::kC;
  using segtape::bench::kI;
  long H = 128, samples = 31;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (a == "--hidden") H = v;
    else if (a == "--samples") samples = v;
    else {
      std::fprintf(stderr, "usage: read_floor [--hidden N] [--samples N]\n");
      return 2;
    }
  }
  if (H < 1 || samples < 1 || argc % 2 == 0) {
    std::fprintf(stderr, "read_floor: --hidden and --samples take positive integers\n");
    return 2;
  }
  const size_t floats = size_t(3 * H * kI + 3 * H * H + kC * H);
  const size_t n = (floats + kLanes - 1) / kLanes * kLanes;
  auto* w = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  if (!w) return 1;
  for (size_t i = 0; i < n; ++i) w[i] = i < floats ? 1e-3f * float(i % 97) : 0.0f;
  volatile float sink = 0;
  float x = 1.0f;
  for (int p = 0; p < kPasses; ++p) sink = sink + pass(w, n, x);
  std::vector<double> us;
  for (long s = 0; s < samples; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int p = 0; p < kPasses; ++p) x = 1.0f + 1e-30f * pass(w, n, x);  // (each pass depends on the last)
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kPasses);
  }
  sink = sink + x;
  std::free(w);
  std::sort(us.begin(), us.end());
  const double med = us[us.size() / 2];
  const double bytes = double(floats * sizeof(float));
  std::printf("hidden %ld: W_ih, W_hh and the head's W, %.0f bytes; one read %.3f us (%.3f-%.3f), %.1f GB/s (%.1f-%.1f)\n", H,
              bytes, med, us.front(), us.back(), bytes / med / 1e3, bytes / us.back() / 1e3, bytes / us.front() / 1e3);
  return 0;
}
