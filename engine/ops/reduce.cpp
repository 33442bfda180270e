// Reductions: sum and mean (of everything, or along one axis), softmax and
// log-softmax along the last axis.
#include <cmath>

#include "cpu/vmath.h"
#include "ops/op.h"
#ifdef SEGTAPE_HAVE_CUDA
#include "cuda/op_util.h"
#endif

namespace segtape {
namespace {

using detail::AxisView;
using detail::axis_view;

// ia[0]: the axis, or -1 for all elements.
AxisView reduce_view(const Node& n) {
  const Tensor& a = n.in[0];
  return n.ia[0] < 0 ? AxisView{1, a.numel(), 1} : axis_view(a.shape, int(n.ia[0]));
}

Tensor reduce(OpKind k, const char* op, const Tensor& a, int axis, bool all) {
  Tape& t = ops::check(op, {&a});
  const int ax = all ? -1 : ops::norm_axis(op, a, axis);
  Shape os;
  if (!all)
    for (int i = 0; i < a.rank(); ++i)
      if (i != ax) os.dims[os.rank++] = a.shape.dims[i];
  Node n = ops::node(k, {a});
  n.ia[0] = ax;
  n.reads = 0;  // backward: the output's gradient spread over the axis
  return ops::emit(t, n, os, op);
}

Tensor softmax_impl(OpKind k, const char* op, const Tensor& a) {
  Tape& t = ops::check(op, {&a});
  if (a.rank() < 1) ops::shape_error(op, "needs rank >= 1", {&a});
  Node n = ops::node(k, {a});
  n.reads = Node::kReadsOut;  // backward: from the (log-)softmax itself
  return ops::emit(t, n, a.shape, op);
}

}  // namespace

Tensor sum(const Tensor& a) { return reduce(OpKind::Sum, "sum", a, 0, true); }
Tensor mean(const Tensor& a) { return reduce(OpKind::Mean, "mean", a, 0, true); }
Tensor sum(const Tensor& a, int axis) { return reduce(OpKind::Sum, "sum", a, axis, false); }
Tensor mean(const Tensor& a, int axis) { return reduce(OpKind::Mean, "mean", a, axis, false); }
Tensor softmax(const Tensor& a) { return softmax_impl(OpKind::Softmax, "softmax", a); }
Tensor log_softmax(const Tensor& a) { return softmax_impl(OpKind::LogSoftmax, "log_softmax", a); }

namespace ops {

void reduce_forward_cpu(Node& n) {
  const AxisView v = reduce_view(n);
  const bool is_mean = n.op == OpKind::Mean;
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(n.in[0].ptr);
    T* y = static_cast<T*>(n.out.ptr);
    for (int64_t o = 0; o < v.outer; ++o)
      for (int64_t i = 0; i < v.inner; ++i) {
        T acc = 0;
        for (int64_t j = 0; j < v.n; ++j) acc += x[(o * v.n + j) * v.inner + i];
        y[o * v.inner + i] = is_mean ? acc / T(v.n) : acc;
      }
  });
}

void reduce_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  if (!d[0]) return;
  const AxisView v = reduce_view(n);
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    T* da = static_cast<T*>(d[0]);
    const T s = n.op == OpKind::Mean ? T(1) / T(v.n) : T(1);
    for (int64_t o = 0; o < v.outer; ++o)
      for (int64_t j = 0; j < v.n; ++j)
        for (int64_t i = 0; i < v.inner; ++i) da[(o * v.n + j) * v.inner + i] += s * g[o * v.inner + i];
  });
}

void softmax_forward_cpu(Node& n) {
  const int64_t C = n.in[0].shape.last(), R = n.in[0].shape.rows();
  const bool log = n.op == OpKind::LogSoftmax;
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(n.in[0].ptr);
    T* y = static_cast<T*>(n.out.ptr);
    for (int64_t r = 0; r < R; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      const auto [m, s] = cpu::row_exp(xr, C);
      if (!log) {
        const T inv = T(1) / s;
        for (int64_t c = 0; c < C; ++c) yr[c] = cpu::vexp<T>(xr[c] - m) * inv;
      } else {
        const T lse = m + std::log(s);
        for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] - lse;
      }
    }
  });
}

void softmax_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  if (!d[0]) return;
  const int64_t C = n.out.shape.last(), R = n.out.shape.rows();
  const bool log = n.op == OpKind::LogSoftmax;
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* y = static_cast<const T*>(n.out.ptr);
    const T* g = static_cast<const T*>(gout);
    T* da = static_cast<T*>(d[0]);
    for (int64_t r = 0; r < R; ++r) {
      const T* yr = y + r * C;
      const T* gr = g + r * C;
      T* dr = da + r * C;
      T s = 0;
      if (!log) {
        for (int64_t c = 0; c < C; ++c) s += gr[c] * yr[c];
        for (int64_t c = 0; c < C; ++c) dr[c] += yr[c] * (gr[c] - s);
      } else {
        for (int64_t c = 0; c < C; ++c) s += gr[c];
        for (int64_t c = 0; c < C; ++c) dr[c] += gr[c] - cpu::vexp<T>(yr[c]) * s;
      }
    }
  });
}

}  // namespace ops
#ifdef SEGTAPE_HAVE_CUDA
// ---- CUDA (engine/cuda/op_table.cpp dispatches here; kernels in cuda/kernels.h)
namespace ops {
using cuda::in;
using cuda::out;

void reduce_forward_cuda(cuda::CudaBackend& be, Node& n) {
  const AxisView v = reduce_view(n);
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::reduce_axis<T>(be.stream(), in<T>(n.in[0]), out<T>(n.out), v.outer, v.n, v.inner, n.op == OpKind::Mean ? T(v.n) : T(1),
                         be.partials<T>());
  });
}

void reduce_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {
  if (!d[0]) return;
  const AxisView v = reduce_view(n);
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::reduce_axis_backward<T>(be.stream(), static_cast<const T*>(g), static_cast<T*>(d[0]), v.outer, v.n, v.inner,
                                  n.op == OpKind::Mean ? T(1) / T(v.n) : T(1));
  });
}

void softmax_forward_cuda(cuda::CudaBackend& be, Node& n) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::softmax_forward<T>(be.stream(), in<T>(n.in[0]), out<T>(n.out), n.in[0].shape.rows(), n.in[0].shape.last(),
                             n.op == OpKind::LogSoftmax);
  });
}

void softmax_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {
  if (!d[0]) return;
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::softmax_backward<T>(be.stream(), static_cast<const T*>(g), in<T>(n.out), static_cast<T*>(d[0]), n.out.shape.rows(),
                              n.out.shape.last(), n.op == OpKind::LogSoftmax);
  });
}

}  // namespace ops
#endif  // SEGTAPE_HAVE_CUDA

}  // namespace segtape
