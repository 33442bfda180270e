// Tape and segments: the heart of segtape.
//
//   Tape tape(Device::cpu(), {.segment_budget = 64 << 20});
//   for (...) {
//     Segment seg = tape.segment();   // boundary: arena reset, old handles expire
//     ... ops record nodes into the flat tape, tensors into the arena ...
//     seg.backward(loss);             // gradients accumulate into parameters
//     h = seg.carry(h);               // value kept, history cut (TBPTT boundary)
//   }
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "segtape/arena.h"
#include "segtape/precision.h"
#include "segtape/op_list.h"
#include "segtape/tensor.h"

namespace segtape {

// One kind per line of segtape/op_list.h, in its order.
enum class OpKind : uint8_t {
#define SEGTAPE_ENUM(name) name,
  SEGTAPE_OPS(SEGTAPE_ENUM)
#undef SEGTAPE_ENUM
  Count
};
inline constexpr size_t kOpKinds = size_t(OpKind::Count);
const char* op_name(OpKind k);

// One recorded op. Plain data: no std::function, no heap of its own.
struct Node {
  static constexpr int kMaxInputs = 6;
  static constexpr uint8_t kReadsOut = 1 << kMaxInputs;
  static constexpr uint8_t kReadsAll = (1 << (kMaxInputs + 1)) - 1;
  OpKind op = OpKind::Input;
  uint8_t n_in = 0;
  bool released = false;   // a non-retained backward processed it (its saved state is spent)
  // The operands its backward reads: bit j for in[j], kReadsOut for out. A
  // write into those bytes after the node is recorded makes its gradient
  // wrong, so backward refuses it (Tape::check_reached). Set by the op.
  uint8_t reads = kReadsAll;
  uint32_t step = 0;       // tape step when recorded
  size_t bytes = 0;        // arena bytes this op allocated (output + saved)
  Tensor out;
  std::array<Tensor, kMaxInputs> in;
  void* saved = nullptr;   // extra buffer backward needs (e.g. GRU gates; gru_sequence's keep until the backend's forward)
  std::array<int64_t, 4> ia{};  // integer attributes (axis, flags, ...)
  double fa = 0;                // float attribute (scale factor, ...)
};

// The name a tape's segment arena has in messages and in
// OutOfMemoryError::pool.
inline constexpr const char* kSegmentArenaPool = "segment arena (TapeOptions::segment_budget)";

struct TapeOptions {
  size_t segment_budget = size_t(64) << 20;  // arena bytes per segment
  // Teaching policy: the arena grows in chunks instead of refusing, to
  // reproduce PyTorch's retained-graph growth on purpose. grow_limit (bytes,
  // 0 = none) then plays the role of the budget.
  bool grow = false;
  size_t grow_limit = 0;
  size_t persistent_chunk = size_t(1) << 20;
  size_t carry_chunk = size_t(256) << 10;
  // Tape nodes reserved up front (at most what the budget can hold). Nodes
  // count against the segment budget (sizeof(Node) each); the array grows,
  // within the budget, when a segment records more.
  size_t node_capacity = 4096;
  // How budget errors name the budget: the option a user sets (the CLI
  // passes "--budget"). nullptr: "TapeOptions::segment_budget" (or
  // "TapeOptions::grow_limit" under the teaching policy).
  const char* budget_name = nullptr;
  bool anomaly = false;         // check every op's output for NaN / Inf
  // Backward accumulates the weight gradients of GRU cells sharing weights as
  // one GEMM over many steps' rows (chunks of max(128, H) rows) instead of one per
  // step: a segment knows its extent, an eager engine does not. CPU only: on
  // CUDA each gru_cell's backward makes its own weight GEMMs (a GRU layer is
  // one gru_sequence there, whose cuDNN backward covers the whole sequence).
  bool batch_weight_grads = true;
  // Precision::Bf16: every matrix product (matmul, the GRU and LSTM cells'
  // products; forward and backward) reads its float32 operands rounded to
  // bfloat16, accumulates in float32 and rounds its product to bfloat16, as
  // PyTorch's autocast does; the rest (the recurrent state, elementwise ops,
  // reductions, losses, gradient sums, the optimizer on float32 master
  // weights) stays float32. The CPU and the host-emulated device hold the
  // rounded values in float32 storage (no memory saved); a CUDA tape refuses
  // it (not built yet). The products run on OpenBLAS: batch_weight_grads
  // and packed weights (float32 kernels of segtape's own) are off under it,
  // and the rounded copies of the largest product's operands (and of a
  // product added into a gradient) are kept (TapeStats::workspace_bytes)
  // until the tape is destroyed.
  // segtape/precision.h, docs/precision.md.
  Precision precision = Precision::F32;

  // ---- CUDA tapes (Device::cuda()); ignored on the CPU. Every pool is one
  // device allocation made when the tape is made, sized here, and never
  // grows: a segment runs at the same addresses every time (docs/cuda.md).
  // The segment arena is segment_budget bytes; `grow` is CPU-only.
  size_t device_persistent = size_t(256) << 20;  // parameters, gradients, optimizer state
  size_t device_carry = size_t(16) << 20;        // each of the two carry buffers
  size_t device_workspace = size_t(64) << 20;    // op workspace (and as much again for the backend's own)
  // Let cuBLAS / cuDNN use TF32 tensor cores for float32 (faster, ~1e-3
  // relative error). Off: float32 products are computed in float32.
  bool allow_tf32 = false;
  // Segment 1 runs eagerly, segments 2 and 3 are captured as CUDA graphs
  // (one per parity: carried values alternate between two buffers), and
  // every later segment replays the graph of its parity; it must repeat that
  // segment's ops, shapes and scalar attributes. Values of a graph segment
  // exist only once it has ended: no item() / to_host() inside one. See
  // docs/cuda.md for the restrictions.
  bool graph_replay = false;
  // With graph_replay: segment() runs eagerly as eager_segment() does, and
  // only graph_segment() is captured and replayed. For a program whose
  // segments mostly cannot be graphs (host reads, shapes that change) with
  // a few that can (PPO's rollout on the device, agent/device/).
  bool graph_explicit = false;
  size_t graph_staging = size_t(4) << 20;  // pinned host bytes per segment for tape.from() under graph_replay
};

struct TapeStats {
  size_t live_bytes = 0;         // arena bytes in use in the current segment
  size_t peak_bytes = 0;         // high-water of the current segment
  size_t last_segment_peak = 0;  // high-water of the last ended segment
  size_t node_count = 0;         // nodes on the tape now
  size_t node_bytes = 0;         // their bytes (node_count * sizeof(Node)), counted in the segment budget
  size_t node_peak_bytes = 0;    // high-water of node_bytes in the current (or last) segment
  size_t persistent_bytes = 0;   // persistent pool bytes in use
  size_t carry_bytes = 0;        // carry buffers in use
  size_t workspace_bytes = 0;    // op workspace, backward's batching buffers, packed weights, bf16's rounded copies (reserved, reused)
  size_t grad_bytes = 0;         // arena bytes of backward's gradient buffers in the current segment (in no op's bytes_by_op)
  uint64_t system_allocations = 0;  // chunks taken from the system, all arenas, process-wide
  uint64_t segment_index = 0;    // 1 for the first segment
  uint64_t step = 0;             // tape step counter
  std::array<size_t, kOpKinds> bytes_by_op{};  // arena bytes of the current segment by op kind
  size_t device_bytes = 0;           // CUDA: bytes this tape holds on the device (all pools, fixed at setup)
  uint64_t device_allocations = 0;   // device chunks taken, process-wide (memory::device_allocations())
  uint64_t graph_captures = 0;       // graph replay: segments captured as CUDA graphs so far
  uint64_t graph_replays = 0;        // graph replay: segments that replayed a captured graph so far
  uint64_t host_reads = 0;           // reads into host memory so far (to_host, item, and grad_squared_norm's sum of
                                     // squares for a norm or the non-finite scan): each waits for the device
};

class Segment;

// Allocation tag of backward's gradient buffers (TapeStats::grad_bytes): arena
// bytes that belong to no op.
struct GradBuffers {};

// One term of a seeded backward: the objective's gradient with respect to
// `out` (a tensor of the segment), e.g. dL/dh at the state leaving it, handed
// back by the segment after it.
struct Seed {
  Tensor out;
  Tensor grad;  // out's shape and dtype
};

namespace detail {
class TapeInternals;  // engine/tape_internals.h
class Backend;    // engine/backend.h: the CPU's, CUDA's or the host-emulated device's
struct FreeList;  // engine/tape.cpp
}

class Tape {
 public:
  explicit Tape(Device device = Device::cpu(), TapeOptions options = {});
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // Opens a segment. Only one may be open at a time.
  Segment segment();
  // Opens a segment that runs eagerly under TapeOptions::graph_replay: it is
  // neither captured nor replayed, and the captured graphs and the schedule
  // stay as they were (the next segment() replays or captures as if this one
  // had not run; it does not count as the warm-up). For work of another shape
  // between graph segments: an evaluation, a shorter last segment, host reads.
  // Without graph replay (and on the CPU) the same as segment().
  Segment eager_segment();
  // A segment that is captured and replayed under graph_replay (as
  // segment() is, unless TapeOptions::graph_explicit); without graph
  // replay, and on the CPU, the same as segment(). slot (0 or 1): a program
  // with two patterns of graph segments (PPO's rollout and its update's
  // windows) gives each its own, whose two graphs are kept apart from the
  // other's; a segment replays its slot's graph of its parity.
  Segment graph_segment(unsigned slot = 0);

  // Persistent tensors (valid as long as the tape). Zero-filled.
  Tensor parameter(const Shape& s, DType d = DType::F32);   // requires grad; gradient buffer zeroed
  Tensor persistent(const Shape& s, DType d = DType::F32);  // no gradient
  // Tensors in the open segment.
  Tensor empty(const Shape& s, DType d = DType::F32);
  Tensor zeros(const Shape& s, DType d = DType::F32);
  Tensor from(std::span<const float> v, const Shape& s);
  Tensor from(std::span<const double> v, const Shape& s);
  Tensor from(std::span<const int64_t> v, const Shape& s);

  // Steps only label tensors and nodes (for messages and reports).
  void next_step() { ++step_; }
  uint64_t step() const { return step_; }
  bool grad_enabled() const { return grad_enabled_; }
  bool segment_open() const { return open_; }
  uint32_t segment_index() const { return seg_index_; }
  const Device& device() const { return device_; }
  const TapeOptions& options() const { return options_; }
  TapeStats stats() const;
  const std::vector<Node>& nodes() const { return nodes_; }
  void set_anomaly(bool on);
  // CUDA: waits until the device has done everything issued so far and raises
  // what it recorded (an index out of range). A no-op on the CPU.
  void synchronize();
  // CUDA graph replay: forget the captured graphs; the next segment runs
  // eagerly and the two after it are captured again (e.g. after a change of shape).
  void discard_graph();

  // Zero every parameter gradient made by this tape.
  void zero_grad();
  // The CUDA stream (a cudaStream_t) this tape's device work is ordered on,
  // for a library that issues its own work in that order (NCCL's all-reduce
  // in segtape/nn/dist.h); nullptr on the CPU and the host-emulated device.
  void* native_stream() const;

 private:
  friend class Segment;
  friend class detail::TapeInternals;  // engine/tape_internals.h: what the ops and backends use
  Segment open_segment(bool graph, unsigned slot = 0);  // segment(), eager_segment() and graph_segment()
  void* alloc(size_t bytes, OpKind kind, const char* op);
  void* alloc(size_t bytes, GradBuffers, const char* op);
  // Both allocs: arena bytes, counted in `counted` (kind names them in a budget report).
  void* segment_alloc(size_t bytes, const char* kind, const char* op, size_t& counted);
  Tensor make(const Shape& s, DType d, OpKind kind, const char* op);  // uninitialised, in the segment
  bool wants_grad(std::span<const Tensor> inputs) const;
  Node& record(const Node& n);
  void check_output(const Tensor& out, OpKind k);
  void* scratch(size_t bytes);
  void scratch_reset() { scratch_.reset(); }
  void fill_zero(void* p, size_t bytes);
  std::string expired_message(const Tensor& t, const char* what) const;
  bool is_live(const Tensor& t) const;
  bool device_pools() const;
  friend class NoGradGuard;
  void end_segment(bool abandoned = false);
  // loss (optional, one element) and seeds; at least one of them.
  void backward(const Tensor* loss, std::span<const Seed> seeds, bool retain, bool allow_overwritten);
  void check_reached(size_t count, bool check_writes);
  void refuse_overwritten(size_t i, const Node& n) const;  // check_reached's write check of node i
  // Bytes [p, p + bytes) were written (by: the function that wrote them):
  // logged while the open segment has recorded nodes, for check_reached.
  void note_write(const void* p, size_t bytes, const char* by);
  Tensor carry(const Tensor& x);
  Tensor input(const Tensor& x);
  Tensor input_grad(const Tensor& leaf);
  // kind: whose bytes were asked for (an op's name, or "Grad" for backward's buffers).
  std::string budget_report(size_t request, const char* kind, const char* op) const;
  const char* budget_name() const;
  Tensor persistent_alloc(const Shape& s, DType d);

  Device device_;
  TapeOptions options_;
  std::unique_ptr<detail::Backend> backend_;  // made before the arenas, which take its memory
  Arena arena_;
  Arena pool_;
  Arena carry_[2];
  Arena scratch_;
  std::vector<Node> nodes_;
  std::array<size_t, kOpKinds> bytes_by_op_{};
  size_t grad_bytes_ = 0;  // backward's gradient buffers in the open segment
  std::vector<Tensor> params_;  // every parameter made (for zero_grad)
  std::unique_ptr<detail::FreeList> free_;  // backward's dead gradient buffers
  std::vector<void*> grad_table_;  // device tapes: backward's node -> gradient table (the CPU keeps it in the arena)
  // The open segment's input() leaves: node index, and the gradient buffer
  // backward keeps for it (in the arena; nullptr until a backward reaches it).
  std::vector<std::pair<int32_t, void*>> leaf_grads_;
  uint32_t seg_index_ = 0;
  uint64_t step_ = 0;
  uint64_t seg_first_step_ = 0;  // the step at which the open segment opened
  size_t node_peak_ = 0;         // node bytes high-water of the current / last segment
  bool released_any_ = false;  // some node of the segment was released (Node::released)
  std::vector<uint8_t> reach_;  // backward after a release or a write: the nodes its roots reach (check_reached)
  // Writes into segment-visible bytes since the open segment recorded its
  // first node: [p, p + bytes), the node count at the time, and the writer.
  struct Write {
    const void* p;
    size_t bytes;
    size_t nodes;
    const char* by;
    uintptr_t reach = 0;  // check_reached: the highest end of this and the writes before it, by address
  };
  std::vector<Write> writes_;
  size_t last_segment_peak_ = 0;
  uint64_t host_reads_ = 0;  // TapeStats::host_reads
  bool open_ = false;
  bool grad_enabled_ = true;
};

struct BackwardOptions {
  bool retain_graph = false;  // allow a second backward through the same nodes
  // Backward refuses an op whose operand (one its backward reads) was
  // written after the op was recorded: the gradient would mix old saved
  // values with new ones (PyTorch's "modified by an inplace operation").
  // true: go through, reading the current values. Only for the Trainer's
  // `--history full`, which exists to show memory growth (docs/agent.md).
  bool allow_overwritten = false;
};

class Segment {
 public:
  Segment(Segment&& o) noexcept : tape_(o.tape_), unwinding_(o.unwinding_) { o.tape_ = nullptr; }
  Segment& operator=(Segment&&) = delete;
  ~Segment() {
    // Ending because an exception unwinds through the segment: a CUDA graph
    // being captured or replayed is dropped instead of launched.
    if (tape_) tape_->end_segment(std::uncaught_exceptions() > unwinding_);
    tape_ = nullptr;
  }

  // d(loss)/d(parameters) accumulated into the parameters' gradient buffers.
  // loss must hold one element; for others pass the output gradient.
  void backward(const Tensor& loss, BackwardOptions o = {});
  void backward(const Tensor& out, const Tensor& grad_out, BackwardOptions o = {});
  // Seeded backward: the objective is loss (if given) plus the terms whose
  // gradients the seeds give, e.g. the state leaving the segment with dL/dh
  // from the segment after it (exact BPTT across boundaries, docs/design.md):
  //   seg.backward(loss, {{h_out, dh}});
  // Each seeded tensor must belong to this segment and have history; no
  // tensor may be seeded twice.
  void backward(const Tensor& loss, std::initializer_list<Seed> seeds, BackwardOptions o = {});
  void backward(std::initializer_list<Seed> seeds, BackwardOptions o = {});
  void backward(const Tensor* loss, std::span<const Seed> seeds, BackwardOptions o = {});
  // The dual of carry: a leaf of this segment over x's values (the same
  // bytes, no copy, no history) whose gradient backward keeps, for grad().
  // x: any live floating tensor (a carried or stored state, a persistent
  // tensor). Raises under NoGradGuard (nothing would be recorded).
  Tensor input(const Tensor& x);
  // The gradient the backward passes of this segment accumulated for an
  // input() leaf (zeros where nothing reached it): a tensor of this segment,
  // e.g. dh = seg.carry(seg.grad(h_in)) hands dL/dh_in to the segment before.
  Tensor grad(const Tensor& leaf);
  // x's value copied out of the arena, with no history: the TBPTT boundary.
  // The copy stays valid through the next segment.
  Tensor carry(const Tensor& x);
  void end();  // the destructor calls it; idempotent
  Tape& tape();

 private:
  friend class Tape;
  explicit Segment(Tape* t) : tape_(t), unwinding_(std::uncaught_exceptions()) {}
  Tape* tape_;
  int unwinding_;  // exceptions in flight when the segment opened
};

// Nothing is recorded while a guard is alive (inference, frozen history).
class NoGradGuard {
 public:
  explicit NoGradGuard(Tape& t) : tape_(t), prev_(t.grad_enabled_) { t.grad_enabled_ = false; }
  ~NoGradGuard() { tape_.grad_enabled_ = prev_; }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  Tape& tape_;
  bool prev_;
};

std::string format_bytes(size_t b);

}  // namespace segtape
