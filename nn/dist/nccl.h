// segtape::dist internal: NCCL for CUDA tapes (nccl.cpp, compiled when CMake
// found NCCL with the CUDA backend; otherwise nccl_stub.cpp). The all-reduce
// is enqueued on the tape's own stream (Tape::native_stream), in order with
// the backward before it and the optimizer step after it, with no host wait:
// a segment with its all-reduce stays one stream of work, as CUDA graph
// capture needs.
#pragma once
#include <cstddef>
#include <memory>
#include <span>

#include "segtape/nn/dist.h"

namespace segtape::dist::detail {

class Nccl {
 public:
  static bool built();
  // One NCCL communicator over the ranks of `c` (rank 0's unique id is
  // broadcast through c) on CUDA device `device`, for work on `stream`.
  static std::unique_ptr<Nccl> make(Communicator& c, void* stream, int device);
  virtual ~Nccl() = default;
  // In place: buffer i (counts[i] floats, device memory) = its sum over the
  // ranks. One NCCL group: NCCL fuses the calls.
  virtual void sum(std::span<float* const> buffers, std::span<const size_t> counts) = 0;
};

}  // namespace segtape::dist::detail
