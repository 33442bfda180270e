// FNV-1a (64-bit): segtape's one non-cryptographic hash. The engine's replay
// driver checks recomputed states with it (replay.cpp), graph replay signs
// what a segment issues (graph_schedule.cpp), and segtape::dist compares the
// ranks' parameters (parameter_checksum).
//
//   uint64_t h = fnv::kOffset;
//   fnv::mix(h, word);                         // one 64-bit value
//   h = fnv::bytes(p, n, h);                   // n bytes, one at a time
#pragma once
#include <cstddef>
#include <cstdint>

namespace segtape::fnv {

inline constexpr uint64_t kOffset = 14695981039346656037ull;  // the offset basis
inline constexpr uint64_t kPrime = 1099511628211ull;

// h <- (h ^ v) * prime: one value mixed in (a byte, or a whole 64-bit word).
constexpr void mix(uint64_t& h, uint64_t v) noexcept { h = (h ^ v) * kPrime; }

// FNV-1a of n bytes at p, continuing from h (kOffset: a fresh hash).
inline uint64_t bytes(const void* p, size_t n, uint64_t h = kOffset) noexcept {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) mix(h, b[i]);
  return h;
}

}  // namespace segtape::fnv
