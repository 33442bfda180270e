// Engine-internal: the tape's operations for the ops and backends — not part
// of the public Tape. Tape declares them private and befriends this class;
// only engine sources include this header. Engine code calls them as
// In::alloc(tape, ...), with `using In = detail::TapeInternals;`.
#pragma once
#include <span>
#include <string>

#include "segtape/tape.h"

namespace segtape::detail {

// Whether bytes [a, a + an) and [b, b + bn) share one (the packed copies'
// staleness, backward's refusal of a write into what it reads).
inline bool bytes_overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

class TapeInternals {
 public:
  // Segment arena bytes for op `op` (kind: whose bytes they are in the budget report).
  static void* alloc(Tape& t, size_t bytes, OpKind kind, const char* op) { return t.alloc(bytes, kind, op); }
  static void* alloc(Tape& t, size_t bytes, GradBuffers g, const char* op) { return t.alloc(bytes, g, op); }
  // An uninitialised tensor in the open segment.
  static Tensor make(Tape& t, const Shape& s, DType d, OpKind kind, const char* op) { return t.make(s, d, kind, op); }
  // Whether an op over these inputs records its node: grad enabled and any input requiring grad.
  static bool wants_grad(const Tape& t, std::span<const Tensor> inputs) { return t.wants_grad(inputs); }
  // Appends the filled node n to the tape; its out becomes the recorded output.
  static Node& record(Tape& t, const Node& n) { return t.record(n); }
  static void check_output(Tape& t, const Tensor& out, OpKind k) { t.check_output(out, k); }  // anomaly mode
  // Per-op workspace outside the segment arena (reset by every op; grows once, then reused).
  static void* scratch(Tape& t, size_t bytes) { return t.scratch(bytes); }
  static void scratch_reset(Tape& t) { t.scratch_reset(); }
  static Backend* backend(const Tape& t) { return t.backend_.get(); }
  static void fill_zero(Tape& t, void* p, size_t bytes) { t.fill_zero(p, bytes); }
  static std::string expired_message(const Tape& t, const Tensor& x, const char* what) { return t.expired_message(x, what); }
  static bool is_live(const Tape& t, const Tensor& x) { return t.is_live(x); }
  static void note_write(Tape& t, const void* p, size_t bytes, const char* by) { t.note_write(p, bytes, by); }
  // Device memory: fixed pools the host does not touch (CUDA, the host-emulated device).
  static bool device_pools(const Tape& t) { return t.device_pools(); }
  static void count_host_read(Tape& t) { ++t.host_reads_; }
};

}  // namespace segtape::detail
