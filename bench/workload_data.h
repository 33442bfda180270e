// The benchmark workload's sizes and inputs (bench/workload.h), on their own:
// they need nn::Rng only, which is header-only here, so a program that links
// no segtape library (cuda_bench_torch) draws the same inputs.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "segtape/nn/random.h"

namespace segtape::bench {

inline constexpr int64_t kI = 32, kC = 16, kK = 32;

// Deterministic inputs shared by both engines: x [K, B, I], y [K, B].
struct Data {
  int64_t B;
  std::vector<float> x;
  std::vector<int64_t> y;
  explicit Data(int64_t b) : B(b), x(size_t(kK * b * kI)), y(size_t(kK * b)) {
    nn::Rng rng(11);
    for (float& v : x) v = float(rng.uniform(-1, 1));
    for (int64_t& v : y) v = int64_t(rng.next_u64() % uint64_t(kC));
  }
  std::span<const float> xt(int64_t t) const { return std::span<const float>(x).subspan(size_t(t * B * kI), size_t(B * kI)); }
  std::span<const int64_t> yt(int64_t t) const { return std::span<const int64_t>(y).subspan(size_t(t * B), size_t(B)); }
};

}  // namespace segtape::bench
