// Forward and backward of every op on CUDA but the GRU sequence
// (gru_sequence.cpp): the device half of the op families in engine/ops/,
// case for case. The elementwise ops run their formulas of
// ops/elementwise.h in generic kernels; matrix products go through
// CudaBackend::gemm (cuBLAS), the rest through segtape's kernels (kernels.h).
// Everything is queued on the tape's stream. Every switch lists every OpKind,
// with no default (-Wswitch-enum).
#include <cstring>

#include "check.h"
#include "cuda_backend.h"
#include "ops/op.h"
#include "segtape/ops.h"
#include "fnv.h"

namespace segtape::cuda {
namespace {

template <class T> const T* in(const Tensor& t) { return static_cast<const T*>(t.ptr); }
template <class T> T* out(const Tensor& t) { return static_cast<T*>(t.ptr); }

using detail::AxisView;
using detail::axis_view;

// GRU gates of one step into S [B, 4H] (and y [B, H] when non-null): two
// GEMMs into the backend's temporaries, then the fused gate kernel.
template <class T>
void gru_gates(CudaBackend& be, const Node& nd, T* S, T* y) {
  const Tensor &x = nd.in[0], &h = nd.in[1], &w_ih = nd.in[2], &w_hh = nd.in[3];
  const int64_t B = x.dim(0), I = x.dim(1), H = h.dim(1);
  T* gi = be.temp<T>(B * 3 * H);  // [B, 3H]
  T* gh = be.temp<T>(B * 3 * H);  // [B, 3H]
  be.gemm(false, true, B, 3 * H, I, T(1), in<T>(x), I, in<T>(w_ih), I, T(0), gi, 3 * H);
  be.gemm(false, true, B, 3 * H, H, T(1), in<T>(h), H, in<T>(w_hh), H, T(0), gh, 3 * H);
  gru_gates_forward<T>(be.stream(), B, H, gi, gh, in<T>(nd.in[4]), in<T>(nd.in[5]), in<T>(h), S, y);
}

// Row-strided device copy: `rows` rows of `width` bytes.
void copy_rows(cudaStream_t s, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  if (!width || !rows) return;
  SEGTAPE_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, s));
}

template <class T>
void forward_typed(CudaBackend& be, Node& nd) {
  const cudaStream_t s = be.stream();
  const Tensor& a = nd.in[0];
  const Tensor& o = nd.out;
  const int64_t n = o.numel();
  switch (nd.op) {
    case OpKind::MatMul: {
      const detail::MatmulShape m = detail::matmul_shape(nd);
      be.gemm(m.ta, m.tb, m.M, m.N, m.K, T(1), in<T>(a), a.dim(1), in<T>(nd.in[1]), nd.in[1].dim(1), T(0), out<T>(o), m.N);
      return;
    }
#define SEGTAPE_BINARY_CASE(Kind, ...) \
  case OpKind::Kind: return binary_forward<ops::Kind, T>(s, in<T>(a), in<T>(nd.in[1]), out<T>(o), n, nd.in[1].numel());
    SEGTAPE_BINARY_OPS(SEGTAPE_BINARY_CASE)
#undef SEGTAPE_BINARY_CASE
#define SEGTAPE_UNARY_CASE(Kind, ...) \
  case OpKind::Kind: return unary_forward<ops::Kind, T>(s, in<T>(a), out<T>(o), n, T(nd.fa));
    SEGTAPE_UNARY_OPS(SEGTAPE_UNARY_CASE)
#undef SEGTAPE_UNARY_CASE
    case OpKind::Sum:
    case OpKind::Mean: {
      const AxisView v = nd.ia[0] < 0 ? AxisView{1, a.numel(), 1} : axis_view(a.shape, int(nd.ia[0]));
      reduce_axis<T>(s, in<T>(a), out<T>(o), v.outer, v.n, v.inner, nd.op == OpKind::Mean ? T(v.n) : T(1), be.partials<T>());
      return;
    }
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      softmax_forward<T>(s, in<T>(a), out<T>(o), a.shape.rows(), a.shape.last(), nd.op == OpKind::LogSoftmax);
      return;
    case OpKind::CrossEntropy: {
      const int64_t B = a.dim(0), C = a.dim(1);
      cross_entropy_forward<T>(s, in<T>(a), in<int64_t>(nd.in[1]), B, C, nd.ia[1], Reduction(nd.ia[0]) == Reduction::Mean,
                               static_cast<T*>(nd.saved), be.temp<T>(2 * B), out<T>(o), be.errors());
      return;
    }
    case OpKind::MseLoss:
      mse_forward<T>(s, in<T>(a), in<T>(nd.in[1]), a.numel(), Reduction(nd.ia[0]) == Reduction::Mean, out<T>(o),
                     be.partials<T>());
      return;
    case OpKind::Concat: {
      const AxisView v = axis_view(o.shape, int(nd.ia[0]));
      int64_t off = 0;  // elements into a row of the output
      for (int p = 0; p < nd.n_in; ++p) {
        const int64_t w = nd.in[p].dim(int(nd.ia[0])) * v.inner;
        copy_rows(s, out<T>(o) + off, size_t(v.n * v.inner) * sizeof(T), nd.in[p].ptr, size_t(w) * sizeof(T),
                  size_t(w) * sizeof(T), size_t(v.outer));
        off += w;
      }
      return;
    }
    case OpKind::Slice: {
      const AxisView v = axis_view(a.shape, int(nd.ia[0]));
      const int64_t start = nd.ia[1], len = nd.ia[2];
      copy_rows(s, o.ptr, size_t(len * v.inner) * sizeof(T), in<T>(a) + start * v.inner, size_t(v.n * v.inner) * sizeof(T),
                size_t(len * v.inner) * sizeof(T), size_t(v.outer));
      return;
    }
    case OpKind::Transpose:
      transpose<T>(s, in<T>(a), out<T>(o), a.dim(0), a.dim(1), false);
      return;
    case OpKind::Embedding:
      embedding_forward<T>(s, in<T>(a), in<int64_t>(nd.in[1]), out<T>(o), nd.in[1].numel(), a.dim(0), a.dim(1), be.errors());
      return;
    case OpKind::GruCell:
      gru_gates<T>(be, nd, static_cast<T*>(nd.saved), out<T>(o));
      return;
    case OpKind::Reshape:      // a view: nothing to compute
    case OpKind::Input:        // leaves and backward's buffers: not computed
    case OpKind::Grad:
    case OpKind::GruSequence:  // CudaBackend::forward sends it to gru_sequence.cpp
    case OpKind::Count: break;
  }
  throw TapeError(std::string("CUDA backend: no forward for op ") + op_name(nd.op));
}

template <class T>
void backward_typed(CudaBackend& be, const Node& nd, const T* g, const std::array<void*, Node::kMaxInputs>& dst) {
  const cudaStream_t s = be.stream();
  const Tensor& a = nd.in[0];
  const Tensor& o = nd.out;
  T* da = static_cast<T*>(dst[0]);
  T* db = static_cast<T*>(dst[1]);
  const T* x = in<T>(a);
  const T* y = in<T>(o);
  const int64_t n = o.numel();
  switch (nd.op) {
    case OpKind::MatMul: {
      const detail::MatmulShape m = detail::matmul_shape(nd);
      auto gemm = [&be](auto... args) { be.gemm(args...); };
      detail::matmul_backward<T>(gemm, m.ta, m.tb, m.M, m.N, m.K, g, x, a.dim(1), in<T>(nd.in[1]), nd.in[1].dim(1), da, db);
      return;
    }
#define SEGTAPE_BINARY_CASE(Kind, ...)                                                                   \
  case OpKind::Kind:                                                                                     \
    if (da) binary_backward_a<ops::Kind, T>(s, g, x, in<T>(nd.in[1]), da, n, nd.in[1].numel());          \
    if (db) binary_backward_b<ops::Kind, T>(s, g, x, in<T>(nd.in[1]), db, n, nd.in[1].numel(), be.partials<T>()); \
    return;
    SEGTAPE_BINARY_OPS(SEGTAPE_BINARY_CASE)
#undef SEGTAPE_BINARY_CASE
#define SEGTAPE_UNARY_CASE(Kind, ...) \
  case OpKind::Kind:                  \
    if (da) unary_backward<ops::Kind, T>(s, g, x, y, da, n, T(nd.fa)); \
    return;
    SEGTAPE_UNARY_OPS(SEGTAPE_UNARY_CASE)
#undef SEGTAPE_UNARY_CASE
    case OpKind::Sum:
    case OpKind::Mean: {
      const AxisView v = nd.ia[0] < 0 ? AxisView{1, a.numel(), 1} : axis_view(a.shape, int(nd.ia[0]));
      if (da) reduce_axis_backward<T>(s, g, da, v.outer, v.n, v.inner, nd.op == OpKind::Mean ? T(1) / T(v.n) : T(1));
      return;
    }
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      if (da) softmax_backward<T>(s, g, y, da, o.shape.rows(), o.shape.last(), nd.op == OpKind::LogSoftmax);
      return;
    case OpKind::CrossEntropy:
      if (da)
        cross_entropy_backward<T>(s, g, x, in<int64_t>(nd.in[1]), static_cast<const T*>(nd.saved), a.dim(0), a.dim(1), nd.ia[1],
                                  Reduction(nd.ia[0]) == Reduction::Mean, da);
      return;
    case OpKind::MseLoss:
      mse_backward<T>(s, g, x, in<T>(nd.in[1]), a.numel(), Reduction(nd.ia[0]) == Reduction::Mean, da, db);
      return;
    case OpKind::Concat: {
      const AxisView v = axis_view(o.shape, int(nd.ia[0]));
      int64_t off = 0;
      for (int p = 0; p < nd.n_in; ++p) {
        const int64_t w = nd.in[p].dim(int(nd.ia[0])) * v.inner;
        if (T* dp = static_cast<T*>(dst[size_t(p)])) add_strided<T>(s, dp, w, g + off, v.n * v.inner, v.outer, w);
        off += w;
      }
      return;
    }
    case OpKind::Slice: {
      const AxisView v = axis_view(a.shape, int(nd.ia[0]));
      const int64_t start = nd.ia[1], len = nd.ia[2];
      if (da) add_strided<T>(s, da + start * v.inner, v.n * v.inner, g, len * v.inner, v.outer, len * v.inner);
      return;
    }
    case OpKind::Reshape:
      if (da) accumulate<T>(s, da, g, n);
      return;
    case OpKind::Transpose:  // g [C, R] -> da [R, C]
      if (da) transpose<T>(s, g, da, o.dim(0), o.dim(1), true);
      return;
    case OpKind::Embedding:
      if (da) embedding_backward<T>(s, g, in<int64_t>(nd.in[1]), da, nd.in[1].numel(), a.dim(0), a.dim(1));
      return;
    case OpKind::GruCell: {
      const Tensor &xin = nd.in[0], &hin = nd.in[1], &w_ih = nd.in[2], &w_hh = nd.in[3];
      const int64_t B = xin.dim(0), I = xin.dim(1), H = hin.dim(1);
      const T* S = static_cast<const T*>(nd.saved);
      if (!S) {  // recompute mode: the gates again, from the inputs
        T* R = be.temp<T>(B * 4 * H);
        gru_gates<T>(be, nd, R, nullptr);
        S = R;
      }
      T* dgi = be.temp<T>(B * 3 * H);  // d(x W_ih^T + b_ih) [B, 3H]
      T* dgh = be.temp<T>(B * 3 * H);  // d(h W_hh^T + b_hh) [B, 3H]
      T* dh = static_cast<T*>(dst[1]);
      gru_gates_backward<T>(s, B, H, g, in<T>(hin), S, dgi, dgh, dh);
      if (T* dx = static_cast<T*>(dst[0])) be.gemm(false, false, B, I, 3 * H, T(1), dgi, 3 * H, in<T>(w_ih), I, T(1), dx, I);
      if (dh) be.gemm(false, false, B, H, 3 * H, T(1), dgh, 3 * H, in<T>(w_hh), H, T(1), dh, H);
      if (T* d = static_cast<T*>(dst[2])) be.gemm(true, false, 3 * H, I, B, T(1), dgi, 3 * H, in<T>(xin), I, T(1), d, I);
      if (T* d = static_cast<T*>(dst[3])) be.gemm(true, false, 3 * H, H, B, T(1), dgh, 3 * H, in<T>(hin), H, T(1), d, H);
      if (T* d = static_cast<T*>(dst[4])) column_sums<T>(s, dgi, d, B, 3 * H, be.partials<T>());
      if (T* d = static_cast<T*>(dst[5])) column_sums<T>(s, dgh, d, B, 3 * H, be.partials<T>());
      return;
    }
    case OpKind::Input:
    case OpKind::Grad:
    case OpKind::GruSequence:  // CudaBackend::backward sends it to gru_sequence.cpp
    case OpKind::Count: break;
  }
  throw TapeError(std::string("CUDA backend: no backward rule for op ") + op_name(nd.op));
}

using detail::fnv_mix;
void fnv_mix(uint64_t& h, const Tensor& t) {
  fnv_mix(h, reinterpret_cast<uintptr_t>(t.ptr));
  fnv_mix(h, uint64_t(t.dtype) << 8 | uint64_t(t.shape.rank));
  for (int i = 0; i < t.shape.rank; ++i) fnv_mix(h, uint64_t(t.shape.dims[size_t(i)]));
}

}  // namespace

void forward_op(CudaBackend& be, Tape&, Node& n) {
  if (n.out.dtype == DType::F32) forward_typed<float>(be, n);
  else forward_typed<double>(be, n);
}

void backward_op(CudaBackend& be, Tape&, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst) {
  if (n.out.dtype == DType::F32) backward_typed<float>(be, n, static_cast<const float*>(gout), dst);
  else backward_typed<double>(be, n, static_cast<const double*>(gout), dst);
}

uint64_t signature(const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>* dst) {
  uint64_t h = detail::kFnvOffset;
  fnv_mix(h, uint64_t(n.op) | uint64_t(n.n_in) << 8 | uint64_t(dst ? 1 : 0) << 16);
  fnv_mix(h, n.out);
  for (int i = 0; i < n.n_in; ++i) fnv_mix(h, n.in[size_t(i)]);
  for (int64_t v : n.ia) fnv_mix(h, uint64_t(v));
  uint64_t fa = 0;
  std::memcpy(&fa, &n.fa, sizeof fa);
  fnv_mix(h, fa);
  fnv_mix(h, reinterpret_cast<uintptr_t>(n.saved));
  fnv_mix(h, reinterpret_cast<uintptr_t>(gout));
  if (dst)
    for (void* p : *dst) fnv_mix(h, reinterpret_cast<uintptr_t>(p));
  return h;
}

}  // namespace segtape::cuda
