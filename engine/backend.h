// Engine-internal: the one interface between the tape and the ops on one
// side and a device on the other. Every tape has a backend: the CPU's
// (engine/cpu/backend.cpp, also the host-emulated device) or CUDA's
// (engine/cuda/backend.cpp, made by make_cuda_backend(); a build without CUDA
// links engine/cuda/stub.cpp instead, whose make_cuda_backend() raises).
// Public headers only forward-declare this class: no CUDA type and no #ifdef
// on CUDA leaves engine/cuda/.
//
// Contract of forward / backward: they compute the op of the node (its
// inputs, attributes and saved buffer, engine/ops/op.h) with the formulas of
// its family in engine/ops/, asynchronously on a device's stream.
// Backward accumulates (+=) into dst[j].
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "segtape/device_call.h"
#include "segtape/tape.h"
#include "segtape/update.h"

namespace segtape::detail {

class Backend {
 public:
  enum class Copy : uint8_t { HostToDevice, DeviceToHost, DeviceToDevice };

  virtual ~Backend() = default;

  // Device memory (CUDA, the host-emulated device): every pool is one fixed
  // allocation made with the tape, and the host does not touch it directly.
  // False on the CPU: host memory, pools grow in chunks.
  virtual bool device_memory() const { return true; }
  // Whether forward computes OpKind::GruSequence as one node (CUDA: cuDNN or
  // the fused kernels; with keep or Precision::Bf16 only where
  // gru_sequence_keeps); where not, gru_sequence() composes gru_cell steps.
  virtual bool has_gru_sequence() const { return false; }
  // Whether the gru_sequence node takes per-stream resets (`keep`) for a
  // [B, H] state of dtype d; where not, the op composes gru_cell steps.
  virtual bool gru_sequence_keeps(int64_t /*B*/, int64_t /*H*/, DType /*d*/) { return false; }
  // gru_sequence_path's words for such a node (segtape/ops.h).
  virtual std::string gru_sequence_path(int64_t /*B*/, int64_t /*H*/, DType /*d*/) {
    return "gru_cell steps (this device has no fused GRU kernels)";
  }

  // Chunk allocator for one of the tape's pools (`what` names the pool and
  // the option that sizes it, for the out-of-memory message).
  virtual ChunkAllocator allocator(const char* what) = 0;

  // ---- the op table. n.out is allocated; n.in, n.ia, n.fa, n.saved as recorded.
  // forward may allocate in the segment arena (tape.alloc) and then sets
  // n.saved and adds the bytes to n.bytes (GruSequence's cuDNN buffers; a
  // GruSequence node enters forward with n.saved = its keep's bytes or null,
  // engine/ops/gru.cpp, and leaves with its own buffers there).
  virtual void forward(Tape& tape, Node& n) = 0;
  virtual void backward(Tape& tape, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst) = 0;
  // A backward's walk over nodes [0, last_node] of the tape: backward_begin
  // before the first node's backward (the roots' gradients are seeded),
  // backward_end after the last (not when a node's backward raised). For
  // work a backend spreads over a backward's nodes: the CPU batches the GRU
  // weight gradients of consecutive steps (TapeOptions::batch_weight_grads)
  // and packs the GRU weights once per pass.
  virtual void backward_begin(Tape& /*tape*/, int64_t /*last_node*/) {}
  virtual void backward_end(Tape& /*tape*/) {}

  // ---- memory. Stream-ordered; DeviceToHost waits for the stream and
  // raises what the device recorded (an index out of range) before returning.
  virtual void copy(void* dst, const void* src, size_t bytes, Copy kind) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void fill(void* dst, int64_t n, DType d, double value) = 0;
  // Index of the first NaN / Inf of a floating tensor (-1: none) and its
  // value; waits for the stream (anomaly mode).
  virtual std::pair<int64_t, double> first_nonfinite(const Tensor& t) = 0;
  // Waits for the stream; raises errors the device recorded.
  virtual void synchronize() = 0;
  // Bytes [p, p + bytes) of a tensor were written, or handed out to be
  // written (detail::tensor_written): what the backend made from them is
  // stale (the CPU's packed copies of GRU weights).
  virtual void bytes_written(const void* /*p*/, size_t /*bytes*/) {}

  // ---- parameter updates (segtape/update.h), in place on the stream, with
  // the arithmetic of update_math.h. g, buf: device pointers (buf nullable).
  virtual void sgd_step(DType d, int64_t n, void* p, const void* g, void* buf, const SgdOptions& s, bool first) = 0;
  // step_at: null, or the step count as one double where the tensors live
  // (the capturable adam_step), read there instead of `step`.
  virtual void adam_step(DType d, int64_t n, void* p, const void* g, void* m, void* v, const AdamOptions& s, bool decoupled,
                         int64_t step, const double* step_at) = 0;
  virtual void scale(void* x, int64_t n, DType d, double factor) = 0;  // x *= factor
  virtual void add_scalar(void* x, int64_t n, DType d, double value) = 0;  // x += value
  // Sum of x[i]^2 accumulated in double; waits for the stream.
  virtual double sum_squares(const void* x, int64_t n, DType d) = 0;
  // The capturable clip (no host read): *acc (a double where x lives) =
  // (first ? 0 : *acc) + sum of x[i]^2 in double; and x *= T(c) with
  // c = max_norm / (sqrt(*sum_sq) + 1e-6) where !(c >= 1) (NaN included).
  virtual void add_sum_squares(const void* x, int64_t n, DType d, double* acc, bool first) = 0;
  virtual void clip_scale(void* x, int64_t n, DType d, const double* sum_sq, double max_norm) = 0;

  // A device function of a library above the engine (segtape/device_call.h),
  // in the stream's order; the CPU and the host-emulated device run its host form.
  virtual void device_call(const DeviceFunction& fn, const CallArgs& a) = 0;

  // ---- segment boundaries: CUDA-graph capture and replay (TapeOptions::graph_replay).
  // graph = false: tape.eager_segment() (runs eagerly, the graphs kept);
  // slot: tape.graph_segment(slot)'s (GraphSchedule::kSlots).
  virtual void segment_begin(uint32_t index, bool graph, unsigned slot) = 0;
  // Must not throw (it runs from ~Segment); an error is kept and raised by
  // the next segment_begin() or synchronize(). abandoned: the segment is
  // ending because an exception is unwinding through it.
  virtual void segment_end(bool abandoned) noexcept = 0;
  virtual void discard_graph() = 0;
  // Segments captured and replayed so far (0, 0 without graph replay).
  virtual std::pair<uint64_t, uint64_t> graph_counts() const = 0;

  // Bytes this tape holds on the device besides its arenas (cuBLAS workspace,
  // the backend's own op workspace), and a one-line description of the device.
  virtual size_t internal_device_bytes() const = 0;
  virtual std::string describe() const = 0;
  // Host workspace the backend keeps across segments (reserved bytes, in
  // TapeStats::workspace_bytes): the CPU's GRU batch and packed weights.
  virtual size_t workspace_bytes() const { return 0; }
  // The CUDA stream (cudaStream_t) the device work is ordered on: for
  // libraries that issue work of their own in that order (NCCL's all-reduce,
  // segtape/nn/dist.h). nullptr on the CPU and the host-emulated device.
  virtual void* native_stream() const { return nullptr; }
};

// Defined by engine/cuda/backend.cpp in a CUDA build and by engine/cuda/stub.cpp
// otherwise. Raises a segtape::Error when no GPU can be used, saying why.
std::unique_ptr<Backend> make_cuda_backend(const Device& device, const TapeOptions& options);

// engine/cpu/backend.cpp: the CPU, and the host-emulated device (segtape/emulation.h).
std::unique_ptr<Backend> make_cpu_backend(const Device& device, const TapeOptions& options);
std::unique_ptr<Backend> make_host_emulated_backend(const Device& device, const TapeOptions& options);

}  // namespace segtape::detail
