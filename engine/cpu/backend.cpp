// The CPU as a backend (engine/backend.h): host memory, OpenBLAS, the op
// families' CPU kernels (engine/ops/). The same class is the host-emulated
// device (segtape/emulation.h): the same computations on pools that are fixed
// allocations of host memory the host may not touch directly, as on a GPU,
// and with TapeOptions::graph_replay the CUDA backend's graph schedule
// (engine/graph_schedule.h): every call still runs at once, but each is
// signed, captured and checked against the capture as on a GPU, and what a
// graph segment cannot do is refused.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend.h"
#include "cpu/blas.h"
#include "graph_schedule.h"
#include "ops/elementwise.h"
#include "ops/op.h"
#include "segtape/emulation.h"
#include "tape_internals.h"
#include "update_math.h"

namespace segtape {
namespace {

std::atomic<bool> g_emulate{false};

void* host_take(void*, size_t bytes, const char* what) {
  void* p = std::aligned_alloc(kAlign, align_up(bytes ? bytes : 1));
  if (!p)
    throw OutOfMemoryError(std::string("host-emulated device: out of host memory reserving the ") + what + " (" +
                               std::to_string(bytes) + " bytes)",
                           what);
  return p;
}
void host_give(void*, void* p) { std::free(p); }

class CpuBackend final : public detail::Backend {
 public:
  // emulated: the host-emulated device (Device::cuda() under emulation).
  CpuBackend(const Device& device, const TapeOptions& options, bool emulated)
      : device_(device),
        emulated_(emulated),
        schedule_(emulated && options.graph_replay, options.graph_replay ? align_up(options.graph_staging) : 0) {
    if (!emulated) return;
    if (options.grow)
      throw Error("Tape(" + device.str() + "): TapeOptions::grow (the teaching policy) is CPU-only: a device arena is one "
                  "allocation of segment_budget bytes made at setup");
    detail::check_graph_options(device, options);
  }
  bool device_memory() const override { return emulated_; }
  ChunkAllocator allocator(const char* what) override {
    return emulated_ ? ChunkAllocator{host_take, host_give, this, what, true} : ChunkAllocator{nullptr, nullptr, nullptr, what, false};
  }

  // One case per OpKind, no default: -Wswitch-enum names a kind left out.
  void forward(Tape& t, Node& n) override {
    if (schedule_.on()) (void)schedule_.issue(detail::op_signature(n, nullptr, nullptr), op_name(n.op));
    const cpu::Bf16Products products(t.options().precision == Precision::Bf16 ? &bf16_ : nullptr);
    switch (n.op) {
#define SEGTAPE_UNARY_CASE(Kind, ...) \
  case OpKind::Kind: return ops::unary_forward_cpu<ops::Kind>(n);
      SEGTAPE_UNARY_OPS(SEGTAPE_UNARY_CASE)
#undef SEGTAPE_UNARY_CASE
#define SEGTAPE_BINARY_CASE(Kind, ...) \
  case OpKind::Kind: return ops::binary_forward_cpu<ops::Kind>(n);
      SEGTAPE_BINARY_OPS(SEGTAPE_BINARY_CASE)
#undef SEGTAPE_BINARY_CASE
      case OpKind::MatMul: return ops::matmul_forward_cpu(n);
      case OpKind::Sum:
      case OpKind::Mean: return ops::reduce_forward_cpu(n);
      case OpKind::Softmax:
      case OpKind::LogSoftmax: return ops::softmax_forward_cpu(n);
      case OpKind::CrossEntropy: return ops::cross_entropy_forward_cpu(n);
      case OpKind::MseLoss: return ops::mse_forward_cpu(n);
      case OpKind::Concat: return ops::concat_forward_cpu(n);
      case OpKind::Slice: return ops::slice_forward_cpu(n);
      case OpKind::Transpose: return ops::transpose_forward_cpu(n);
      case OpKind::Embedding: return ops::embedding_forward_cpu(n);
      case OpKind::GruCell: return ops::gru_cell_forward_cpu(t, cells_, n);
      case OpKind::LstmCell: return ops::lstm_cell_forward_cpu(t, cells_, n);
      case OpKind::Reshape:      // a view: nothing to compute
      case OpKind::Input:        // seg.input() leaves: not computed
      case OpKind::GruSequence:  // the CPU composes gru_cell steps (has_gru_sequence() is false)
      case OpKind::Count: break;
    }
    throw TapeError(std::string("CPU backend: no forward for op ") + op_name(n.op));
  }

  void backward(Tape& t, const Node& n, const void* g, const ops::Grads& d) override {
    if (schedule_.on()) (void)schedule_.issue(detail::op_signature(n, g, &d), op_name(n.op));
    const cpu::Bf16Products products(t.options().precision == Precision::Bf16 ? &bf16_ : nullptr);
    switch (n.op) {
#define SEGTAPE_UNARY_CASE(Kind, ...) \
  case OpKind::Kind: return ops::unary_backward_cpu<ops::Kind>(n, g, d);
      SEGTAPE_UNARY_OPS(SEGTAPE_UNARY_CASE)
#undef SEGTAPE_UNARY_CASE
#define SEGTAPE_BINARY_CASE(Kind, ...) \
  case OpKind::Kind: return ops::binary_backward_cpu<ops::Kind>(n, g, d);
      SEGTAPE_BINARY_OPS(SEGTAPE_BINARY_CASE)
#undef SEGTAPE_BINARY_CASE
      case OpKind::MatMul: return ops::matmul_backward_cpu(n, g, d);
      case OpKind::Sum:
      case OpKind::Mean: return ops::reduce_backward_cpu(n, g, d);
      case OpKind::Softmax:
      case OpKind::LogSoftmax: return ops::softmax_backward_cpu(n, g, d);
      case OpKind::CrossEntropy: return ops::cross_entropy_backward_cpu(n, g, d);
      case OpKind::MseLoss: return ops::mse_backward_cpu(n, g, d);
      case OpKind::Concat: return ops::concat_backward_cpu(n, g, d);
      case OpKind::Slice: return ops::slice_backward_cpu(n, g, d);
      case OpKind::Reshape: return ops::reshape_backward_cpu(n, g, d);
      case OpKind::Transpose: return ops::transpose_backward_cpu(n, g, d);
      case OpKind::Embedding: return ops::embedding_backward_cpu(n, g, d);
      case OpKind::GruCell: return ops::gru_cell_backward_cpu(t, cells_, n, g, d);
      case OpKind::LstmCell: return ops::lstm_cell_backward_cpu(t, cells_, n, g, d);
      case OpKind::Input:
      case OpKind::GruSequence:
      case OpKind::Count: break;
    }
    throw TapeError(std::string("backward: no rule for op ") + op_name(n.op));
  }
  // The recurrent cells' (GRU, LSTM) weight gradients batched over a
  // backward's steps, and their weights packed for the backward's own
  // orientation (the forward pass's packed copies are dropped first; an
  // optimizer step may follow the end).
  void backward_begin(Tape& t, int64_t last_node) override {
    detail::prepare_cell_batch(cells_.batch, t, last_node);
    detail::clear_packed(cells_.packed);
  }
  void backward_end(Tape&) override {
    detail::flush_cell_batches(cells_.batch);
    detail::clear_packed(cells_.packed);
  }
  void bytes_written(const void* p, size_t bytes) override { detail::packed_written(cells_.packed, p, bytes); }
  detail::CpuCells& cells() { return cells_; }

  void copy(void* dst, const void* src, size_t bytes, Copy kind) override {
    if (!bytes) return;
    if (schedule_.on()) switch (kind) {
        case Copy::HostToDevice:
          if (schedule_.in_graph_segment())
            (void)schedule_.issue(detail::call::host_to_device(dst, schedule_.stage(bytes), bytes), "tape.from() (host to device copy)");
          break;
        case Copy::DeviceToHost:
          schedule_.check_host_read();
          raise_pending();
          break;
        case Copy::DeviceToDevice: (void)schedule_.issue(detail::call::device_copy(dst, src, bytes), "device copy"); break;
      }
    std::memmove(dst, src, bytes);
  }
  void zero(void* dst, size_t bytes) override {
    if (!bytes) return;
    if (schedule_.on()) (void)schedule_.issue(detail::call::zero(dst, bytes), "zero fill");
    std::memset(dst, 0, bytes);
  }
  void fill(void* dst, int64_t n, DType d, double value) override {
    if (n > 0 && schedule_.on()) (void)schedule_.issue(detail::call::fill(dst, n, d, value), "fill");
    if (d == DType::I64) throw TapeError("fill: integer tensors are not filled by the backend");
    detail::dispatch(d, [&]<class T>() {
      for (int64_t i = 0; i < n; ++i) static_cast<T*>(dst)[i] = T(value);
    });
  }
  std::pair<int64_t, double> first_nonfinite(const Tensor& t) override {
    schedule_.check_host_read();
    raise_pending();
    std::pair<int64_t, double> r{-1, 0.0};
    detail::dispatch(t.dtype, [&]<class T>() {
      const T* p = static_cast<const T*>(t.ptr);
      for (int64_t i = 0, n = t.numel(); i < n; ++i)
        if (!std::isfinite(p[i])) {
          r = {i, double(p[i])};
          return;
        }
    });
    return r;
  }
  void synchronize() override {
    schedule_.check_synchronize();
    raise_pending();
  }

  void sgd_step(DType d, int64_t n, void* p, const void* g, void* buf, const SgdOptions& s, bool first) override {
    if (n > 0 && schedule_.on()) (void)schedule_.issue(detail::call::sgd(p, g, buf, n, d, s, first), "sgd_step");
    detail::dispatch(d, [&]<class T>() {
      const auto sc = detail::sgd_scalars<T>(s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov, first, buf != nullptr);
      T* pt = static_cast<T*>(p);
      const T* gt = static_cast<const T*>(g);
      T* bt = static_cast<T*>(buf);
      for (int64_t i = 0; i < n; ++i) detail::sgd_element(pt[i], gt[i], bt ? bt + i : nullptr, sc);
    });
  }
  void adam_step(DType d, int64_t n, void* p, const void* g, void* m, void* v, const AdamOptions& s, bool decoupled,
                 int64_t step, const double* step_at) override {
    if (n > 0 && schedule_.on())
      (void)schedule_.issue(detail::call::adam(p, g, m, v, n, d, s, decoupled, step, step_at), "adam_step");
    const double t = step_at ? *step_at : double(step);
    detail::dispatch(d, [&]<class T>() {
      const auto sc = detail::adam_scalars<T>(s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, decoupled, t);
      T* pt = static_cast<T*>(p);
      const T* gt = static_cast<const T*>(g);
      T* mt = static_cast<T*>(m);
      T* vt = static_cast<T*>(v);
      for (int64_t i = 0; i < n; ++i) detail::adam_element(pt[i], gt[i], mt[i], vt[i], sc);
    });
  }
  void scale(void* x, int64_t n, DType d, double factor) override {
    if (n > 0 && schedule_.on()) (void)schedule_.issue(detail::call::scale(x, n, d, factor), "scale_grad");
    scale_values(x, n, d, factor);
  }
  static void scale_values(void* x, int64_t n, DType d, double factor) {
    detail::dispatch(d, [&]<class T>() {
      T* xt = static_cast<T*>(x);
      const T k = T(factor);
      for (int64_t i = 0; i < n; ++i) xt[i] = xt[i] * k;
    });
  }
  void add_scalar(void* x, int64_t n, DType d, double value) override {
    if (n > 0 && schedule_.on()) (void)schedule_.issue(detail::call::add_scalar(x, n, d, value), "add_scalar");
    detail::dispatch(d, [&]<class T>() {
      T* xt = static_cast<T*>(x);
      const T k = T(value);
      for (int64_t i = 0; i < n; ++i) xt[i] = xt[i] + k;
    });
  }
  void add_sum_squares(const void* x, int64_t n, DType d, double* acc, bool first) override {
    if (schedule_.on()) (void)schedule_.issue(detail::call::add_sum_squares(x, n, d, acc, first), "add_grad_squares");
    *acc = (first ? 0.0 : *acc) + sum_of_squares(x, n, d);  // the host clip's order: each sum, then added
  }
  void clip_scale(void* x, int64_t n, DType d, const double* sum_sq, double max_norm) override {
    if (n > 0 && schedule_.on()) (void)schedule_.issue(detail::call::clip_scale(x, n, d, sum_sq, max_norm), "clip_grad");
    const double c = detail::clip_coefficient(*sum_sq, max_norm);
    if (c >= 1.0) return;
    scale_values(x, n, d, c);
  }
  void device_call(const DeviceFunction& fn, const CallArgs& a) override {
    if (schedule_.on()) (void)schedule_.issue(detail::call::device_function(fn, a), fn.name);
    fn.host(a);
  }
  double sum_squares(const void* x, int64_t n, DType d) override {
    schedule_.check_norm();
    raise_pending();
    return sum_of_squares(x, n, d);
  }
  static double sum_of_squares(const void* x, int64_t n, DType d) {
    double s = 0;
    detail::dispatch(d, [&]<class T>() {
      const T* xt = static_cast<const T*>(x);
      for (int64_t i = 0; i < n; ++i) s += double(xt[i]) * double(xt[i]);
    });
    return s;
  }

  // Graph replay emulated: no graph is made or launched (every call ran when
  // it was issued); the schedule, captures and checks are the CUDA backend's.
  void segment_begin(uint32_t index, bool graph, unsigned slot) override {
    raise_pending();
    if (schedule_.on()) schedule_.begin(index, graph, slot);
    detail::clear_packed(cells_.packed);  // a segment packs its weights anew
  }
  void segment_end(bool abandoned) noexcept override {
    if (!schedule_.on()) return;
    if (schedule_.end(abandoned, pending_) == detail::GraphSchedule::End::Instantiate) schedule_.captured();
  }
  void discard_graph() override { schedule_.discard(); }
  std::pair<uint64_t, uint64_t> graph_counts() const override { return {schedule_.captures(), schedule_.replays()}; }
  size_t internal_device_bytes() const override { return 0; }
  size_t workspace_bytes() const override {
    size_t n = cells_.packed.buffers.reserved() + bf16_.bytes();
    for (const detail::CellBatch& b : cells_.batch.open) n += b.buffers.reserved();
    return n;
  }
  std::string describe() const override {
    return emulated_ ? device_.str() + ": host-emulated (segtape::emulation)" : device_.str();
  }

 private:
  // A replayed segment that issued fewer calls than its capture: raised at
  // the next segment, as the CUDA backend does (there its graph did not run).
  void raise_pending() {
    if (pending_.empty()) return;
    std::string e;
    e.swap(pending_);
    throw TapeError(e);
  }

  Device device_;
  bool emulated_;
  detail::GraphSchedule schedule_;
  std::string pending_;
  detail::CpuCells cells_;
  cpu::Bf16Scratch bf16_;  // Precision::Bf16's rounded copies (cpu/blas.h)
};

}  // namespace

namespace emulation {
void emulate_cuda_on_host(bool on) { g_emulate.store(on); }
bool emulating_cuda_on_host() { return g_emulate.load(); }
}  // namespace emulation

namespace detail {
std::unique_ptr<Backend> make_cpu_backend(const Device& device, const TapeOptions& options) {
  return std::make_unique<CpuBackend>(device, options, false);
}
std::unique_ptr<Backend> make_host_emulated_backend(const Device& device, const TapeOptions& options) {
  return std::make_unique<CpuBackend>(device, options, true);
}
CpuCells* cpu_cells(Tape& tape) {
  auto* be = dynamic_cast<CpuBackend*>(TapeInternals::backend(tape));
  return be ? &be->cells() : nullptr;
}
}  // namespace detail

}  // namespace segtape
