// The LSTM: one fused cell (lstm_cell) whose state holds h and c as one
// tensor [2, B, H], and the (h, c) pairs around it. The gates follow
// PyTorch's LSTMCell, rows of the weights in order i, f, g, o:
//   i, f, o = sigmoid(W_i* x + b_i* + W_h* h + b_h*),  g = tanh(W_ig x + b_ig + W_hg h + b_hg),
//   c' = f c + i g,  h' = o tanh(c').
// One GEMM for x W_ih^T and one for h W_hh^T (accumulated into the same
// [B, 4H] buffer), then one pass for the gates; backward is one elementwise
// pass, the products for dx and dh, and the weight gradients (batched over
// a backward's steps on the CPU, as the GRU's: ops/cell.h).
#include "backend.h"
#include "cpu/vmath.h"
#include "ops/cell.h"
#include "ops/op.h"
#ifdef SEGTAPE_HAVE_CUDA
#include "cuda/op_util.h"
#endif
#include "tape_internals.h"

namespace segtape {

using In = detail::TapeInternals;
namespace {

// One batch row of the LSTM gates from the pre-activations P [4H] (x W_ih^T + h W_hh^T),
// into S [4H] (i, f, g, o) and the new state's rows hy, cy [H]; c [H]: the
// state's c. Restrict pointers and no branches, so the compiler vectorizes
// each loop; the sigmoids of i and f (2H, contiguous) in one.
template <class T>
void lstm_gate_row(int64_t H, const T* __restrict P, const T* __restrict bi, const T* __restrict bh, const T* __restrict c,
                   T* __restrict S, T* __restrict hy, T* __restrict cy) {
#pragma GCC ivdep
  for (int64_t k = 0; k < 2 * H; ++k) S[k] = cpu::vsigmoid<T>(P[k] + bi[k] + bh[k]);
#pragma GCC ivdep
  for (int64_t k = 2 * H; k < 3 * H; ++k) S[k] = cpu::vtanh<T>(P[k] + bi[k] + bh[k]);
#pragma GCC ivdep
  for (int64_t k = 3 * H; k < 4 * H; ++k) S[k] = cpu::vsigmoid<T>(P[k] + bi[k] + bh[k]);
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    const T c1 = S[H + j] * c[j] + S[j] * S[2 * H + j];
    cy[j] = c1;
    hy[j] = S[3 * H + j] * cpu::vtanh<T>(c1);
  }
}

// The LSTM gates of one step into S [B, 4H] (i, f, g, o per row) and the new
// state out [2, B, H]; the pre-activations go to the op workspace.
// On input gates computed beforehand (lstm_cell_gates) P is h W_hh^T alone
// and each row's gi (the node's x) is added where b_ih would be.
template <class T>
void lstm_gates(Tape& t, detail::PackedWeights& pw, const Node& nd, T* S, T* out) {
  const detail::CellInputs ci = detail::cell_inputs(nd);
  const Tensor &x = nd.in[0], &state = nd.in[1], &w_hh = nd.in[size_t(ci.w_hh)];
  const int64_t B = x.dim(0), I = x.dim(1), H = state.dim(2);
  const T* h = static_cast<const T*>(state.ptr);  // state[0]: [B, H]
  const T* c = h + B * H;                         // state[1]: [B, H]
  T* P = static_cast<T*>(In::scratch(t, size_t(B * 4 * H) * sizeof(T)));  // [B, 4H]
  if (!ci.pre) detail::weight_product<T>(pw, nd.in[2], true, B, 4 * H, I, static_cast<const T*>(x.ptr), I, T(0), P, 4 * H);
  detail::weight_product<T>(pw, w_hh, true, B, 4 * H, H, h, H, ci.pre ? T(0) : T(1), P, 4 * H);
  const T* bh = static_cast<const T*>(nd.in[size_t(ci.b_hh)].ptr);
  for (int64_t b = 0; b < B; ++b) {
    const T* bi = ci.pre ? static_cast<const T*>(x.ptr) + b * 4 * H : static_cast<const T*>(nd.in[4].ptr);
    lstm_gate_row<T>(H, P + b * 4 * H, bi, bh, c + b * H, S + b * 4 * H, out + b * H, out + B * H + b * H);
  }
}

// One batch row of the cell's elementwise backward: from the gradients of
// h' and c' (gh, gc) to those of the gate pre-activations dP [4H], and
// dc += dc' f where the state's gradient is wanted. cy: c' (tanh(c') is
// computed again, with the forward's function: the same bits).
template <class T, bool WithDc>
void lstm_backward_row(int64_t H, const T* __restrict gh, const T* __restrict gc, const T* __restrict c, const T* __restrict cy,
                       const T* __restrict S, T* __restrict dP, T* __restrict dc) {
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    const T i = S[j], f = S[H + j], g = S[2 * H + j], o = S[3 * H + j];
    const T tc = cpu::vtanh<T>(cy[j]);
    const T dcy = gc[j] + gh[j] * o * (T(1) - tc * tc);  // c' reaches the loss directly and through h'
    dP[j] = dcy * g * i * (T(1) - i);
    dP[H + j] = dcy * c[j] * f * (T(1) - f);
    dP[2 * H + j] = dcy * i * (T(1) - g * g);
    dP[3 * H + j] = gh[j] * tc * o * (T(1) - o);
    if constexpr (WithDc) dc[j] += dcy * f;
  }
}

}  // namespace

Tensor lstm_cell(const Tensor& x, const Tensor& state, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                 const Tensor& b_hh) {
  const char* op = "lstm_cell";
  Tape& t = ops::check(op, {&x, &state, &w_ih, &w_hh, &b_ih, &b_hh});
  if (x.rank() != 2 || state.rank() != 3 || state.dim(0) != 2 || w_ih.rank() != 2 || w_hh.rank() != 2 || x.dim(0) != state.dim(1))
    ops::shape_error(op, "expects x [B, I], state [2, B, H] (h and c), w_ih [4H, I], w_hh [4H, H]", {&x, &state, &w_ih, &w_hh});
  const int64_t B = x.dim(0), I = x.dim(1), H = state.dim(2);
  if (w_ih.dim(0) != 4 * H || w_ih.dim(1) != I || w_hh.dim(0) != 4 * H || w_hh.dim(1) != H)
    ops::shape_error(op, "weights must be w_ih [4H, I] and w_hh [4H, H] for x [B, I], state [2, B, H]", {&x, &state, &w_ih, &w_hh});
  if (b_ih.numel() != 4 * H || b_hh.numel() != 4 * H) ops::shape_error(op, "biases must have 4H elements", {&state, &b_ih, &b_hh});
  Node n = ops::node(OpKind::LstmCell, {x, state, w_ih, w_hh, b_ih, b_hh});
  // Backward reads the state (c, and h for dW_hh), its output (c'), and x,
  // w_ih, w_hh for the gradients of w_ih, x and the state; never the biases.
  n.reads = uint8_t(2 | Node::kReadsOut | (w_ih.requires_grad ? 1 : 0) | (x.requires_grad ? 4 : 0) | (state.requires_grad ? 8 : 0));
  // saved: i, f, g, o per row.
  return ops::emit(t, n, {2, B, H}, op, {size_t(B * 4 * H) * dtype_size(x.dtype)});
}

Tensor lstm_cell_gates(const Tensor& gi, const Tensor& state, const Tensor& w_hh, const Tensor& b_hh) {
  const char* op = "lstm_cell_gates";
  Tape& t = ops::check(op, {&gi, &state, &w_hh, &b_hh});
  if (gi.rank() != 2 || state.rank() != 3 || state.dim(0) != 2 || w_hh.rank() != 2 || gi.dim(0) != state.dim(1))
    ops::shape_error(op, "expects gi [B, 4H], state [2, B, H] (h and c), w_hh [4H, H]", {&gi, &state, &w_hh});
  const int64_t B = state.dim(1), H = state.dim(2);
  if (gi.dim(1) != 4 * H || w_hh.dim(0) != 4 * H || w_hh.dim(1) != H)
    ops::shape_error(op, "gi must be [B, 4H] and w_hh [4H, H] for a state [2, B, H]", {&gi, &state, &w_hh});
  if (b_hh.numel() != 4 * H) ops::shape_error(op, "b_hh must have 4H elements", {&state, &b_hh});
  Node n = ops::node(OpKind::LstmCell, {gi, state, w_hh, b_hh});
  // Backward reads the state (c, and h for dW_hh), its output (c') and w_hh
  // for the state's gradient; never gi.
  n.reads = uint8_t(2 | Node::kReadsOut | (state.requires_grad ? 4 : 0));
  return ops::emit(t, n, {2, B, H}, op, {size_t(B * 4 * H) * dtype_size(gi.dtype)});
}

Tensor lstm_state(const Tensor& h, const Tensor& c) {
  const char* op = "lstm_state";
  ops::check(op, {&h, &c});
  if (h.rank() != 2 || h.shape != c.shape) ops::shape_error(op, "expects h and c of one shape [B, H]", {&h, &c});
  const int64_t B = h.dim(0), H = h.dim(1);
  return concat({reshape(h, {1, B, H}), reshape(c, {1, B, H})}, 0);
}

namespace {
Tensor state_part(const char* op, const Tensor& state, int64_t part) {
  ops::check(op, {&state});
  if (state.rank() != 3 || state.dim(0) != 2) ops::shape_error(op, "expects an LSTM state [2, B, H] (h and c)", {&state});
  return reshape(slice(state, 0, part, 1), {state.dim(1), state.dim(2)});
}
}  // namespace

Tensor lstm_h(const Tensor& state) { return state_part("lstm_h", state, 0); }
Tensor lstm_c(const Tensor& state) { return state_part("lstm_c", state, 1); }

LstmPair lstm_cell(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                   const Tensor& b_hh) {
  const Tensor s = lstm_cell(x, lstm_state(h, c), w_ih, w_hh, b_ih, b_hh);
  return {lstm_h(s), lstm_c(s)};
}

namespace ops {

void lstm_cell_forward_cpu(Tape& t, detail::CpuCells& cells, Node& n) {
  detail::dispatch(n.out.dtype,
                   [&]<class T>() { lstm_gates<T>(t, cells.packed, n, static_cast<T*>(n.saved), static_cast<T*>(n.out.ptr)); });
}

void lstm_cell_backward_cpu(Tape& tape, detail::CpuCells& cells, const Node& nd, const void* gout, const Grads& dst) {
  detail::dispatch(nd.out.dtype, [&]<class T>() {
    const detail::CellInputs ci = detail::cell_inputs(nd);
    const Tensor &xin = nd.in[0], &state = nd.in[1], &w_hh = nd.in[size_t(ci.w_hh)];
    const int64_t B = xin.dim(0), I = xin.dim(1), H = state.dim(2);
    const T* g = static_cast<const T*>(gout);  // [2, B, H]: dL/dh', dL/dc'
    const T* S = static_cast<const T*>(nd.saved);
    const T* c = static_cast<const T*>(state.ptr) + B * H;
    const T* cy = static_cast<const T*>(nd.out.ptr) + B * H;
    const detail::CellGrads cg = detail::cell_grads(tape, cells.batch, nd, dst, H, 4 * H, true);
    T* dP = static_cast<T*>(cg.dgi);
    T* ds = static_cast<T*>(dst[1]);  // [2, B, H]: dL/dh, dL/dc
    for (int64_t b = 0; b < B; ++b) {
      const T *gh = g + b * H, *gc = g + B * H + b * H;
      if (ds) lstm_backward_row<T, true>(H, gh, gc, c + b * H, cy + b * H, S + b * 4 * H, dP + b * 4 * H, ds + B * H + b * H);
      else lstm_backward_row<T, false>(H, gh, gc, c + b * H, cy + b * H, S + b * 4 * H, dP + b * 4 * H, nullptr);
    }
    if (T* dx = static_cast<T*>(dst[0])) {
      if (ci.pre) detail::add_into(dx, dP, B * 4 * H);  // gi's gradient is the gates'
      else detail::weight_product<T>(cells.packed, nd.in[2], false, B, I, 4 * H, dP, 4 * H, T(1), dx, I);
    }
    if (ds) detail::weight_product<T>(cells.packed, w_hh, false, B, H, 4 * H, dP, 4 * H, T(1), ds, H);
    detail::cell_grads_done(nd, dst, cg, H, 4 * H);
  });
}

}  // namespace ops

#ifdef SEGTAPE_HAVE_CUDA
// ---- CUDA (engine/cuda/op_table.cpp dispatches here; kernels in cuda/lstm_kernels.cu)
namespace ops {
using cuda::in;
using cuda::out;

// x W_ih^T + h W_hh^T into one temporary [B, 4H] (two cuBLAS GEMMs), then the gate kernel.
void lstm_cell_forward_cuda(cuda::CudaBackend& be, Node& n) {
  detail::dispatch(n.out.dtype, [&]<class T>() {
    const detail::CellInputs ci = detail::cell_inputs(n);
    const Tensor &x = n.in[0], &state = n.in[1], &w_hh = n.in[size_t(ci.w_hh)];
    const int64_t B = x.dim(0), I = x.dim(1), H = state.dim(2);
    T* P = be.temp<T>(B * 4 * H);
    const T* bi = nullptr;
    if (ci.pre) {  // P = gi + h W_hh^T, b_ih zero
      T* zero = be.temp<T>(4 * H);
      be.zero(zero, size_t(4 * H) * sizeof(T));
      bi = zero;
      be.gemm(false, true, B, 4 * H, H, T(1), in<T>(state), H, in<T>(w_hh), H, T(0), P, 4 * H);
      cuda::add_strided<T>(be.stream(), P, 4 * H, in<T>(x), 4 * H, B, 4 * H);
    } else {
      be.gemm(false, true, B, 4 * H, I, T(1), in<T>(x), I, in<T>(n.in[2]), I, T(0), P, 4 * H);
      be.gemm(false, true, B, 4 * H, H, T(1), in<T>(state), H, in<T>(w_hh), H, T(1), P, 4 * H);
      bi = in<T>(n.in[4]);
    }
    cuda::lstm_gates_forward<T>(be.stream(), B, H, P, bi, in<T>(n.in[size_t(ci.b_hh)]), in<T>(state) + B * H,
                                static_cast<T*>(n.saved), out<T>(n.out));
  });
}

// Each cell's weight gradients by its own GEMMs (no batching across steps on CUDA).
void lstm_cell_backward_cuda(cuda::CudaBackend& be, const Node& nd, const void* gout, const Grads& dst) {
  detail::dispatch(nd.out.dtype, [&]<class T>() {
    const cudaStream_t s = be.stream();
    const detail::CellInputs ci = detail::cell_inputs(nd);
    const Tensor &xin = nd.in[0], &state = nd.in[1], &w_hh = nd.in[size_t(ci.w_hh)];
    const int64_t B = xin.dim(0), I = xin.dim(1), H = state.dim(2);
    T* dP = be.temp<T>(B * 4 * H);  // d(x W_ih^T + h W_hh^T + biases) [B, 4H]
    T* ds = static_cast<T*>(dst[1]);
    cuda::lstm_gates_backward<T>(s, B, H, static_cast<const T*>(gout), in<T>(state) + B * H, in<T>(nd.out) + B * H,
                                 static_cast<const T*>(nd.saved), dP, ds ? ds + B * H : nullptr);
    if (T* dx = static_cast<T*>(dst[0])) {
      if (ci.pre) cuda::add_strided<T>(s, dx, 4 * H, dP, 4 * H, B, 4 * H);  // gi's gradient is the gates'
      else be.gemm(false, false, B, I, 4 * H, T(1), dP, 4 * H, in<T>(nd.in[2]), I, T(1), dx, I);
    }
    if (ds) be.gemm(false, false, B, H, 4 * H, T(1), dP, 4 * H, in<T>(w_hh), H, T(1), ds, H);
    if (T* d = static_cast<T*>(detail::grad_of(dst, ci.w_ih))) be.gemm(true, false, 4 * H, I, B, T(1), dP, 4 * H, in<T>(xin), I, T(1), d, I);
    if (T* d = static_cast<T*>(detail::grad_of(dst, ci.w_hh))) be.gemm(true, false, 4 * H, H, B, T(1), dP, 4 * H, in<T>(state), H, T(1), d, H);
    if (T* d = static_cast<T*>(detail::grad_of(dst, ci.b_ih))) cuda::column_sums<T>(s, dP, d, B, 4 * H, be.partials<T>());
    if (T* d = static_cast<T*>(detail::grad_of(dst, ci.b_hh))) cuda::column_sums<T>(s, dP, d, B, 4 * H, be.partials<T>());
  });
}

}  // namespace ops
#endif  // SEGTAPE_HAVE_CUDA

}  // namespace segtape
