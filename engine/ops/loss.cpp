// Losses: cross-entropy over class indices (fused log-softmax + NLL, with
// ignore_index) and mean squared error.
#include <cmath>

#include "cpu/vmath.h"
#include "ops/op.h"
#ifdef SEGTAPE_HAVE_CUDA
#include "cuda/op_util.h"
#endif

namespace segtape {

// Node: in = {logits [B, C], targets [B] int64}, ia = {reduction, ignore_index};
// saved [B + 1]: each row's log-sum-exp, then the number of counted rows (as
// the logits' type), which backward recomputes the softmax from.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction r, int64_t ignore_index) {
  const char* op = "cross_entropy";
  Tape& t = ops::check(op, {&logits});
  ops::check_index(op, t, targets, {&logits, &targets});
  if (targets.dtype != DType::I64) ops::shape_error(op, "targets must be int64 class indices", {&logits, &targets});
  if (logits.rank() != 2 || targets.numel() != logits.dim(0))
    ops::shape_error(op, "expects logits [B, C] and B targets", {&logits, &targets});
  Node n = ops::node(OpKind::CrossEntropy, {logits, targets});
  n.ia = {int64_t(r), ignore_index, 0, 0};
  n.reads = 1 | 2;  // backward: the softmax again from the logits and the saved log-sum-exp, at the targets
  return ops::emit(t, n, {}, op, {size_t(logits.dim(0) + 1) * dtype_size(logits.dtype)});
}

Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction r) {
  Tape& t = ops::check("mse_loss", {&a, &b});
  if (!(a.shape == b.shape)) ops::shape_error("mse_loss", "shapes differ", {&a, &b});
  Node n = ops::node(OpKind::MseLoss, {a, b});
  n.ia[0] = int64_t(r);
  n.reads = 1 | 2;  // backward: a - b
  return ops::emit(t, n, {}, "mse_loss");
}

namespace ops {

// The CPU checks every target before computing; a device kernel records a bad
// one and the host reports it at the next synchronisation.
void cross_entropy_forward_cpu(Node& n) {
  const Tensor &logits = n.in[0], &targets = n.in[1];
  const int64_t B = logits.dim(0), C = logits.dim(1), ignore = n.ia[1];
  const int64_t* y = static_cast<const int64_t*>(targets.ptr);
  int64_t count = 0;
  for (int64_t i = 0; i < B; ++i) {
    if (y[i] == ignore) continue;
    if (y[i] < 0 || y[i] >= C)
      throw IndexError("cross_entropy: target " + std::to_string(y[i]) + " at row " + std::to_string(i) +
                       " is out of range for " + std::to_string(C) + " classes (logits " + logits.describe() + ")");
    ++count;
  }
  detail::dispatch(logits.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(logits.ptr);
    T* lse = static_cast<T*>(n.saved);
    T total = 0;
    for (int64_t i = 0; i < B; ++i) {
      const T* xr = x + i * C;
      const auto [m, s] = cpu::row_exp(xr, C);
      lse[i] = m + std::log(s);
      if (y[i] != ignore) total += lse[i] - xr[y[i]];
    }
    lse[B] = T(count);
    *static_cast<T*>(n.out.ptr) = Reduction(n.ia[0]) == Reduction::Mean ? total / T(count) : total;
  });
}

void cross_entropy_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  if (!d[0]) return;
  const Tensor& logits = n.in[0];
  const int64_t B = logits.dim(0), C = logits.dim(1);
  const int64_t* tg = static_cast<const int64_t*>(n.in[1].ptr);
  detail::dispatch(logits.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(logits.ptr);
    const T* lse = static_cast<const T*>(n.saved);
    const T* g = static_cast<const T*>(gout);
    T* da = static_cast<T*>(d[0]);
    const T s = Reduction(n.ia[0]) == Reduction::Mean ? g[0] / lse[B] : g[0];
    for (int64_t i = 0; i < B; ++i) {
      if (tg[i] == n.ia[1]) continue;
      for (int64_t c = 0; c < C; ++c) da[i * C + c] += s * cpu::vexp<T>(x[i * C + c] - lse[i]);
      da[i * C + tg[i]] -= s;
    }
  });
}

void mse_forward_cpu(Node& n) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(n.in[0].ptr);
    const T* y = static_cast<const T*>(n.in[1].ptr);
    const int64_t m = n.in[0].numel();
    T s = 0;
    for (int64_t i = 0; i < m; ++i) s += (x[i] - y[i]) * (x[i] - y[i]);
    *static_cast<T*>(n.out.ptr) = Reduction(n.ia[0]) == Reduction::Mean ? s / T(m) : s;
  });
}

void mse_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(n.in[0].ptr);
    const T* y = static_cast<const T*>(n.in[1].ptr);
    const T* g = static_cast<const T*>(gout);
    T* da = static_cast<T*>(d[0]);
    T* db = static_cast<T*>(d[1]);
    const int64_t m = n.in[0].numel();
    const T s = Reduction(n.ia[0]) == Reduction::Mean ? T(2) * g[0] / T(m) : T(2) * g[0];
    for (int64_t i = 0; i < m; ++i) {
      const T e = s * (x[i] - y[i]);
      if (da) da[i] += e;
      if (db) db[i] -= e;
    }
  });
}

}  // namespace ops
#ifdef SEGTAPE_HAVE_CUDA
// ---- CUDA (engine/cuda/op_table.cpp dispatches here; kernels in cuda/kernels.h)
namespace ops {
using cuda::in;
using cuda::out;

// The device checks (and counts) the targets in its kernel: a bad one is
// reported at the next synchronisation.
void cross_entropy_forward_cuda(cuda::CudaBackend& be, Node& n) {
  const Tensor& a = n.in[0];
  const int64_t B = a.dim(0), C = a.dim(1);
  detail::dispatch(a.dtype, [&]<class T>() {
    cuda::cross_entropy_forward<T>(be.stream(), in<T>(a), in<int64_t>(n.in[1]), B, C, n.ia[1], Reduction(n.ia[0]) == Reduction::Mean,
                                   static_cast<T*>(n.saved), be.temp<T>(2 * B), out<T>(n.out), be.errors());
  });
}

void cross_entropy_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {
  if (!d[0]) return;
  const Tensor& a = n.in[0];
  detail::dispatch(a.dtype, [&]<class T>() {
    cuda::cross_entropy_backward<T>(be.stream(), static_cast<const T*>(g), in<T>(a), in<int64_t>(n.in[1]),
                                    static_cast<const T*>(n.saved), a.dim(0), a.dim(1), n.ia[1],
                                    Reduction(n.ia[0]) == Reduction::Mean, static_cast<T*>(d[0]));
  });
}

void mse_forward_cuda(cuda::CudaBackend& be, Node& n) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::mse_forward<T>(be.stream(), in<T>(n.in[0]), in<T>(n.in[1]), n.in[0].numel(), Reduction(n.ia[0]) == Reduction::Mean,
                         out<T>(n.out), be.partials<T>());
  });
}

void mse_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::mse_backward<T>(be.stream(), static_cast<const T*>(g), in<T>(n.in[0]), in<T>(n.in[1]), n.in[0].numel(),
                          Reduction(n.ia[0]) == Reduction::Mean, static_cast<T*>(d[0]), static_cast<T*>(d[1]));
  });
}

}  // namespace ops
#endif  // SEGTAPE_HAVE_CUDA

}  // namespace segtape
