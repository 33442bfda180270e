// The elementwise family: the unary ops and the binary ops with broadcasting
// of segtape/op_list.h, where their formulas, forward and backward, are
// (ops/elementwise.h makes structs of them). Here are their public functions,
// the CPU loops over those formulas and the CUDA launches of the kernels over them.
#include "ops/elementwise.h"

#include "cpu/vmath.h"
#include "ops/op.h"
#ifdef SEGTAPE_HAVE_CUDA
#include "cuda/op_util.h"
#endif

namespace segtape {
namespace {

// b broadcasts over a when it has a's shape, a's last dim, or one element.
void check_broadcast(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape == b.shape) return;
  if (b.numel() == 1) return;
  const bool row = b.numel() == a.shape.last() && a.rank() >= 1 &&
                   (b.rank() == 1 || (b.rank() == 2 && b.dim(0) == 1));
  if (!row) ops::shape_error(op, "shapes do not broadcast (b must have a's shape, a's last dimension, or one element)", {&a, &b});
}

// Op is the op's formula struct (ops/elementwise.h): what its backward reads.
template <class Op>
Tensor unary(OpKind k, const char* op, const Tensor& a, double s = 0) {
  Tape& t = ops::check(op, {&a});
  Node n = ops::node(k, {a});
  n.fa = s;
  n.reads = uint8_t((Op::reads_x ? 1 : 0) | (Op::reads_y ? Node::kReadsOut : 0));
  return ops::emit(t, n, a.shape, op);
}

template <class Op>
Tensor binary(OpKind k, const char* op, const Tensor& a, const Tensor& b) {
  Tape& t = ops::check(op, {&a, &b});
  check_broadcast(op, a, b);
  Node n = ops::node(k, {a, b});
  n.reads = uint8_t((a.requires_grad ? Op::da_reads : 0) | (b.requires_grad ? Op::db_reads : 0));
  return ops::emit(t, n, a.shape, op);
}

}  // namespace

#define SEGTAPE_UNARY_FN(Kind, name, ...) \
  Tensor name(const Tensor& a) { return unary<ops::Kind>(OpKind::Kind, #name, a); }
SEGTAPE_UNARY_PLAIN_OPS(SEGTAPE_UNARY_FN)
#undef SEGTAPE_UNARY_FN
#define SEGTAPE_UNARY_SCALAR_FN(Kind, name, ...) \
  Tensor name(const Tensor& a, double s) { return unary<ops::Kind>(OpKind::Kind, #name, a, s); }
SEGTAPE_UNARY_SCALAR_OPS(SEGTAPE_UNARY_SCALAR_FN)
#undef SEGTAPE_UNARY_SCALAR_FN
#define SEGTAPE_BINARY_FN(Kind, name, ...) \
  Tensor name(const Tensor& a, const Tensor& b) { return binary<ops::Kind>(OpKind::Kind, #name, a, b); }
SEGTAPE_BINARY_OPS(SEGTAPE_BINARY_FN)
#undef SEGTAPE_BINARY_FN

namespace ops {

// ---- the CPU loops, generic over the formulas

template <class Op>
void unary_forward_cpu(Node& n) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(n.in[0].ptr);
    T* y = static_cast<T*>(n.out.ptr);
    const T s = T(n.fa);
    for (int64_t i = 0, m = n.out.numel(); i < m; ++i) y[i] = Op::template forward<cpu::Math>(x[i], s);
  });
}

template <class Op>
void unary_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  if (!d[0]) return;
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    const T* x = static_cast<const T*>(n.in[0].ptr);
    const T* y = static_cast<const T*>(n.out.ptr);
    T* dx = static_cast<T*>(d[0]);
    const T s = T(n.fa);
    for (int64_t i = 0, m = n.out.numel(); i < m; ++i) dx[i] += Op::template backward<cpu::Math>(g[i], x[i], y[i], s);
  });
}

template <class Op>
void binary_forward_cpu(Node& n) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* a = static_cast<const T*>(n.in[0].ptr);
    const T* b = static_cast<const T*>(n.in[1].ptr);
    T* o = static_cast<T*>(n.out.ptr);
    const int64_t m = n.out.numel(), bn = n.in[1].numel();
    for (int64_t r = 0; r < m; r += bn)
      for (int64_t c = 0; c < bn; ++c) o[r + c] = Op::forward(a[r + c], b[c]);
  });
}

template <class Op>
void binary_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    const T* a = static_cast<const T*>(n.in[0].ptr);
    const T* b = static_cast<const T*>(n.in[1].ptr);
    const int64_t m = n.out.numel(), bn = n.in[1].numel();
    if (T* da = static_cast<T*>(d[0]))
      for (int64_t r = 0; r < m; r += bn)
        for (int64_t c = 0; c < bn; ++c) da[r + c] += Op::grad_a(g[r + c], a[r + c], b[c]);
    if (T* db = static_cast<T*>(d[1]))  // summed over the rows b is broadcast to
      detail::reduce_rows(db, m, bn, [&](int64_t i, int64_t c) { return Op::grad_b(g[i], a[i], b[c]); });
  });
}

#define SEGTAPE_INSTANTIATE_UNARY(Kind, ...)              \
  template void unary_forward_cpu<Kind>(Node&);           \
  template void unary_backward_cpu<Kind>(const Node&, const void*, const Grads&);
SEGTAPE_UNARY_OPS(SEGTAPE_INSTANTIATE_UNARY)
#undef SEGTAPE_INSTANTIATE_UNARY
#define SEGTAPE_INSTANTIATE_BINARY(Kind, ...)             \
  template void binary_forward_cpu<Kind>(Node&);          \
  template void binary_backward_cpu<Kind>(const Node&, const void*, const Grads&);
SEGTAPE_BINARY_OPS(SEGTAPE_INSTANTIATE_BINARY)
#undef SEGTAPE_INSTANTIATE_BINARY

}  // namespace ops
#ifdef SEGTAPE_HAVE_CUDA
// ---- CUDA (engine/cuda/op_table.cpp dispatches here; kernels in cuda/kernels.h)
namespace ops {
using cuda::in;
using cuda::out;

template <class Op>
void unary_forward_cuda(cuda::CudaBackend& be, Node& n) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::unary_forward<Op, T>(be.stream(), in<T>(n.in[0]), out<T>(n.out), n.out.numel(), T(n.fa));
  });
}

template <class Op>
void unary_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {
  if (!d[0]) return;
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::unary_backward<Op, T>(be.stream(), static_cast<const T*>(g), in<T>(n.in[0]), in<T>(n.out), static_cast<T*>(d[0]),
                                n.out.numel(), T(n.fa));
  });
}

template <class Op>
void binary_forward_cuda(cuda::CudaBackend& be, Node& n) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::binary_forward<Op, T>(be.stream(), in<T>(n.in[0]), in<T>(n.in[1]), out<T>(n.out), n.out.numel(), n.in[1].numel());
  });
}

template <class Op>
void binary_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* gout, const Grads& d) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    const int64_t m = n.out.numel(), bn = n.in[1].numel();
    if (T* da = static_cast<T*>(d[0])) cuda::binary_backward_a<Op, T>(be.stream(), g, in<T>(n.in[0]), in<T>(n.in[1]), da, m, bn);
    if (T* db = static_cast<T*>(d[1]))
      cuda::binary_backward_b<Op, T>(be.stream(), g, in<T>(n.in[0]), in<T>(n.in[1]), db, m, bn, be.partials<T>());
  });
}

#define SEGTAPE_INSTANTIATE_UNARY(Kind, ...)                           \
  template void unary_forward_cuda<Kind>(cuda::CudaBackend&, Node&); \
  template void unary_backward_cuda<Kind>(cuda::CudaBackend&, const Node&, const void*, const Grads&);
SEGTAPE_UNARY_OPS(SEGTAPE_INSTANTIATE_UNARY)
#undef SEGTAPE_INSTANTIATE_UNARY
#define SEGTAPE_INSTANTIATE_BINARY(Kind, ...)                           \
  template void binary_forward_cuda<Kind>(cuda::CudaBackend&, Node&); \
  template void binary_backward_cuda<Kind>(cuda::CudaBackend&, const Node&, const void*, const Grads&);
SEGTAPE_BINARY_OPS(SEGTAPE_INSTANTIATE_BINARY)
#undef SEGTAPE_INSTANTIATE_BINARY

}  // namespace ops
#endif  // SEGTAPE_HAVE_CUDA

}  // namespace segtape
