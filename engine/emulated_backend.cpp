// The host-emulated device behind segtape/emulation.h: a detail::Backend whose
// "device" memory is host memory. Tensors on it report on_device(), so every
// host access that a GPU would refuse is refused here too (data<T>() raises);
// copies, fills, the anomaly scan and the parameter updates go through this
// interface and run the CPU implementations; the ops themselves run the CPU
// code in ops.cpp (computes_on_host()).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend.h"
#include "segtape/emulation.h"

namespace segtape {
namespace {

std::atomic<bool> g_emulate{false};

void* host_take(void*, size_t bytes, const char* what) {
  void* p = std::aligned_alloc(kAlign, align_up(bytes ? bytes : 1));
  if (!p) throw Error(std::string("host-emulated device: out of host memory reserving the ") + what);
  return p;
}
void host_give(void*, void* p) { std::free(p); }

class HostEmulatedBackend final : public detail::Backend {
 public:
  HostEmulatedBackend(const Device& device, const TapeOptions& options) : device_(device) {
    if (options.grow)
      throw Error("Tape(" + device.str() + "): TapeOptions::grow (the teaching policy) is CPU-only: a device arena is one "
                  "allocation of segment_budget bytes made at setup");
    if (options.graph_replay)
      throw Error("Tape(" + device.str() + "): the host-emulated device (segtape::emulation) does not emulate CUDA graphs");
  }
  bool computes_on_host() const override { return true; }
  ChunkAllocator allocator(const char* what) override { return {host_take, host_give, this, what, true}; }
  void forward(Tape&, Node& n) override { unreachable("forward", n); }
  void backward(Tape&, const Node& n, const void*, const std::array<void*, Node::kMaxInputs>&) override {
    unreachable("backward", n);
  }
  void copy(void* dst, const void* src, size_t bytes, Copy) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void fill(void* dst, int64_t n, DType d, double value) override {
    if (d == DType::F32)
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = float(value);
    else if (d == DType::F64)
      for (int64_t i = 0; i < n; ++i) static_cast<double*>(dst)[i] = value;
    else
      throw TapeError("fill: integer tensors are not filled on the device");
  }
  std::pair<int64_t, double> first_nonfinite(const Tensor& t) override {
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      const double v = t.dtype == DType::F32 ? double(static_cast<const float*>(t.ptr)[i]) : static_cast<const double*>(t.ptr)[i];
      if (!std::isfinite(v)) return {i, v};
    }
    return {-1, 0.0};
  }
  void synchronize() override {}
  void sgd_step(DType d, int64_t n, void* p, const void* g, void* buf, const SgdOptions& s, bool first) override {
    detail::cpu_sgd_step(d, n, p, g, buf, s, first);
  }
  void adam_step(DType d, int64_t n, void* p, const void* g, void* m, void* v, const AdamOptions& s, bool decoupled, int64_t step) override {
    detail::cpu_adam_step(d, n, p, g, m, v, s, decoupled, step);
  }
  void scale(void* x, int64_t n, DType d, double factor) override { detail::cpu_scale(x, n, d, factor); }
  double sum_squares(const void* x, int64_t n, DType d) override { return detail::cpu_sum_squares(x, n, d); }
  void segment_begin(uint32_t) override {}
  void segment_end(bool) noexcept override {}
  void discard_graph() override {}
  size_t internal_device_bytes() const override { return 0; }
  std::string describe() const override { return device_.str() + ": host-emulated (segtape::emulation)"; }

 private:
  [[noreturn]] static void unreachable(const char* what, const Node& n) {
    throw Error(std::string("host-emulated device: ") + what + " of '" + op_name(n.op) +
                "' reached the backend; the ops run the CPU code on this device");
  }
  Device device_;
};

}  // namespace

namespace emulation {
void emulate_cuda_on_host(bool on) { g_emulate.store(on); }
bool emulating_cuda_on_host() { return g_emulate.load(); }
}  // namespace emulation

namespace detail {
std::unique_ptr<Backend> make_host_emulated_backend(const Device& device, const TapeOptions& options) {
  return std::make_unique<HostEmulatedBackend>(device, options);
}
}  // namespace detail

}  // namespace segtape
