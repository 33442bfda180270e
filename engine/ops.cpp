// Every op: shape checks and forward here, its backward rule in backward_node()
// below, both on the CPU through plain loops and BLAS (cpu/blas.h). On a
// device tape the same entry points check and record exactly as on the CPU,
// and the computing part goes to the backend instead (engine/backend.h):
// `if (!device_forward(...)) <CPU code>` marks each such place.
#include "segtape/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend.h"
#include "cpu/blas.h"
#include "cpu/vmath.h"
#include "ops_internal.h"

namespace segtape {
namespace {

using detail::dispatch;

std::string list(std::initializer_list<const Tensor*> ts) {
  std::string s;
  for (const Tensor* t : ts) s += (s.empty() ? "" : " and ") + t->describe();
  return s;
}

// Every op needs an open segment, views included: its output and any node
// it records belong to that segment.
void require_segment(const Tape& t, const char* op) {
  if (!t.segment_open())
    throw TapeError(std::string(op) + ": no segment is open; open one with tape.segment() (an op's output and its "
                    "tape node belong to the open segment)");
}

// Every op's entry check: defined, live, one tape, an open segment, and
// (unless ints are allowed) one floating dtype shared by all inputs.
Tape& check(const char* op, std::initializer_list<const Tensor*> ts) {
  Tape* tape = nullptr;
  DType d = DType::F32;
  bool first = true;
  for (const Tensor* t : ts) {
    t->check_live(op);
    if (!tape) tape = t->tape;
    else if (tape != t->tape) throw TapeError(std::string(op) + ": inputs belong to different tapes");
    if (t->dtype == DType::I64) throw ShapeError(std::string(op) + ": expects floating-point inputs, got " + t->describe());
    if (first) d = t->dtype, first = false;
    else if (t->dtype != d) throw ShapeError(std::string(op) + ": dtypes differ: " + list(ts));
  }
  require_segment(*tape, op);
  return *tape;
}

[[noreturn]] void shape_error(const char* op, const std::string& why, std::initializer_list<const Tensor*> ts) {
  throw ShapeError(std::string(op) + ": " + why + ": " + list(ts));
}

// On a device tape: the backend computes op k's output (and saved buffer)
// from the inputs and attributes the node will record; false on the CPU.
Node device_node(OpKind k, const Tensor& out, std::span<const Tensor> ins, std::array<int64_t, 4> ia, double fa, void* saved) {
  Node n;
  n.op = k;
  n.n_in = uint8_t(ins.size());
  for (size_t i = 0; i < ins.size(); ++i) n.in[i] = ins[i];
  n.out = out;
  n.ia = ia;
  n.fa = fa;
  n.saved = saved;
  return n;
}
bool device_forward(Tape& t, OpKind k, const Tensor& out, std::span<const Tensor> ins, std::array<int64_t, 4> ia = {},
                    double fa = 0, void* saved = nullptr) {
  detail::Backend* be = t.backend();
  if (!detail::device_computes(be)) return false;
  Node n = device_node(k, out, ins, ia, fa, saved);
  be->forward(t, n);
  return true;
}
bool device_forward(Tape& t, OpKind k, const Tensor& out, std::initializer_list<Tensor> ins, std::array<int64_t, 4> ia = {},
                    double fa = 0, void* saved = nullptr) {
  return device_forward(t, k, out, std::span<const Tensor>(ins.begin(), ins.size()), ia, fa, saved);
}

Node* finish(Tape& t, OpKind k, Tensor& out, std::initializer_list<Tensor> ins, size_t bytes) {
  t.check_output(out, k);
  if (!t.wants_grad(ins)) return nullptr;
  return &t.record(k, out, ins, bytes);
}

// b broadcasts over a when it has a's shape, a's last dim, or one element.
void check_broadcast(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape == b.shape) return;
  if (b.numel() == 1) return;
  const bool row = b.numel() == a.shape.last() && a.rank() >= 1 &&
                   (b.rank() == 1 || (b.rank() == 2 && b.dim(0) == 1));
  if (!row) shape_error(op, "shapes do not broadcast (b must have a's shape, a's last dimension, or one element)", {&a, &b});
}

template <class T, class F>
void binary_loop(const T* a, const T* b, T* o, int64_t n, int64_t bn, F f) {
  if (n == 0) return;
  for (int64_t r = 0; r < n; r += bn)
    for (int64_t c = 0; c < bn; ++c) o[r + c] = f(a[r + c], b[c]);
}

Tensor binary(OpKind k, const char* op, const Tensor& a, const Tensor& b) {
  Tape& t = check(op, {&a, &b});
  check_broadcast(op, a, b);
  Tensor out = t.make(a.shape, a.dtype, k, op);
  if (!device_forward(t, k, out, {a, b})) dispatch(a.dtype, [&]<class T>() {
    const T* pa = static_cast<const T*>(a.ptr);
    const T* pb = static_cast<const T*>(b.ptr);
    T* po = static_cast<T*>(out.ptr);
    const int64_t n = a.numel(), bn = b.numel();
    switch (k) {
      case OpKind::Add: binary_loop(pa, pb, po, n, bn, [](T x, T y) { return x + y; }); break;
      case OpKind::Sub: binary_loop(pa, pb, po, n, bn, [](T x, T y) { return x - y; }); break;
      case OpKind::Mul: binary_loop(pa, pb, po, n, bn, [](T x, T y) { return x * y; }); break;
      default: binary_loop(pa, pb, po, n, bn, [](T x, T y) { return x / y; }); break;
    }
  });
  finish(t, k, out, {a, b}, out.nbytes());
  return out;
}

Tensor unary(OpKind k, const char* op, const Tensor& a, double s = 0) {
  Tape& t = check(op, {&a});
  Tensor out = t.make(a.shape, a.dtype, k, op);
  if (!device_forward(t, k, out, {a}, {}, s)) dispatch(a.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(a.ptr);
    T* y = static_cast<T*>(out.ptr);
    const int64_t n = a.numel();
    const T sc = T(s);
    switch (k) {
      case OpKind::Neg: for (int64_t i = 0; i < n; ++i) y[i] = -x[i]; break;
      case OpKind::Scale: for (int64_t i = 0; i < n; ++i) y[i] = sc * x[i]; break;
      case OpKind::Tanh: for (int64_t i = 0; i < n; ++i) y[i] = cpu::vtanh<T>(x[i]); break;
      case OpKind::Sigmoid: for (int64_t i = 0; i < n; ++i) y[i] = cpu::vsigmoid<T>(x[i]); break;
      case OpKind::Relu: for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0); break;
      case OpKind::Exp: for (int64_t i = 0; i < n; ++i) y[i] = cpu::vexp<T>(x[i]); break;
      default: for (int64_t i = 0; i < n; ++i) y[i] = std::log(x[i]); break;
    }
  });
  if (Node* nd = finish(t, k, out, {a}, out.nbytes())) nd->fa = s;
  return out;
}

using detail::AxisView;
using detail::axis_view;

int norm_axis(const char* op, const Tensor& a, int axis) {
  const int ax = axis < 0 ? axis + a.rank() : axis;
  if (ax < 0 || ax >= a.rank())
    throw ShapeError(std::string(op) + ": axis " + std::to_string(axis) + " out of range for " + a.describe());
  return ax;
}

Tensor reduce(OpKind k, const char* op, const Tensor& a, int axis, bool all) {
  Tape& t = check(op, {&a});
  int ax = all ? -1 : norm_axis(op, a, axis);
  Shape os;
  if (!all)
    for (int i = 0; i < a.rank(); ++i)
      if (i != ax) os.dims[os.rank++] = a.shape.dims[i];
  Tensor out = t.make(os, a.dtype, k, op);
  const AxisView v = all ? AxisView{1, a.numel(), 1} : axis_view(a.shape, ax);
  const bool is_mean = k == OpKind::Mean;
  if (!device_forward(t, k, out, {a}, {ax, 0, 0, 0})) dispatch(a.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(a.ptr);
    T* y = static_cast<T*>(out.ptr);
    for (int64_t o = 0; o < v.outer; ++o)
      for (int64_t i = 0; i < v.inner; ++i) {
        T acc = 0;
        for (int64_t j = 0; j < v.n; ++j) acc += x[(o * v.n + j) * v.inner + i];
        y[o * v.inner + i] = is_mean ? acc / T(v.n) : acc;
      }
  });
  if (Node* nd = finish(t, k, out, {a}, out.nbytes())) nd->ia[0] = ax;
  return out;
}

Tensor softmax_impl(OpKind k, const char* op, const Tensor& a) {
  Tape& t = check(op, {&a});
  if (a.rank() < 1) shape_error(op, "needs rank >= 1", {&a});
  Tensor out = t.make(a.shape, a.dtype, k, op);
  const int64_t C = a.shape.last(), R = a.shape.rows();
  if (!device_forward(t, k, out, {a})) dispatch(a.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(a.ptr);
    T* y = static_cast<T*>(out.ptr);
    for (int64_t r = 0; r < R; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < C; ++c) m = std::max(m, xr[c]);
      T s = 0;
      for (int64_t c = 0; c < C; ++c) s += cpu::vexp<T>(xr[c] - m);
      if (k == OpKind::Softmax) {
        const T inv = T(1) / s;
        for (int64_t c = 0; c < C; ++c) yr[c] = cpu::vexp<T>(xr[c] - m) * inv;
      } else {
        const T lse = m + std::log(s);
        for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] - lse;
      }
    }
  });
  finish(t, k, out, {a}, out.nbytes());
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Tape& t = check("matmul", {&a, &b});
  if (a.rank() != 2 || b.rank() != 2) shape_error("matmul", "expects 2-D tensors", {&a, &b});
  const int64_t M = ta ? a.dim(1) : a.dim(0), K = ta ? a.dim(0) : a.dim(1);
  const int64_t Kb = tb ? b.dim(1) : b.dim(0), N = tb ? b.dim(0) : b.dim(1);
  if (K != Kb)
    shape_error("matmul", std::string("inner dimensions differ (") + std::to_string(K) + " vs " + std::to_string(Kb) +
                    (ta ? ", a transposed" : "") + (tb ? ", b transposed" : "") + ")", {&a, &b});
  Tensor out = t.make({M, N}, a.dtype, OpKind::MatMul, "matmul");
  if (!device_forward(t, OpKind::MatMul, out, {a, b}, {ta, tb, 0, 0})) dispatch(a.dtype, [&]<class T>() {
    cpu::gemm(ta, tb, M, N, K, T(1), static_cast<const T*>(a.ptr), a.dim(1), static_cast<const T*>(b.ptr), b.dim(1),
              T(0), static_cast<T*>(out.ptr), N);
  });
  if (Node* nd = finish(t, OpKind::MatMul, out, {a, b}, out.nbytes())) nd->ia = {ta, tb, 0, 0};
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(OpKind::Add, "add", a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(OpKind::Sub, "sub", a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(OpKind::Mul, "mul", a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(OpKind::Div, "div", a, b); }
Tensor neg(const Tensor& a) { return unary(OpKind::Neg, "neg", a); }
Tensor scale(const Tensor& a, double s) { return unary(OpKind::Scale, "scale", a, s); }
Tensor tanh(const Tensor& a) { return unary(OpKind::Tanh, "tanh", a); }
Tensor sigmoid(const Tensor& a) { return unary(OpKind::Sigmoid, "sigmoid", a); }
Tensor relu(const Tensor& a) { return unary(OpKind::Relu, "relu", a); }
Tensor exp(const Tensor& a) { return unary(OpKind::Exp, "exp", a); }
Tensor log(const Tensor& a) { return unary(OpKind::Log, "log", a); }
Tensor sum(const Tensor& a) { return reduce(OpKind::Sum, "sum", a, 0, true); }
Tensor mean(const Tensor& a) { return reduce(OpKind::Mean, "mean", a, 0, true); }
Tensor sum(const Tensor& a, int axis) { return reduce(OpKind::Sum, "sum", a, axis, false); }
Tensor mean(const Tensor& a, int axis) { return reduce(OpKind::Mean, "mean", a, axis, false); }
Tensor softmax(const Tensor& a) { return softmax_impl(OpKind::Softmax, "softmax", a); }
Tensor log_softmax(const Tensor& a) { return softmax_impl(OpKind::LogSoftmax, "log_softmax", a); }

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction r, int64_t ignore_index) {
  const char* op = "cross_entropy";
  Tape& t = check(op, {&logits});
  targets.check_live(op);
  if (targets.dtype != DType::I64) shape_error(op, "targets must be int64 class indices", {&logits, &targets});
  if (logits.rank() != 2 || targets.numel() != logits.dim(0))
    shape_error(op, "expects logits [B, C] and B targets", {&logits, &targets});
  const int64_t B = logits.dim(0), C = logits.dim(1);
  const int64_t* y = static_cast<const int64_t*>(targets.ptr);
  int64_t count = 0;
  // On a device the targets are checked (and counted) by the kernel; an out
  // of range target is reported at the next synchronisation.
  for (int64_t i = 0; i < B && !detail::device_computes(t.backend()); ++i) {
    if (y[i] == ignore_index) continue;
    if (y[i] < 0 || y[i] >= C)
      throw IndexError(std::string(op) + ": target " + std::to_string(y[i]) + " at row " + std::to_string(i) +
                       " is out of range for " + std::to_string(C) + " classes (logits " + logits.describe() + ")");
    ++count;
  }
  Tensor out = t.make({}, logits.dtype, OpKind::CrossEntropy, op);
  const bool g = t.wants_grad({&logits, 1});
  // Backward recomputes softmax from the logits and this per-row log-sum-exp
  // (a device also keeps the count of counted rows after them, as a T).
  const size_t saved_bytes = size_t(B + (detail::device_computes(t.backend()) ? 1 : 0)) * dtype_size(logits.dtype);
  t.scratch_reset();
  void* saved = g ? t.alloc(saved_bytes, OpKind::CrossEntropy, op) : t.scratch(saved_bytes);
  if (!device_forward(t, OpKind::CrossEntropy, out, {logits, targets}, {int64_t(r), ignore_index, 0, 0}, 0, saved))
    dispatch(logits.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(logits.ptr);
    T* lse = static_cast<T*>(saved);
    T total = 0;
    for (int64_t i = 0; i < B; ++i) {
      const T* xr = x + i * C;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < C; ++c) m = std::max(m, xr[c]);
      T s = 0;
      for (int64_t c = 0; c < C; ++c) s += cpu::vexp<T>(xr[c] - m);
      lse[i] = m + std::log(s);
      if (y[i] != ignore_index) total += lse[i] - xr[y[i]];
    }
    *static_cast<T*>(out.ptr) = r == Reduction::Mean ? total / T(count) : total;
  });
  t.check_output(out, OpKind::CrossEntropy);
  if (g) {
    Node& nd = t.record(OpKind::CrossEntropy, out, std::initializer_list<Tensor>{logits, targets}, out.nbytes() + saved_bytes);
    nd.saved = saved;
    nd.ia = {int64_t(r), ignore_index, count, 0};
  }
  return out;
}

Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction r) {
  Tape& t = check("mse_loss", {&a, &b});
  if (!(a.shape == b.shape)) shape_error("mse_loss", "shapes differ", {&a, &b});
  Tensor out = t.make({}, a.dtype, OpKind::MseLoss, "mse_loss");
  if (!device_forward(t, OpKind::MseLoss, out, {a, b}, {int64_t(r), 0, 0, 0})) dispatch(a.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(a.ptr);
    const T* y = static_cast<const T*>(b.ptr);
    T s = 0;
    for (int64_t i = 0; i < a.numel(); ++i) s += (x[i] - y[i]) * (x[i] - y[i]);
    *static_cast<T*>(out.ptr) = r == Reduction::Mean ? s / T(a.numel()) : s;
  });
  if (Node* nd = finish(t, OpKind::MseLoss, out, {a, b}, out.nbytes())) nd->ia[0] = int64_t(r);
  return out;
}

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
  Tape& t = check(op, {&a});
  const int ax = norm_axis(op, a, axis);
  if (parts.size() == 1) return a;  // nothing to join: the part itself, like a view (no copy, no node)
  Shape os = a.shape;
  int64_t total = 0;
  for (const Tensor& p : parts) {
    check(op, {&a, &p});
    bool ok = p.rank() == a.rank();
    for (int i = 0; ok && i < a.rank(); ++i) ok = i == ax || p.dim(i) == a.dim(i);
    if (!ok) shape_error(op, "shapes differ outside axis " + std::to_string(ax), {&a, &p});
    total += p.dim(ax);
  }
  os.dims[ax] = int32_t(total);
  Tensor out = t.make(os, a.dtype, OpKind::Concat, op);
  const AxisView v = axis_view(os, ax);
  const size_t es = dtype_size(a.dtype);
  int64_t off = 0;
  const bool device = device_forward(t, OpKind::Concat, out, parts, {ax, 0, 0, 0});
  for (const Tensor& p : device ? std::span<const Tensor>() : parts) {
    const int64_t w = p.dim(ax) * v.inner;
    for (int64_t o = 0; o < v.outer; ++o)
      std::memcpy(static_cast<char*>(out.ptr) + size_t((o * v.n * v.inner + off)) * es,
                  static_cast<const char*>(p.ptr) + size_t(o * w) * es, size_t(w) * es);
    off += w;
  }
  Tensor ins[Node::kMaxInputs];
  for (size_t i = 0; i < parts.size(); ++i) ins[i] = parts[i];
  t.check_output(out, OpKind::Concat);
  if (t.wants_grad(std::span<const Tensor>(ins, parts.size()))) {
    Node& nd = t.record(OpKind::Concat, out, std::span<const Tensor>(ins, parts.size()), out.nbytes());
    nd.ia[0] = ax;
  }
  return out;
}

Tensor slice(const Tensor& a, int axis, int64_t start, int64_t length) {
  const char* op = "slice";
  Tape& t = check(op, {&a});
  const int ax = norm_axis(op, a, axis);
  if (start < 0 || length < 0 || start + length > a.dim(ax))
    throw ShapeError("slice: range [" + std::to_string(start) + ", " + std::to_string(start + length) +
                     ") outside axis " + std::to_string(ax) + " of " + a.describe());
  Shape os = a.shape;
  os.dims[ax] = int32_t(length);
  Tensor out = t.make(os, a.dtype, OpKind::Slice, op);
  const AxisView v = axis_view(a.shape, ax);
  const size_t es = dtype_size(a.dtype);
  const bool device = device_forward(t, OpKind::Slice, out, {a}, {ax, start, length, 0});
  for (int64_t o = 0; o < v.outer && !device; ++o)
    std::memcpy(static_cast<char*>(out.ptr) + size_t(o * length * v.inner) * es,
                static_cast<const char*>(a.ptr) + size_t((o * v.n + start) * v.inner) * es, size_t(length * v.inner) * es);
  if (Node* nd = finish(t, OpKind::Slice, out, {a}, out.nbytes())) nd->ia = {ax, start, length, 0};
  return out;
}

Tensor reshape(const Tensor& a, const Shape& s) {
  Tape& t = check("reshape", {&a});
  if (s.numel() != a.numel()) throw ShapeError("reshape: cannot view " + a.describe() + " as " + s.str());
  Tensor out = a;
  out.shape = s;
  out.node = -1;
  out.requires_grad = false;
  out.grad = nullptr;
  finish(t, OpKind::Reshape, out, {a}, 0);
  return out;
}

Tensor detach(const Tensor& a) {
  a.check_live("detach");
  require_segment(*a.tape, "detach");
  Tensor out = a;
  out.node = -1;
  out.requires_grad = false;
  out.grad = nullptr;
  return out;
}

Tensor transpose(const Tensor& a) {
  Tape& t = check("transpose", {&a});
  if (a.rank() != 2) shape_error("transpose", "expects a 2-D tensor", {&a});
  const int64_t R = a.dim(0), C = a.dim(1);
  Tensor out = t.make({C, R}, a.dtype, OpKind::Transpose, "transpose");
  if (!device_forward(t, OpKind::Transpose, out, {a})) dispatch(a.dtype, [&]<class T>() {
    const T* x = static_cast<const T*>(a.ptr);
    T* y = static_cast<T*>(out.ptr);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) y[c * R + r] = x[r * C + c];
  });
  finish(t, OpKind::Transpose, out, {a}, out.nbytes());
  return out;
}

Tensor embedding(const Tensor& w, const Tensor& idx) {
  const char* op = "embedding";
  Tape& t = check(op, {&w});
  idx.check_live(op);
  if (idx.dtype != DType::I64) shape_error(op, "indices must be int64", {&w, &idx});
  if (w.rank() != 2) shape_error(op, "weight must be 2-D [num, dim]", {&w, &idx});
  if (idx.rank() >= Shape::kMaxRank) shape_error(op, "indices of rank <= 3", {&w, &idx});
  const int64_t N = w.dim(0), D = w.dim(1);
  const int64_t* ix = static_cast<const int64_t*>(idx.ptr);
  // On a device the kernel checks the indices (reported at the next synchronisation).
  for (int64_t i = 0; i < idx.numel() && !detail::device_computes(t.backend()); ++i)
    if (ix[i] < 0 || ix[i] >= N)
      throw IndexError(std::string(op) + ": index " + std::to_string(ix[i]) + " at position " + std::to_string(i) +
                       " is out of range for " + std::to_string(N) + " rows (weight " + w.describe() + ")");
  Shape os = idx.shape;
  os.dims[os.rank++] = int32_t(D);
  Tensor out = t.make(os, w.dtype, OpKind::Embedding, op);
  const size_t row = size_t(D) * dtype_size(w.dtype);
  const bool device = device_forward(t, OpKind::Embedding, out, {w, idx});
  for (int64_t i = 0; i < idx.numel() && !device; ++i)
    std::memcpy(static_cast<char*>(out.ptr) + size_t(i) * row, static_cast<const char*>(w.ptr) + size_t(ix[i]) * row, row);
  finish(t, OpKind::Embedding, out, {w, idx}, out.nbytes());
  return out;
}

namespace {
// One batch row of the GRU gates: restrict pointers and no branches, so the
// compiler vectorizes it (the gates dominate the step's non-GEMM time).
template <class T, bool WithY>
void gru_gate_row(int64_t H, const T* __restrict gi, const T* __restrict gh, const T* __restrict bi, const T* __restrict bh,
                  const T* __restrict hp, T* __restrict S, T* __restrict y) {
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    const T r = cpu::vsigmoid<T>(gi[j] + bi[j] + gh[j] + bh[j]);
    const T z = cpu::vsigmoid<T>(gi[H + j] + bi[H + j] + gh[H + j] + bh[H + j]);
    const T hn = gh[2 * H + j] + bh[2 * H + j];
    const T n = cpu::vtanh<T>(gi[2 * H + j] + bi[2 * H + j] + r * hn);
    S[j] = r, S[H + j] = z, S[2 * H + j] = n, S[3 * H + j] = hn;
    if constexpr (WithY) y[j] = (T(1) - z) * n + z * hp[j];
  }
}

// The GRU gates of one step into S [B, 4H] (r, z, n, W_hn h + b_hn per row);
// with y non-null also the new state y [B, H]. Pre-activations go to the op workspace.
template <class T>
void gru_gates(Tape& t, const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
               const Tensor& b_hh, T* S, T* y) {
  const int64_t B = x.dim(0), I = x.dim(1), H = h.dim(1);
  T* gi = static_cast<T*>(t.scratch(size_t(B * 3 * H) * sizeof(T)));  // [B, 3H]
  T* gh = static_cast<T*>(t.scratch(size_t(B * 3 * H) * sizeof(T)));  // [B, 3H]
  cpu::gemm(false, true, B, 3 * H, I, T(1), static_cast<const T*>(x.ptr), I, static_cast<const T*>(w_ih.ptr), I, T(0), gi, 3 * H);
  cpu::gemm(false, true, B, 3 * H, H, T(1), static_cast<const T*>(h.ptr), H, static_cast<const T*>(w_hh.ptr), H, T(0), gh, 3 * H);
  const T* bi = static_cast<const T*>(b_ih.ptr);
  const T* bh = static_cast<const T*>(b_hh.ptr);
  const T* hp = static_cast<const T*>(h.ptr);
  for (int64_t b = 0; b < B; ++b) {
    if (y) gru_gate_row<T, true>(H, gi + b * 3 * H, gh + b * 3 * H, bi, bh, hp + b * H, S + b * 4 * H, y + b * H);
    else gru_gate_row<T, false>(H, gi + b * 3 * H, gh + b * 3 * H, bi, bh, hp + b * H, S + b * 4 * H, nullptr);
  }
}
}  // namespace

Tensor gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                const Tensor& b_hh, bool recompute) {
  const char* op = "gru_cell";
  Tape& t = check(op, {&x, &h, &w_ih, &w_hh, &b_ih, &b_hh});
  if (x.rank() != 2 || h.rank() != 2 || w_ih.rank() != 2 || w_hh.rank() != 2 || x.dim(0) != h.dim(0))
    shape_error(op, "expects x [B, I], h [B, H], w_ih [3H, I], w_hh [3H, H]", {&x, &h, &w_ih, &w_hh});
  const int64_t B = x.dim(0), I = x.dim(1), H = h.dim(1);
  if (w_ih.dim(0) != 3 * H || w_ih.dim(1) != I || w_hh.dim(0) != 3 * H || w_hh.dim(1) != H)
    shape_error(op, "weights must be w_ih [3H, I] and w_hh [3H, H] for x [B, I], h [B, H]", {&x, &h, &w_ih, &w_hh});
  if (b_ih.numel() != 3 * H || b_hh.numel() != 3 * H)
    shape_error(op, "biases must have 3H elements", {&h, &b_ih, &b_hh});
  Tensor out = t.make({B, H}, x.dtype, OpKind::GruCell, op);
  const std::initializer_list<Tensor> ins = {x, h, w_ih, w_hh, b_ih, b_hh};
  const bool g = t.wants_grad(ins);
  const bool keep = g && !recompute;
  const size_t saved_bytes = size_t(B * 4 * H) * dtype_size(x.dtype);  // r, z, n, W_hn h + b_hn per row
  t.scratch_reset();
  void* saved = keep ? t.alloc(saved_bytes, OpKind::GruCell, op) : t.scratch(saved_bytes);
  if (!device_forward(t, OpKind::GruCell, out, ins, {}, 0, saved))
    dispatch(x.dtype, [&]<class T>() { gru_gates<T>(t, x, h, w_ih, w_hh, b_ih, b_hh, static_cast<T*>(saved), static_cast<T*>(out.ptr)); });
  t.check_output(out, OpKind::GruCell);
  if (g) t.record(OpKind::GruCell, out, ins, out.nbytes() + (keep ? saved_bytes : 0)).saved = keep ? saved : nullptr;
  return out;
}

Tensor gru_sequence(const Tensor& x, const Tensor& h0, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                    const Tensor& b_hh) {
  const char* op = "gru_sequence";
  Tape& t = check(op, {&x, &h0, &w_ih, &w_hh, &b_ih, &b_hh});
  if (x.rank() != 3 || h0.rank() != 2 || w_ih.rank() != 2 || w_hh.rank() != 2 || x.dim(0) < 1 || x.dim(1) != h0.dim(0))
    shape_error(op, "expects x [T, B, I] with T >= 1, h0 [B, H], w_ih [3H, I], w_hh [3H, H]", {&x, &h0, &w_ih, &w_hh});
  const int64_t T = x.dim(0), B = x.dim(1), I = x.dim(2), H = h0.dim(1);
  if (w_ih.dim(0) != 3 * H || w_ih.dim(1) != I || w_hh.dim(0) != 3 * H || w_hh.dim(1) != H)
    shape_error(op, "weights must be w_ih [3H, I] and w_hh [3H, H] for x [T, B, I], h0 [B, H]", {&x, &h0, &w_ih, &w_hh});
  if (b_ih.numel() != 3 * H || b_hh.numel() != 3 * H) shape_error(op, "biases must have 3H elements", {&h0, &b_ih, &b_hh});
  if (!detail::device_computes(t.backend())) {
    // CPU: T fused cells, their states stacked along a new leading axis.
    std::vector<Tensor> steps(static_cast<size_t>(T));
    Tensor h = h0;
    for (int64_t s = 0; s < T; ++s)
      steps[size_t(s)] = h = gru_cell(reshape(slice(x, 0, s, 1), {B, I}), h, w_ih, w_hh, b_ih, b_hh);
    return reshape(concat(std::span<const Tensor>(steps.data(), size_t(T)), 0), {T, B, H});
  }
  // Device: one node; the backend allocates cuDNN's weight and reserve space
  // in the arena (n.saved, counted in n.bytes) when a gradient is wanted.
  Tensor out = t.make({T, B, H}, x.dtype, OpKind::GruSequence, op);
  const std::initializer_list<Tensor> ins = {x, h0, w_ih, w_hh, b_ih, b_hh};
  const bool g = t.wants_grad(ins);
  Node n = device_node(OpKind::GruSequence, out, std::span<const Tensor>(ins.begin(), ins.size()), {g, 0, 0, 0}, 0, nullptr);
  n.bytes = out.nbytes();
  t.backend()->forward(t, n);
  t.check_output(out, OpKind::GruSequence);
  if (g) {
    Node& r = t.record(OpKind::GruSequence, out, ins, n.bytes);
    r.saved = n.saved;
    r.ia = n.ia;
  }
  return out;
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
  if (detail::Backend* be = dst.tape->backend()) be->copy(dst.ptr, src.ptr, src.nbytes(), detail::Backend::Copy::DeviceToDevice);
  else std::memmove(dst.ptr, src.ptr, src.nbytes());
}

// ---------------------------------------------------------------- backward

namespace {

// Sum the rows of g [n / bn, bn] times f(i, c) into d[bn]: the gradient of a broadcast operand.
template <class T, class F>
void reduce_rows(T* d, int64_t n, int64_t bn, F f) {
  if (n == 0) return;
  for (int64_t r = 0; r < n; r += bn)
    for (int64_t c = 0; c < bn; ++c) d[c] += f(r + c, c);
}

// dW_ih += dgi^T x, dW_hh += dgh^T h, db_ih += colsum dgi, db_hh += colsum dgh over `rows` rows.
template <class T>
void gru_weight_grads(int64_t rows, int64_t I, int64_t H, const T* dgi, const T* dgh, const T* x, const T* h,
                      std::array<void*, 4> dw) {
  if (T* d = static_cast<T*>(dw[0])) cpu::gemm(true, false, 3 * H, I, rows, T(1), dgi, 3 * H, x, I, T(1), d, I);
  if (T* d = static_cast<T*>(dw[1])) cpu::gemm(true, false, 3 * H, H, rows, T(1), dgh, 3 * H, h, H, T(1), d, H);
  if (T* d = static_cast<T*>(dw[2])) reduce_rows(d, rows * 3 * H, 3 * H, [&](int64_t i, int64_t) { return dgi[i]; });
  if (T* d = static_cast<T*>(dw[3])) reduce_rows(d, rows * 3 * H, 3 * H, [&](int64_t i, int64_t) { return dgh[i]; });
}

// One batch row of the GRU cell's elementwise backward (see gru_gate_row).
template <class T>
void gru_backward_row(int64_t H, const T* __restrict g, const T* __restrict hp, const T* __restrict S, T* __restrict dgi,
                      T* __restrict dgh, T* __restrict dh) {
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    const T r = S[j], z = S[H + j], nn = S[2 * H + j], hn = S[3 * H + j];
    const T dn = g[j] * (T(1) - z) * (T(1) - nn * nn);  // through tanh
    const T dz = g[j] * (hp[j] - nn) * z * (T(1) - z);
    const T dr = dn * hn * r * (T(1) - r);
    dgi[j] = dr, dgi[H + j] = dz, dgi[2 * H + j] = dn;
    dgh[j] = dr, dgh[H + j] = dz, dgh[2 * H + j] = dn * r;
  }
  if (dh)
    for (int64_t j = 0; j < H; ++j) dh[j] += g[j] * S[H + j];
}

template <class T>
void backward_typed(Tape& tape, const Node& nd, const T* g, const std::array<void*, Node::kMaxInputs>& dst) {
  const Tensor& a = nd.in[0];
  const Tensor& out = nd.out;
  T* da = static_cast<T*>(dst[0]);
  T* db = static_cast<T*>(dst[1]);
  const T* x = static_cast<const T*>(a.ptr);
  const T* y = static_cast<const T*>(out.ptr);
  const int64_t n = out.numel();
  switch (nd.op) {
    case OpKind::MatMul: {
      const Tensor& b = nd.in[1];
      const bool ta = nd.ia[0], tb = nd.ia[1];
      const int64_t M = out.dim(0), N = out.dim(1), K = ta ? a.dim(0) : a.dim(1);
      auto gemm = [](auto... args) { cpu::gemm(args...); };
      detail::matmul_backward<T>(gemm, ta, tb, M, N, K, g, x, a.dim(1), static_cast<const T*>(b.ptr), b.dim(1), da, db);
      return;
    }
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div: {
      const T* pb = static_cast<const T*>(nd.in[1].ptr);
      const int64_t bn = nd.in[1].numel();
      const OpKind k = nd.op;
      if (da) {
        for (int64_t r = 0; n && r < n; r += bn)
          for (int64_t c = 0; c < bn; ++c) {
            const int64_t i = r + c;
            da[i] += k == OpKind::Mul ? g[i] * pb[c] : k == OpKind::Div ? g[i] / pb[c] : g[i];
          }
      }
      if (db) {
        switch (k) {
          case OpKind::Add: reduce_rows(db, n, bn, [&](int64_t i, int64_t) { return g[i]; }); break;
          case OpKind::Sub: reduce_rows(db, n, bn, [&](int64_t i, int64_t) { return -g[i]; }); break;
          case OpKind::Mul: reduce_rows(db, n, bn, [&](int64_t i, int64_t) { return g[i] * x[i]; }); break;
          default: reduce_rows(db, n, bn, [&](int64_t i, int64_t c) { return -g[i] * x[i] / (pb[c] * pb[c]); }); break;
        }
      }
      return;
    }
    case OpKind::Neg: for (int64_t i = 0; i < n; ++i) da[i] -= g[i]; return;
    case OpKind::Scale: for (int64_t i = 0; i < n; ++i) da[i] += T(nd.fa) * g[i]; return;
    case OpKind::Tanh: for (int64_t i = 0; i < n; ++i) da[i] += g[i] * (T(1) - y[i] * y[i]); return;
    case OpKind::Sigmoid: for (int64_t i = 0; i < n; ++i) da[i] += g[i] * y[i] * (T(1) - y[i]); return;
    case OpKind::Relu: for (int64_t i = 0; i < n; ++i) da[i] += x[i] > T(0) ? g[i] : T(0); return;
    case OpKind::Exp: for (int64_t i = 0; i < n; ++i) da[i] += g[i] * y[i]; return;
    case OpKind::Log: for (int64_t i = 0; i < n; ++i) da[i] += g[i] / x[i]; return;
    case OpKind::Sum:
    case OpKind::Mean: {
      const bool all = nd.ia[0] < 0;
      const AxisView v = all ? AxisView{1, a.numel(), 1} : axis_view(a.shape, int(nd.ia[0]));
      const T s = nd.op == OpKind::Mean ? T(1) / T(v.n) : T(1);
      for (int64_t o = 0; o < v.outer; ++o)
        for (int64_t j = 0; j < v.n; ++j)
          for (int64_t i = 0; i < v.inner; ++i) da[(o * v.n + j) * v.inner + i] += s * g[o * v.inner + i];
      return;
    }
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      const int64_t C = out.shape.last(), R = out.shape.rows();
      for (int64_t r = 0; r < R; ++r) {
        const T* yr = y + r * C;
        const T* gr = g + r * C;
        T* dr = da + r * C;
        T s = 0;
        if (nd.op == OpKind::Softmax) {
          for (int64_t c = 0; c < C; ++c) s += gr[c] * yr[c];
          for (int64_t c = 0; c < C; ++c) dr[c] += yr[c] * (gr[c] - s);
        } else {
          for (int64_t c = 0; c < C; ++c) s += gr[c];
          for (int64_t c = 0; c < C; ++c) dr[c] += gr[c] - cpu::vexp<T>(yr[c]) * s;
        }
      }
      return;
    }
    case OpKind::CrossEntropy: {
      const int64_t B = a.dim(0), C = a.dim(1);
      const int64_t* tg = static_cast<const int64_t*>(nd.in[1].ptr);
      const T* lse = static_cast<const T*>(nd.saved);
      const bool is_mean = Reduction(nd.ia[0]) == Reduction::Mean;
      const T s = is_mean ? g[0] / T(nd.ia[2]) : g[0];
      for (int64_t i = 0; i < B; ++i) {
        if (tg[i] == nd.ia[1]) continue;
        for (int64_t c = 0; c < C; ++c) da[i * C + c] += s * cpu::vexp<T>(x[i * C + c] - lse[i]);
        da[i * C + tg[i]] -= s;
      }
      return;
    }
    case OpKind::MseLoss: {
      const T* pb = static_cast<const T*>(nd.in[1].ptr);
      const int64_t m = a.numel();
      const T s = Reduction(nd.ia[0]) == Reduction::Mean ? T(2) * g[0] / T(m) : T(2) * g[0];
      for (int64_t i = 0; i < m; ++i) {
        const T d = s * (x[i] - pb[i]);
        if (da) da[i] += d;
        if (db) db[i] -= d;
      }
      return;
    }
    case OpKind::Concat: {
      const int ax = int(nd.ia[0]);
      const AxisView v = axis_view(out.shape, ax);
      int64_t off = 0;
      for (int p = 0; p < nd.n_in; ++p) {
        const int64_t w = nd.in[p].dim(ax) * v.inner;
        if (T* dp = static_cast<T*>(dst[p]))
          for (int64_t o = 0; o < v.outer; ++o)
            for (int64_t i = 0; i < w; ++i) dp[o * w + i] += g[o * v.n * v.inner + off + i];
        off += w;
      }
      return;
    }
    case OpKind::Slice: {
      const AxisView v = axis_view(a.shape, int(nd.ia[0]));
      const int64_t start = nd.ia[1], len = nd.ia[2];
      for (int64_t o = 0; o < v.outer; ++o)
        for (int64_t i = 0; i < len * v.inner; ++i) da[(o * v.n + start) * v.inner + i] += g[o * len * v.inner + i];
      return;
    }
    case OpKind::Reshape: for (int64_t i = 0; i < n; ++i) da[i] += g[i]; return;
    case OpKind::Transpose: {
      const int64_t R = a.dim(0), C = a.dim(1);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) da[r * C + c] += g[c * R + r];
      return;
    }
    case OpKind::Embedding: {
      const int64_t D = a.dim(1);
      const int64_t* ix = static_cast<const int64_t*>(nd.in[1].ptr);
      for (int64_t i = 0; i < nd.in[1].numel(); ++i)
        for (int64_t j = 0; j < D; ++j) da[ix[i] * D + j] += g[i * D + j];
      return;
    }
    case OpKind::GruCell: {
      const Tensor &xin = nd.in[0], &hin = nd.in[1], &w_ih = nd.in[2], &w_hh = nd.in[3];
      const int64_t B = xin.dim(0), I = xin.dim(1), H = hin.dim(1);
      const T* S = static_cast<const T*>(nd.saved);
      if (!S) {  // recompute mode: the gates again, from the inputs
        T* R = static_cast<T*>(tape.scratch(size_t(B * 4 * H) * sizeof(T)));
        gru_gates<T>(tape, xin, hin, w_ih, w_hh, nd.in[4], nd.in[5], R, nullptr);
        S = R;
      }
      const T* hp = static_cast<const T*>(hin.ptr);
      // Deferred weight gradients: this step's rows go into the batch (see detail::GruBatch).
      detail::GruBatch& gb = tape.gru_batch();
      const bool batch = tape.options().batch_weight_grads && w_ih.node < 0 && w_hh.node < 0 && dst[2] && dst[3] &&
                         (!dst[4] || nd.in[4].node < 0) && (!dst[5] || nd.in[5].node < 0);
      T *dgi, *dgh;
      if (batch) {
        if (gb.first && !detail::same_gru_group(*gb.first, nd, dst)) detail::flush_gru_batch(tape);
        if (!gb.first) detail::start_gru_batch(tape, nd, dst);
        const int64_t slot = gb.count++;
        --gb.remaining;
        dgi = static_cast<T*>(gb.dgi) + slot * B * 3 * H;
        dgh = static_cast<T*>(gb.dgh) + slot * B * 3 * H;
        std::memcpy(static_cast<T*>(gb.x) + slot * B * I, xin.ptr, xin.nbytes());
        std::memcpy(static_cast<T*>(gb.h) + slot * B * H, hin.ptr, hin.nbytes());
      } else {
        dgi = static_cast<T*>(tape.scratch(size_t(B * 3 * H) * sizeof(T)));  // d(x W_ih^T + b_ih)
        dgh = static_cast<T*>(tape.scratch(size_t(B * 3 * H) * sizeof(T)));  // d(h W_hh^T + b_hh)
      }
      T* dh = static_cast<T*>(dst[1]);
      for (int64_t b = 0; b < B; ++b)
        gru_backward_row<T>(H, g + b * H, hp + b * H, S + b * 4 * H, dgi + b * 3 * H, dgh + b * 3 * H, dh ? dh + b * H : nullptr);
      const T* px = static_cast<const T*>(xin.ptr);
      if (T* dx = static_cast<T*>(dst[0])) cpu::gemm(false, false, B, I, 3 * H, T(1), dgi, 3 * H, static_cast<const T*>(w_ih.ptr), I, T(1), dx, I);
      if (dh) cpu::gemm(false, false, B, H, 3 * H, T(1), dgh, 3 * H, static_cast<const T*>(w_hh.ptr), H, T(1), dh, H);
      if (batch) {
        if (gb.count == gb.capacity) detail::flush_gru_batch(tape);
        return;
      }
      gru_weight_grads<T>(B, I, H, dgi, dgh, px, hp, {dst[2], dst[3], dst[4], dst[5]});
      return;
    }
    case OpKind::Input:
    case OpKind::Carry:
    case OpKind::Grad:
    case OpKind::GruSequence:  // recorded on devices only: the CPU composes gru_cell steps
    case OpKind::Count: break;
  }
  throw TapeError(std::string("backward: no rule for op ") + op_name(nd.op));
}

}  // namespace

namespace detail {

bool same_gru_group(const Node& a, const Node& b, const std::array<void*, Node::kMaxInputs>& dst) {
  for (int j = 2; j < 6; ++j)
    if (a.in[j].ptr != b.in[j].ptr) return false;
  const GruBatch& gb = b.out.tape->gru_batch();
  return a.in[0].shape == b.in[0].shape && a.in[1].shape == b.in[1].shape && a.out.dtype == b.out.dtype &&
         gb.dw[0] == dst[2] && gb.dw[1] == dst[3] && gb.dw[2] == dst[4] && gb.dw[3] == dst[5];
}

void start_gru_batch(Tape& tape, const Node& n, const std::array<void*, Node::kMaxInputs>& dst) {
  GruBatch& gb = tape.gru_batch();
  const int64_t B = n.in[0].dim(0), I = n.in[0].dim(1), H = n.in[1].dim(1);
  const size_t es = dtype_size(n.out.dtype);
  // ~256 stacked rows make the weight GEMMs efficient without a large workspace.
  gb.capacity = std::max<int64_t>(1, std::min<int64_t>(std::max<int64_t>(256 / B, 1), gb.remaining));
  gb.buffers.reset();
  auto take = [&](int64_t floats) {
    void* p = gb.buffers.try_alloc(size_t(floats) * es);
    if (!p) throw Error("backward: out of memory for the GRU weight-gradient workspace");
    return p;
  };
  gb.dgi = take(gb.capacity * B * 3 * H);
  gb.dgh = take(gb.capacity * B * 3 * H);
  gb.x = take(gb.capacity * B * I);
  gb.h = take(gb.capacity * B * H);
  gb.dw[0] = dst[2], gb.dw[1] = dst[3], gb.dw[2] = dst[4], gb.dw[3] = dst[5];
  gb.first = &n;
  gb.count = 0;
}

void flush_gru_batch(Tape& tape) {
  GruBatch& gb = tape.gru_batch();
  if (gb.first && gb.count > 0) {
    const Node& n = *gb.first;
    const int64_t rows = gb.count * n.in[0].dim(0), I = n.in[0].dim(1), H = n.in[1].dim(1);
    const std::array<void*, 4> dw = {gb.dw[0], gb.dw[1], gb.dw[2], gb.dw[3]};
    if (n.out.dtype == DType::F32)
      gru_weight_grads<float>(rows, I, H, static_cast<float*>(gb.dgi), static_cast<float*>(gb.dgh), static_cast<float*>(gb.x),
                              static_cast<float*>(gb.h), dw);
    else
      gru_weight_grads<double>(rows, I, H, static_cast<double*>(gb.dgi), static_cast<double*>(gb.dgh), static_cast<double*>(gb.x),
                               static_cast<double*>(gb.h), dw);
  }
  gb.first = nullptr;
  gb.count = 0;
}

void prepare_gru_batch(Tape& tape, int64_t last_node) {
  GruBatch& gb = tape.gru_batch();
  gb.first = nullptr;
  gb.count = 0;
  gb.remaining = 0;
  if (!tape.options().batch_weight_grads) return;
  const auto& nodes = tape.nodes();
  for (int64_t i = 0; i <= last_node; ++i)
    if (nodes[size_t(i)].op == OpKind::GruCell) ++gb.remaining;
}

}  // namespace detail

void backward_node(Tape& tape, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst) {
  if (detail::Backend* be = tape.backend(); detail::device_computes(be)) return be->backward(tape, n, gout, dst);
  if (n.out.dtype == DType::F32) backward_typed(tape, n, static_cast<const float*>(gout), dst);
  else backward_typed(tape, n, static_cast<const double*>(gout), dst);
}

}  // namespace segtape
