// Data movement: concat, slice, reshape (a view), detach, transpose,
// embedding (a row gather), copy_into.
#include <cstring>

#include "backend.h"
#include "ops/op.h"
#ifdef SEGTAPE_HAVE_CUDA
#include "cuda/op_util.h"
#endif
#include "tape_internals.h"

namespace segtape {

using In = detail::TapeInternals;

using detail::AxisView;
using detail::axis_view;

Tensor concat(std::initializer_list<Tensor> parts, int axis) { return concat(std::span<const Tensor>(parts.begin(), parts.size()), axis); }

Tensor concat(std::span<const Tensor> parts, int axis) {
  const char* op = "concat";
  if (parts.empty()) throw ShapeError("concat: no tensors given");
  if (parts.size() > size_t(Node::kMaxInputs)) {
    // A node holds at most G = kMaxInputs inputs. More parts are split into G
    // runs of nearly equal length, each concatenated the same way (a run of
    // one part is used as it is), then the runs in one node: a balanced tree,
    // so every byte is copied about log_G(n) times (a chain of groups would
    // copy the growing head again for every group: O(n^2 / G) bytes). No heap.
    constexpr size_t G = Node::kMaxInputs;
    const size_t n = parts.size();
    std::array<Tensor, G> runs;
    for (size_t r = 0, at = 0; r < G; ++r) {
      const size_t len = n / G + (r < n % G ? 1 : 0);
      runs[r] = len == 1 ? parts[at] : concat(parts.subspan(at, len), axis);
      at += len;
    }
    return concat(std::span<const Tensor>(runs.data(), G), axis);
  }
  const Tensor& a = parts[0];
  Tape& t = ops::check(op, {&a}, true);
  const int ax = ops::norm_axis(op, a, axis);
  if (parts.size() == 1) return a;  // nothing to join: the part itself, like a view (no copy, no node)
  Shape os = a.shape;
  int64_t total = 0;
  for (const Tensor& p : parts) {
    ops::check(op, {&a, &p}, true);
    bool ok = p.rank() == a.rank();
    for (int i = 0; ok && i < a.rank(); ++i) ok = i == ax || p.dim(i) == a.dim(i);
    if (!ok) ops::shape_error(op, "shapes differ outside axis " + std::to_string(ax), {&a, &p});
    total += p.dim(ax);
  }
  if (total > INT32_MAX)
    throw ShapeError("concat: " + std::to_string(parts.size()) + " parts of " + a.describe() + " make axis " +
                     std::to_string(ax) + " " + std::to_string(total) + " long, more than a dimension can hold (2^31 - 1)");
  os.dims[ax] = int32_t(total);
  os.check_elements(op);
  Node n = ops::node(OpKind::Concat, parts);
  n.ia[0] = ax;
  n.reads = 0;  // shape ops: backward moves the gradient only
  return ops::emit(t, n, os, op);
}

Tensor slice(const Tensor& a, int axis, int64_t start, int64_t length) {
  const char* op = "slice";
  Tape& t = ops::check(op, {&a}, true);
  const int ax = ops::norm_axis(op, a, axis);
  if (start < 0 || length < 0 || start > a.dim(ax) || length > a.dim(ax) - start)  // (no start + length: it may overflow)
    throw ShapeError("slice: start " + std::to_string(start) + ", length " + std::to_string(length) +
                     " outside axis " + std::to_string(ax) + " of " + a.describe());
  Shape os = a.shape;
  os.dims[ax] = int32_t(length);
  Node n = ops::node(OpKind::Slice, {a});
  n.ia = {ax, start, length, 0};
  n.reads = 0;
  return ops::emit(t, n, os, op);
}

// A view: the same bytes under another shape. Recorded (no bytes) so the
// gradient flows back to a's node; nothing to compute.
Tensor reshape(const Tensor& a, const Shape& s) {
  Tape& t = ops::check("reshape", {&a}, true);
  s.check("reshape");
  if (s.numel() != a.numel()) throw ShapeError("reshape: cannot view " + a.describe() + " as " + s.str());
  Node n = ops::node(OpKind::Reshape, {a});
  n.reads = 0;
  n.out = a;
  n.out.shape = s;
  n.out.node = -1;
  n.out.requires_grad = false;
  n.out.grad = nullptr;
  In::check_output(t, n.out, OpKind::Reshape);
  if (!In::wants_grad(t, std::span<const Tensor>(n.in.data(), 1))) return n.out;
  return In::record(t, n).out;
}

Tensor detach(const Tensor& a) {
  a.check_live("detach");
  ops::require_segment(*a.tape, "detach");
  Tensor out = a;
  out.node = -1;
  out.requires_grad = false;
  out.grad = nullptr;
  return out;
}

Tensor transpose(const Tensor& a) {
  Tape& t = ops::check("transpose", {&a}, true);
  if (a.rank() != 2) ops::shape_error("transpose", "expects a 2-D tensor", {&a});
  Node n = ops::node(OpKind::Transpose, {a});
  n.reads = 0;
  return ops::emit(t, n, {a.dim(1), a.dim(0)}, "transpose");
}

Tensor embedding(const Tensor& w, const Tensor& idx) {
  const char* op = "embedding";
  Tape& t = ops::check(op, {&w});
  ops::check_index(op, t, idx, {&w, &idx});
  if (idx.dtype != DType::I64) ops::shape_error(op, "indices must be int64", {&w, &idx});
  if (w.rank() != 2) ops::shape_error(op, "weight must be 2-D [num, dim]", {&w, &idx});
  if (idx.rank() >= Shape::kMaxRank) ops::shape_error(op, "indices of rank <= 3", {&w, &idx});
  Shape os = idx.shape;
  os.dims[os.rank++] = w.shape.dims[1];
  Node n = ops::node(OpKind::Embedding, {w, idx});
  n.reads = 2;  // backward: the indices
  return ops::emit(t, n, os, w.dtype, op);
}

void copy_into(const Tensor& dst, const Tensor& src) {
  dst.check_live("copy_into (destination)");
  src.check_live("copy_into (source)");
  if (!(dst.shape == src.shape) || dst.dtype != src.dtype)
    throw ShapeError("copy_into: destination " + dst.describe() + " and source " + src.describe() + " differ");
  if (dst.on_device() != src.on_device())
    throw TapeError("copy_into: destination " + dst.describe() + " on " + dst.tape->device().str() + " and source " +
                    src.describe() + " on " + src.tape->device().str() +
                    ": copy between devices through the host (to_host / from_host)");
  if (dst.ptr == src.ptr || !src.nbytes()) return;
  detail::tensor_written(dst, "copy_into");  // (a weight, or a view of one: by its bytes)
  In::backend(*dst.tape)->copy(dst.ptr, src.ptr, src.nbytes(), detail::Backend::Copy::DeviceToDevice);
}

namespace {
// Concat's parts in order: f(p, w, off) with w the part's elements per outer
// row and off where they start in a row of the output (v: the output around the axis).
template <class F>
void for_each_part(const Node& n, const AxisView& v, F f) {
  int64_t off = 0;
  for (int p = 0; p < n.n_in; ++p) {
    const int64_t w = n.in[p].dim(int(n.ia[0])) * v.inner;
    f(p, w, off);
    off += w;
  }
}
}  // namespace

namespace ops {

void concat_forward_cpu(Node& n) {
  const AxisView v = axis_view(n.out.shape, int(n.ia[0]));
  const size_t es = dtype_size(n.out.dtype);
  for_each_part(n, v, [&](int p, int64_t w, int64_t off) {
    for (int64_t o = 0; o < v.outer; ++o)
      std::memcpy(static_cast<char*>(n.out.ptr) + size_t(o * v.n * v.inner + off) * es,
                  static_cast<const char*>(n.in[p].ptr) + size_t(o * w) * es, size_t(w) * es);
  });
}

void concat_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  const AxisView v = axis_view(n.out.shape, int(n.ia[0]));
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    for_each_part(n, v, [&](int p, int64_t w, int64_t off) {
      if (T* dp = static_cast<T*>(d[size_t(p)]))
        for (int64_t o = 0; o < v.outer; ++o)
          for (int64_t i = 0; i < w; ++i) dp[o * w + i] += g[o * v.n * v.inner + off + i];
    });
  });
}

void slice_forward_cpu(Node& n) {
  const Tensor& a = n.in[0];
  const AxisView v = axis_view(a.shape, int(n.ia[0]));
  const int64_t start = n.ia[1], len = n.ia[2];
  const size_t es = dtype_size(a.dtype);
  for (int64_t o = 0; o < v.outer; ++o)
    std::memcpy(static_cast<char*>(n.out.ptr) + size_t(o * len * v.inner) * es,
                static_cast<const char*>(a.ptr) + size_t((o * v.n + start) * v.inner) * es, size_t(len * v.inner) * es);
}

void slice_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  if (!d[0]) return;
  const AxisView v = axis_view(n.in[0].shape, int(n.ia[0]));
  const int64_t start = n.ia[1], len = n.ia[2];
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    T* da = static_cast<T*>(d[0]);
    for (int64_t o = 0; o < v.outer; ++o)
      for (int64_t i = 0; i < len * v.inner; ++i) da[(o * v.n + start) * v.inner + i] += g[o * len * v.inner + i];
  });
}

void reshape_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  if (!d[0]) return;
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    T* da = static_cast<T*>(d[0]);
    for (int64_t i = 0, m = n.out.numel(); i < m; ++i) da[i] += g[i];
  });
}

void transpose_forward_cpu(Node& n) {
  const int64_t R = n.in[0].dim(0), C = n.in[0].dim(1);
  auto move = [&]<class T>() {  // (words of the element's size: float32, or float64 and int64 alike)
    const T* x = static_cast<const T*>(n.in[0].ptr);
    T* y = static_cast<T*>(n.out.ptr);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) y[c * R + r] = x[r * C + c];
  };
  if (dtype_size(n.out.dtype) == 4) move.operator()<uint32_t>();
  else move.operator()<uint64_t>();
}

void transpose_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  if (!d[0]) return;
  const int64_t R = n.in[0].dim(0), C = n.in[0].dim(1);
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    T* da = static_cast<T*>(d[0]);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) da[r * C + c] += g[c * R + r];
  });
}

// The CPU checks every index before copying; a device kernel records a bad
// one and the host reports it at the next synchronisation.
void embedding_forward_cpu(Node& n) {
  const Tensor &w = n.in[0], &idx = n.in[1];
  const int64_t N = w.dim(0);
  const int64_t* ix = static_cast<const int64_t*>(idx.ptr);
  for (int64_t i = 0; i < idx.numel(); ++i)
    if (ix[i] < 0 || ix[i] >= N)
      throw IndexError("embedding: index " + std::to_string(ix[i]) + " at position " + std::to_string(i) +
                       " is out of range for " + std::to_string(N) + " rows (weight " + w.describe() + ")");
  const size_t row = size_t(w.dim(1)) * dtype_size(w.dtype);
  for (int64_t i = 0; i < idx.numel(); ++i)
    std::memcpy(static_cast<char*>(n.out.ptr) + size_t(i) * row, static_cast<const char*>(w.ptr) + size_t(ix[i]) * row, row);
}

void embedding_backward_cpu(const Node& n, const void* gout, const Grads& d) {
  if (!d[0]) return;
  const int64_t D = n.in[0].dim(1);
  const int64_t* ix = static_cast<const int64_t*>(n.in[1].ptr);
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    T* da = static_cast<T*>(d[0]);
    for (int64_t i = 0; i < n.in[1].numel(); ++i)
      for (int64_t j = 0; j < D; ++j) da[ix[i] * D + j] += g[i * D + j];
  });
}

}  // namespace ops
#ifdef SEGTAPE_HAVE_CUDA
// ---- CUDA (engine/cuda/op_table.cpp dispatches here; kernels in cuda/kernels.h)
namespace ops {
using cuda::in;
using cuda::out;

void concat_forward_cuda(cuda::CudaBackend& be, Node& n) {
  const AxisView v = axis_view(n.out.shape, int(n.ia[0]));
  const size_t es = dtype_size(n.out.dtype);
  for_each_part(n, v, [&](int p, int64_t w, int64_t off) {
    cuda::copy_rows(be.stream(), static_cast<char*>(n.out.ptr) + size_t(off) * es, size_t(v.n * v.inner) * es, n.in[p].ptr,
                    size_t(w) * es, size_t(w) * es, size_t(v.outer));
  });
}

void concat_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* gout, const Grads& d) {
  const AxisView v = axis_view(n.out.shape, int(n.ia[0]));
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const T* g = static_cast<const T*>(gout);
    for_each_part(n, v, [&](int p, int64_t w, int64_t off) {
      if (T* dp = static_cast<T*>(d[size_t(p)])) cuda::add_strided<T>(be.stream(), dp, w, g + off, v.n * v.inner, v.outer, w);
    });
  });
}

void slice_forward_cuda(cuda::CudaBackend& be, Node& n) {
  const Tensor& a = n.in[0];
  const AxisView v = axis_view(a.shape, int(n.ia[0]));
  const int64_t start = n.ia[1], len = n.ia[2];
  const size_t es = dtype_size(a.dtype);
  cuda::copy_rows(be.stream(), n.out.ptr, size_t(len * v.inner) * es, static_cast<const char*>(a.ptr) + size_t(start * v.inner) * es,
                  size_t(v.n * v.inner) * es, size_t(len * v.inner) * es, size_t(v.outer));
}

void slice_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {
  if (!d[0]) return;
  const AxisView v = axis_view(n.in[0].shape, int(n.ia[0]));
  const int64_t start = n.ia[1], len = n.ia[2];
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::add_strided<T>(be.stream(), static_cast<T*>(d[0]) + start * v.inner, v.n * v.inner, static_cast<const T*>(g),
                         len * v.inner, v.outer, len * v.inner);
  });
}

void reshape_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {
  if (!d[0]) return;
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::accumulate<T>(be.stream(), static_cast<T*>(d[0]), static_cast<const T*>(g), n.out.numel());
  });
}

void transpose_forward_cuda(cuda::CudaBackend& be, Node& n) {
  // (int64 as float64: the kernel's plain load and store move the 8 bytes as they are)
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::transpose<T>(be.stream(), in<T>(n.in[0]), out<T>(n.out), n.in[0].dim(0), n.in[0].dim(1), false);
  });
}

void transpose_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {  // g [C, R] -> da [R, C]
  if (!d[0]) return;
  detail::dispatch(n.out.dtype, [&]<class T>() {
    cuda::transpose<T>(be.stream(), static_cast<const T*>(g), static_cast<T*>(d[0]), n.out.dim(0), n.out.dim(1), true);
  });
}

// The device checks the indices in its kernel: a bad one is reported at the next synchronisation.
void embedding_forward_cuda(cuda::CudaBackend& be, Node& n) {
  const Tensor& w = n.in[0];
  detail::dispatch(w.dtype, [&]<class T>() {
    cuda::embedding_forward<T>(be.stream(), in<T>(w), in<int64_t>(n.in[1]), out<T>(n.out), n.in[1].numel(), w.dim(0), w.dim(1),
                               be.errors());
  });
}

void embedding_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d) {
  if (!d[0]) return;
  const Tensor& w = n.in[0];
  detail::dispatch(w.dtype, [&]<class T>() {
    cuda::embedding_backward<T>(be.stream(), static_cast<const T*>(g), in<int64_t>(n.in[1]), static_cast<T*>(d[0]),
                                n.in[1].numel(), w.dim(0), w.dim(1));
  });
}

}  // namespace ops
#endif  // SEGTAPE_HAVE_CUDA

}  // namespace segtape
