// matmul: C [M, N] = op(A) op(B), op a transpose when asked. The CPU runs
// OpenBLAS (cpu/blas.h), CUDA cuBLAS; both backwards are matmul_backward (op.h).
#include "cpu/blas.h"
#include "ops/op.h"
#ifdef SEGTAPE_HAVE_CUDA
#include "cuda/op_util.h"
#endif

namespace segtape {

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Tape& t = ops::check("matmul", {&a, &b});
  if (a.rank() != 2 || b.rank() != 2) ops::shape_error("matmul", "expects 2-D tensors", {&a, &b});
  const int64_t M = ta ? a.dim(1) : a.dim(0), K = ta ? a.dim(0) : a.dim(1);
  const int64_t Kb = tb ? b.dim(1) : b.dim(0), N = tb ? b.dim(0) : b.dim(1);
  if (K != Kb)
    ops::shape_error("matmul", std::string("inner dimensions differ (") + std::to_string(K) + " vs " + std::to_string(Kb) +
                         (ta ? ", a transposed" : "") + (tb ? ", b transposed" : "") + ")", {&a, &b});
  Node n = ops::node(OpKind::MatMul, {a, b});
  n.ia = {ta, tb, 0, 0};
  n.reads = uint8_t((a.requires_grad ? 2 : 0) | (b.requires_grad ? 1 : 0));  // dA reads B, dB reads A
  return ops::emit(t, n, {M, N}, "matmul");
}

namespace ops {

void matmul_forward_cpu(Node& n) {
  const Tensor &a = n.in[0], &b = n.in[1];
  const detail::MatmulShape m = detail::matmul_shape(n);
  detail::dispatch(a.dtype, [&]<class T>() {
    cpu::gemm(m.ta, m.tb, m.M, m.N, m.K, T(1), static_cast<const T*>(a.ptr), a.dim(1), static_cast<const T*>(b.ptr), b.dim(1), T(0),
              static_cast<T*>(n.out.ptr), m.N);
  });
}

void matmul_backward_cpu(const Node& n, const void* g, const Grads& d) {
  const Tensor &a = n.in[0], &b = n.in[1];
  const detail::MatmulShape m = detail::matmul_shape(n);
  detail::dispatch(a.dtype, [&]<class T>() {
    auto gemm = [](auto... args) { cpu::gemm(args...); };
    detail::matmul_backward<T>(gemm, m.ta, m.tb, m.M, m.N, m.K, static_cast<const T*>(g), static_cast<const T*>(a.ptr), a.dim(1),
                               static_cast<const T*>(b.ptr), b.dim(1), static_cast<T*>(d[0]), static_cast<T*>(d[1]));
  });
}

}  // namespace ops
#ifdef SEGTAPE_HAVE_CUDA
// ---- CUDA (engine/cuda/op_table.cpp dispatches here; kernels in cuda/kernels.h)
namespace ops {
using cuda::in;
using cuda::out;

void matmul_forward_cuda(cuda::CudaBackend& be, Node& n) {
  const Tensor &a = n.in[0], &b = n.in[1];
  const detail::MatmulShape m = detail::matmul_shape(n);
  detail::dispatch(a.dtype, [&]<class T>() {
    be.gemm(m.ta, m.tb, m.M, m.N, m.K, T(1), in<T>(a), a.dim(1), in<T>(b), b.dim(1), T(0), out<T>(n.out), m.N);
  });
}

void matmul_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {
  const Tensor &a = n.in[0], &b = n.in[1];
  const detail::MatmulShape m = detail::matmul_shape(n);
  detail::dispatch(a.dtype, [&]<class T>() {
    auto gemm = [&be](auto... args) { be.gemm(args...); };
    detail::matmul_backward<T>(gemm, m.ta, m.tb, m.M, m.N, m.K, static_cast<const T*>(g), in<T>(a), a.dim(1), in<T>(b), b.dim(1),
                               static_cast<T*>(d[0]), static_cast<T*>(d[1]));
  });
}

}  // namespace ops
#endif  // SEGTAPE_HAVE_CUDA

}  // namespace segtape
