// Engine-internal: the replay driver's boundary check where the state lives
// (replay::Options::verify_on_device), written once for the host form and
// the CUDA kernels (engine/cuda/replay_kernels.cu). Compiled by g++ (C++20)
// and nvcc (C++17).
//
// checks (int64 [2 nb + 4], nb the window's boundaries): boundary b's hash
// at 2 b and 1 at 2 b + 1 once it is known this window; then the first
// mismatch, [2 nb] = its segment + 2 (0: none), [2 nb + 1] and [2 nb + 2]
// the segment's first and last step; [2 nb + 3] the hash being summed.
//
// A state's hash is the sum, modulo 2^64, of a mix of each 32-bit word with
// its index: the same for any order of the sum (the device adds with
// atomics), and any change of a word changes it but with a chance of 2^-64.
#pragma once
#include <cstdint>

#include "hd.h"

namespace segtape::replay::check {

SEGTAPE_HD uint64_t word_hash(uint64_t index, uint32_t word) {
  uint64_t z = (index + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t(word) << 17 | word);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// After the sum: boundary b's hash remembered (the first time this window)
// or compared, the first mismatch kept (segment u, steps [begin, end)).
SEGTAPE_HD void settle(int64_t* checks, int64_t nb, int64_t b, int64_t u, int64_t begin, int64_t end) {
  const int64_t v = checks[2 * nb + 3];
  if (!checks[2 * b + 1]) {
    checks[2 * b] = v, checks[2 * b + 1] = 1;
    return;
  }
  if (checks[2 * b] != v && checks[2 * nb] == 0) checks[2 * nb] = u + 2, checks[2 * nb + 1] = begin, checks[2 * nb + 2] = end;
}

// Forgets boundary b's hash (b < 0: every boundary's), for a new window.
SEGTAPE_HD void forget(int64_t* checks, int64_t nb, int64_t b) {
  if (b >= 0) {
    checks[2 * b + 1] = 0;
    return;
  }
  for (int64_t i = 0; i < nb; ++i) checks[2 * i + 1] = 0;
}

}  // namespace segtape::replay::check
