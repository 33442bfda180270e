// Engine-internal: FNV-1a (64-bit), the engine's one hash: the replay
// driver's check of recomputed states (replay.cpp), and the CUDA backend's
// signatures of what a graph segment issues (cuda/backend.cpp, op_table.cpp).
#pragma once
#include <cstdint>

namespace segtape::detail {

inline constexpr uint64_t kFnvOffset = 14695981039346656037ull;
inline void fnv_mix(uint64_t& h, uint64_t v) { h = (h ^ v) * 1099511628211ull; }

}  // namespace segtape::detail
