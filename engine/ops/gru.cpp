// The GRU: one fused cell (gru_cell), and a whole sequence (gru_sequence:
// cuDNN's on CUDA, the fused cells composed on the CPU). The gates follow
// PyTorch's GRUCell: r, z = sigmoid(...), n = tanh(W_in x + b_in + r (W_hn h + b_hn)),
// h' = (1 - z) n + z h. Also the CPU's weight-gradient batch and packed
// weights, which the LSTM's cell shares (ops/cell.h).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

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

// One batch row of the GRU gates: restrict pointers and no branches, so the
// compiler vectorizes it (the gates dominate the step's non-GEMM time).
// Two loops: r and z (2H sigmoids, independent of each other) first, then n,
// which needs r. In one loop each vector's sigmoid -> tanh chain was longer
// than the out-of-order window could overlap (about 1.4x slower at B = 32,
// H = 128 on AVX2); the formulas, and so the bits, are the same.
template <class T, bool WithY>
void gru_gate_row(int64_t H, const T* __restrict gi, const T* __restrict gh, const T* __restrict bi, const T* __restrict bh,
                  const T* __restrict hp, T* __restrict S, T* __restrict y) {
#pragma GCC ivdep
  for (int64_t k = 0; k < 2 * H; ++k) S[k] = cpu::vsigmoid<T>(gi[k] + bi[k] + gh[k] + bh[k]);
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    const T r = S[j], z = S[H + j];
    const T hn = gh[2 * H + j] + bh[2 * H + j];
    const T n = cpu::vtanh<T>(gi[2 * H + j] + bi[2 * H + j] + r * hn);
    S[2 * H + j] = n, S[3 * H + j] = hn;
    if constexpr (WithY) y[j] = (T(1) - z) * n + z * hp[j];
  }
}

// The GRU gates of one step into S [B, 4H] (r, z, n, W_hn h + b_hn per row);
// with y non-null also the new state y [B, H]. Pre-activations go to the op workspace.
// On input gates computed beforehand (gru_cell_gates) gi is the node's x
// and b_ih zero.
template <class T>
void gru_gates(Tape& t, detail::PackedWeights& pw, const Node& nd, T* S, T* y) {
  const detail::CellInputs ci = detail::cell_inputs(nd);
  const Tensor &x = nd.in[0], &h = nd.in[1], &w_hh = nd.in[size_t(ci.w_hh)];
  const int64_t B = x.dim(0), I = x.dim(1), H = h.dim(1);
  const T* gi = static_cast<const T*>(x.ptr);
  const T* bi = nullptr;
  if (ci.pre) {
    T* zero = static_cast<T*>(In::scratch(t, size_t(3 * H) * sizeof(T)));
    std::fill_n(zero, 3 * H, T(0));
    bi = zero;
  } else {
    T* p = static_cast<T*>(In::scratch(t, size_t(B * 3 * H) * sizeof(T)));  // [B, 3H]
    detail::weight_product<T>(pw, nd.in[2], true, B, 3 * H, I, static_cast<const T*>(x.ptr), I, T(0), p, 3 * H);
    gi = p, bi = static_cast<const T*>(nd.in[4].ptr);
  }
  T* gh = static_cast<T*>(In::scratch(t, size_t(B * 3 * H) * sizeof(T)));  // [B, 3H]
  detail::weight_product<T>(pw, w_hh, true, B, 3 * H, H, static_cast<const T*>(h.ptr), H, T(0), gh, 3 * H);
  const T* bh = static_cast<const T*>(nd.in[size_t(ci.b_hh)].ptr);
  const T* hp = static_cast<const T*>(h.ptr);
  for (int64_t b = 0; b < B; ++b) {
    if (y) gru_gate_row<T, true>(H, gi + b * 3 * H, gh + b * 3 * H, bi, bh, hp + b * H, S + b * 4 * H, y + b * H);
    else gru_gate_row<T, false>(H, gi + b * 3 * H, gh + b * 3 * H, bi, bh, hp + b * H, S + b * 4 * H, nullptr);
  }
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

}  // namespace

Tensor gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                const Tensor& b_hh, bool recompute) {
  const char* op = "gru_cell";
  Tape& t = ops::check(op, {&x, &h, &w_ih, &w_hh, &b_ih, &b_hh});
  if (x.rank() != 2 || h.rank() != 2 || w_ih.rank() != 2 || w_hh.rank() != 2 || x.dim(0) != h.dim(0))
    ops::shape_error(op, "expects x [B, I], h [B, H], w_ih [3H, I], w_hh [3H, H]", {&x, &h, &w_ih, &w_hh});
  const int64_t B = x.dim(0), I = x.dim(1), H = h.dim(1);
  if (w_ih.dim(0) != 3 * H || w_ih.dim(1) != I || w_hh.dim(0) != 3 * H || w_hh.dim(1) != H)
    ops::shape_error(op, "weights must be w_ih [3H, I] and w_hh [3H, H] for x [B, I], h [B, H]", {&x, &h, &w_ih, &w_hh});
  if (b_ih.numel() != 3 * H || b_hh.numel() != 3 * H)
    ops::shape_error(op, "biases must have 3H elements", {&h, &b_ih, &b_hh});
  Node n = ops::node(OpKind::GruCell, {x, h, w_ih, w_hh, b_ih, b_hh});
  // Backward reads h, and x, w_ih, w_hh for the gradients of w_ih, x, h; in
  // recompute mode all six (the gates again).
  n.reads = recompute ? uint8_t(Node::kReadsAll & ~Node::kReadsOut)
                      : uint8_t(2 | (w_ih.requires_grad ? 1 : 0) | (x.requires_grad ? 4 : 0) | (h.requires_grad ? 8 : 0));
  // saved: r, z, n, W_hn h + b_hn per row; not kept in recompute mode.
  return ops::emit(t, n, {B, H}, op, {size_t(B * 4 * H) * dtype_size(x.dtype), !recompute});
}

Tensor gru_cell_gates(const Tensor& gi, const Tensor& h, const Tensor& w_hh, const Tensor& b_hh) {
  const char* op = "gru_cell_gates";
  Tape& t = ops::check(op, {&gi, &h, &w_hh, &b_hh});
  if (gi.rank() != 2 || h.rank() != 2 || w_hh.rank() != 2 || gi.dim(0) != h.dim(0))
    ops::shape_error(op, "expects gi [B, 3H], h [B, H], w_hh [3H, H]", {&gi, &h, &w_hh});
  const int64_t B = h.dim(0), H = h.dim(1);
  if (gi.dim(1) != 3 * H || w_hh.dim(0) != 3 * H || w_hh.dim(1) != H)
    ops::shape_error(op, "gi must be [B, 3H] and w_hh [3H, H] for h [B, H]", {&gi, &h, &w_hh});
  if (b_hh.numel() != 3 * H) ops::shape_error(op, "b_hh must have 3H elements", {&h, &b_hh});
  Node n = ops::node(OpKind::GruCell, {gi, h, w_hh, b_hh});
  // Backward reads h (the gates of dh and dw_hh) and w_hh for h's gradient; never gi.
  n.reads = uint8_t(2 | (h.requires_grad ? 4 : 0));
  return ops::emit(t, n, {B, H}, op, {size_t(B * 4 * H) * dtype_size(gi.dtype)});
}

namespace {
// Steps [s0, s0 + len) of a sequence as fused cells from state h (left at the
// last step's), their states stacked along axis 0 exactly as concat() of the
// steps would stack them (runs of at most Node::kMaxInputs, a balanced tree)
// but with no list of steps: no heap.
// With keep (expanded to e [T B, H]: row t B + b holds keep[t, b]), the
// state entering step s is h * e's rows of step s.
Tensor gru_steps(const Tensor& x, Tensor& h, int64_t s0, int64_t len, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                 const Tensor& b_hh, const Tensor& e) {
  constexpr int64_t G = Node::kMaxInputs;
  const int64_t B = x.dim(1), I = x.dim(2);
  std::array<Tensor, G> parts;
  if (len == 1) {
    const Tensor in = e.defined() ? mul(h, slice(e, 0, s0 * B, B)) : h;
    return h = gru_cell(reshape(slice(x, 0, s0, 1), {B, I}), in, w_ih, w_hh, b_ih, b_hh);
  }
  if (len <= G) {
    for (int64_t s = 0; s < len; ++s) parts[size_t(s)] = gru_steps(x, h, s0 + s, 1, w_ih, w_hh, b_ih, b_hh, e);
    return concat(std::span<const Tensor>(parts.data(), size_t(len)), 0);
  }
  for (int64_t r = 0, at = s0; r < G; ++r) {
    const int64_t n = len / G + (r < len % G ? 1 : 0);
    parts[size_t(r)] = gru_steps(x, h, at, n, w_ih, w_hh, b_ih, b_hh, e);
    at += n;
  }
  return concat(std::span<const Tensor>(parts.data(), size_t(G)), 0);
}
}  // namespace

bool gru_sequence_fused(Tape& tape, int64_t B, int64_t H, DType d) {
  detail::Backend* be = In::backend(tape);
  return be->has_gru_sequence() && be->gru_sequence_keeps(B, H, d);
}

std::string gru_sequence_path(Tape& tape, int64_t B, int64_t H, DType d) { return In::backend(tape)->gru_sequence_path(B, H, d); }

Tensor gru_sequence(const Tensor& x, const Tensor& h0, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                    const Tensor& b_hh, const Tensor& keep) {
  const char* op = "gru_sequence";
  Tape& t = keep.defined() ? ops::check(op, {&x, &h0, &w_ih, &w_hh, &b_ih, &b_hh, &keep})
                           : ops::check(op, {&x, &h0, &w_ih, &w_hh, &b_ih, &b_hh});
  if (x.rank() != 3 || h0.rank() != 2 || w_ih.rank() != 2 || w_hh.rank() != 2 || x.dim(0) < 1 || x.dim(1) != h0.dim(0))
    ops::shape_error(op, "expects x [T, B, I] with T >= 1, h0 [B, H], w_ih [3H, I], w_hh [3H, H]", {&x, &h0, &w_ih, &w_hh});
  const int64_t T = x.dim(0), B = x.dim(1), I = x.dim(2), H = h0.dim(1);
  if (w_ih.dim(0) != 3 * H || w_ih.dim(1) != I || w_hh.dim(0) != 3 * H || w_hh.dim(1) != H)
    ops::shape_error(op, "weights must be w_ih [3H, I] and w_hh [3H, H] for x [T, B, I], h0 [B, H]", {&x, &h0, &w_ih, &w_hh});
  if (b_ih.numel() != 3 * H || b_hh.numel() != 3 * H) ops::shape_error(op, "biases must have 3H elements", {&h0, &b_ih, &b_hh});
  if (keep.defined()) {
    if (keep.rank() != 2 || keep.dim(0) != T || keep.dim(1) != B)
      ops::shape_error(op, "keep must be [T, B] for x [T, B, I] (the factor on each stream's state as it enters each step: 1 "
                       "carries it, 0 starts the stream from zero)", {&x, &keep});
    if (keep.requires_grad && t.grad_enabled())
      throw Error("gru_sequence: keep " + keep.describe() + " requires a gradient; it is a mask of data (done flags) and gets "
                  "none: pass detach(keep)");
  }
  detail::Backend* be = In::backend(t);
  // Per-stream resets and Precision::Bf16 take the fused kernels or composed
  // cells, never cuDNN's GRU: it has no resets, and its bfloat16 RNN keeps
  // its state in bfloat16 (Precision::Bf16 keeps it in float32).
  const bool fused_only = keep.defined() || t.options().precision == Precision::Bf16;
  if (!be->has_gru_sequence() || (fused_only && !be->gru_sequence_keeps(B, H, x.dtype))) {
    // keep, expanded to the state's width: e [T B, H], row t B + b all keep[t, b] (keep added to
    // each row of zeros [H, T B], transposed: exact, no product that TF32 could round)
    const Tensor e = keep.defined() ? transpose(add(t.zeros({H, T * B}, x.dtype), reshape(detach(keep), {T * B}))) : Tensor{};
    Tensor h = h0;
    return reshape(gru_steps(x, h, 0, T, w_ih, w_hh, b_ih, b_hh, e), {T, B, H});
  }
  // One node; the backend allocates its weight and reserve space in the arena
  // (n.saved, counted in n.bytes) when a gradient is wanted (ia[0]).
  Node n = ops::node(OpKind::GruSequence, {x, h0, w_ih, w_hh, b_ih, b_hh});
  // keep travels to the backend in n.saved (its own buffers replace it there:
  // the fused forward copies keep into the arena, gru_sequence.cpp).
  n.saved = keep.defined() ? keep.ptr : nullptr;
  // Its backward (CUDA's only: the CPU composes cells, above) reads h0, the
  // output, W_hh, W_ih for dx, and x for the weights' gradients (cuDNN's for
  // all four at once); never the biases. cuDNN reads the weights as its
  // forward copied them, so there a W_hh write would not change the
  // gradient; it is refused as on the fused path and the CPU, which read it.
  const bool weights = w_ih.requires_grad || w_hh.requires_grad || b_ih.requires_grad || b_hh.requires_grad;
  n.reads = uint8_t(2 | 8 | Node::kReadsOut | (x.requires_grad ? 4 : 0) | (weights ? 1 : 0));
  n.ia[0] = In::wants_grad(t, std::span<const Tensor>(n.in.data(), n.n_in));
  return ops::emit(t, n, {T, B, H}, op);
}

namespace ops {

void gru_cell_forward_cpu(Tape& t, detail::CpuCells& cells, Node& n) {
  detail::dispatch(n.out.dtype,
                   [&]<class T>() { gru_gates<T>(t, cells.packed, n, static_cast<T*>(n.saved), static_cast<T*>(n.out.ptr)); });
}

void gru_cell_backward_cpu(Tape& tape, detail::CpuCells& cells, const Node& nd, const void* gout, const Grads& dst) {
  detail::dispatch(nd.out.dtype, [&]<class T>() {
    const detail::CellInputs ci = detail::cell_inputs(nd);
    const Tensor &xin = nd.in[0], &hin = nd.in[1], &w_hh = nd.in[size_t(ci.w_hh)];
    const int64_t B = xin.dim(0), I = xin.dim(1), H = hin.dim(1);
    const T* g = static_cast<const T*>(gout);
    const T* S = static_cast<const T*>(nd.saved);
    if (!S) {  // recompute mode: the gates again, from the inputs
      T* R = static_cast<T*>(In::scratch(tape, size_t(B * 4 * H) * sizeof(T)));
      gru_gates<T>(tape, cells.packed, nd, R, nullptr);
      S = R;
    }
    const T* hp = static_cast<const T*>(hin.ptr);
    // d(x W_ih^T + b_ih) and d(h W_hh^T + b_hh) [B, 3H]: rows of the batch, or the op workspace.
    const detail::CellGrads cg = detail::cell_grads(tape, cells.batch, nd, dst, H, 3 * H, false);
    T* dgi = static_cast<T*>(cg.dgi);
    T* dgh = static_cast<T*>(cg.dgh);
    T* dh = static_cast<T*>(dst[1]);
    for (int64_t b = 0; b < B; ++b)
      gru_backward_row<T>(H, g + b * H, hp + b * H, S + b * 4 * H, dgi + b * 3 * H, dgh + b * 3 * H, dh ? dh + b * H : nullptr);
    if (T* dx = static_cast<T*>(dst[0])) {
      if (ci.pre) detail::add_into(dx, dgi, B * 3 * H);  // gi's gradient is the gates'
      else detail::weight_product<T>(cells.packed, nd.in[2], false, B, I, 3 * H, dgi, 3 * H, T(1), dx, I);
    }
    if (dh) detail::weight_product<T>(cells.packed, w_hh, false, B, H, 3 * H, dgh, 3 * H, T(1), dh, H);
    detail::cell_grads_done(nd, dst, cg, H, 3 * H);
  });
}

}  // namespace ops

namespace detail {
namespace {

// `bytes` from the cell batch's arena (reset with each batch).
void* batch_take(Arena& buffers, size_t bytes) {
  void* p = buffers.try_alloc(bytes);
  if (!p)
    throw OutOfMemoryError("backward: out of memory for the GRU weight-gradient workspace (" + std::to_string(bytes) + " bytes)",
                           buffers.what());
  return p;
}

// Whether b continues the batch cb holds (started by a): the same kind of
// cell, weights, shapes, dtype and gradient buffers.
bool same_group(const CellBatch& cb, const Node& a, const Node& b, const ops::Grads& dst) {
  if (a.op != b.op) return false;
  for (int j = 2; j < 6; ++j)
    if (a.in[j].ptr != b.in[j].ptr) return false;
  return a.in[0].shape == b.in[0].shape && a.in[1].shape == b.in[1].shape && a.out.dtype == b.out.dtype &&
         cb.dw[0] == dst[2] && cb.dw[1] == dst[3] && cb.dw[2] == dst[4] && cb.dw[3] == dst[5];
}

void start_batch(CellBatch& cb, int64_t remaining, const Node& n, const ops::Grads& dst, int64_t H, int64_t G, bool one) {
  const int64_t B = n.in[0].dim(0), I = n.in[0].dim(1);
  const size_t es = dtype_size(n.out.dtype);
  // ~max(128, H) stacked rows make the weight GEMMs efficient without a large
  // workspace: each flush reads and writes dW_hh [G, H] once, so at H = 1024
  // 256 rows spent a quarter of the GEMM's time on that traffic (OpenBLAS
  // 0.3.21, one thread, the GRU: 109 GFLOP/s at 256 rows, 151 at 1024); at
  // H = 128, where dW_hh stays in L2, 64, 128 and 256 rows ran a step at the
  // same speed (docs/lab/benchmarks-changelog.md, item 12). The workspace is rows * (2G +
  // H + I) elements (the LSTM's rows * (G + H + I)), about 2.3 times W_hh's
  // size at rows = H for the GRU.
  const int64_t rows = std::max<int64_t>(128, H);
  cb.capacity = std::max<int64_t>(1, std::min<int64_t>(std::max<int64_t>(rows / std::max<int64_t>(B, 1), 1), remaining));  // (B = 0: a batch of no rows)
  cb.buffers.reset();
  auto take = [&](int64_t floats) { return batch_take(cb.buffers, size_t(floats) * es); };
  cb.dgi = take(cb.capacity * B * G);
  cb.dgh = one ? cb.dgi : take(cb.capacity * B * G);
  cb.x = take(cb.capacity * B * I);
  cb.h = take(cb.capacity * B * H);
  cb.dw[0] = dst[2], cb.dw[1] = dst[3], cb.dw[2] = dst[4], cb.dw[3] = dst[5];
  cb.H = H, cb.G = G;
  cb.first = &n;
  cb.count = 0;
}

}  // namespace

// dW [G, N] += dg^T v for dg [rows, G], v [rows, N] on segtape's one-thread
// kernel, where OpenBLAS runs more threads than pay for so small a product
// (cpu::threads_do_not_pay: B = 1's batch of a 32-step segment, 1.5 M
// multiply-adds at H = 128, ran slower on OpenBLAS's two threads than on
// one). dg is read in place as the kernel's transposed A; v is packed into
// `spare` (the batch's arena, reset with the batch). False where it does not apply.
bool weight_grad_on_one_thread(Arena& spare, int64_t rows, int64_t G, int64_t N, const float* dg, const float* v, float* dW) {
  if (!cpu::threads_do_not_pay(G, N, rows)) return false;
  auto* pv = static_cast<float*>(batch_take(spare, cpu::packed_floats(rows, N) * sizeof(float)));
  cpu::pack_b(v, rows, N, false, pv);
  cpu::packed_gemm(G, N, rows, dg, G, pv, 1.0f, dW, N, true);
  return true;
}

CellGrads cell_grads(Tape& tape, CellBatches& batches, const Node& n, const ops::Grads& dst, int64_t H, int64_t G, bool one) {
  const Tensor &x = n.in[0], &w_ih = n.in[2], &w_hh = n.in[3];
  const int64_t B = x.dim(0), I = x.dim(1);
  const size_t es = dtype_size(n.out.dtype);
  // Deferred weight gradients: this step's rows go into its group's batch
  // (see CellBatches); not a cell on input gates computed beforehand.
  const bool batch = batches_weight_grads(tape) && !cell_inputs(n).pre && w_ih.node < 0 && w_hh.node < 0 && dst[2] && dst[3] &&
                     (!dst[4] || n.in[4].node < 0) && (!dst[5] || n.in[5].node < 0);
  if (!batch) {
    void* dgi = TapeInternals::scratch(tape, size_t(B * G) * es);              // d(x W_ih^T + b_ih)
    void* dgh = one ? dgi : TapeInternals::scratch(tape, size_t(B * G) * es);  // d(h W_hh^T + b_hh)
    return {dgi, dgh, nullptr};
  }
  CellBatch* cb = nullptr;
  for (CellBatch& b : batches.open)
    if (b.first && same_group(b, *b.first, n, dst)) cb = &b;
  for (size_t i = 0; i < batches.open.size() && !cb; ++i)
    if (!batches.open[i].first) cb = &batches.open[i];
  if (!cb) {  // every batch open for another group: the next in turn is flushed and taken
    cb = &batches.open[size_t(batches.next)];
    batches.next = (batches.next + 1) % CellBatches::kOpen;
    flush_cell_batch(*cb);
  }
  if (!cb->first) start_batch(*cb, batches.remaining, n, dst, H, G, one);
  const int64_t slot = cb->count++;
  --batches.remaining;
  auto bytes = [](void* p) { return static_cast<std::byte*>(p); };
  std::memcpy(bytes(cb->x) + size_t(slot * B * I) * es, x.ptr, size_t(B * I) * es);
  std::memcpy(bytes(cb->h) + size_t(slot * B * H) * es, n.in[1].ptr, size_t(B * H) * es);  // the state's h rows
  return {bytes(cb->dgi) + size_t(slot * B * G) * es, bytes(cb->dgh) + size_t(slot * B * G) * es, cb};
}

void cell_grads_done(const Node& n, const ops::Grads& dst, const CellGrads& cg, int64_t H, int64_t G) {
  if (cg.batch) {
    if (cg.batch->count == cg.batch->capacity) flush_cell_batch(*cg.batch);
    return;
  }
  const int64_t B = n.in[0].dim(0), I = n.in[0].dim(1);
  const CellInputs ci = cell_inputs(n);
  dispatch(n.out.dtype, [&]<class T>() {
    cell_weight_grads<T>(B, I, H, G, static_cast<const T*>(cg.dgi), static_cast<const T*>(cg.dgh), static_cast<const T*>(n.in[0].ptr),
                         static_cast<const T*>(n.in[1].ptr),
                         {grad_of(dst, ci.w_ih), grad_of(dst, ci.w_hh), grad_of(dst, ci.b_ih), grad_of(dst, ci.b_hh)});
  });
}

void flush_cell_batch(CellBatch& cb) {
  if (cb.first && cb.count > 0) {
    const Node& n = *cb.first;
    const int64_t rows = cb.count * n.in[0].dim(0), I = n.in[0].dim(1);
    const std::array<void*, 4> dw = {cb.dw[0], cb.dw[1], cb.dw[2], cb.dw[3]};
    dispatch(n.out.dtype, [&]<class T>() {
      cell_weight_grads<T>(rows, I, cb.H, cb.G, static_cast<T*>(cb.dgi), static_cast<T*>(cb.dgh), static_cast<T*>(cb.x),
                           static_cast<T*>(cb.h), dw, &cb.buffers);
    });
  }
  cb.first = nullptr;
  cb.count = 0;
}

void flush_cell_batches(CellBatches& cb) {
  for (CellBatch& b : cb.open) flush_cell_batch(b);
  cb.next = 0;
}

void clear_packed(PackedWeights& pw) {
  if (pw.count == 0) return;
  pw.count = 0;
  pw.buffers.reset();
}

void packed_written(PackedWeights& pw, const void* p, size_t bytes) {
  for (int i = 0; i < pw.count; ++i) {
    PackedWeights::Entry& e = pw.entries[size_t(i)];
    if (e.data && bytes_overlap(p, bytes, e.src, size_t(e.K * e.N) * sizeof(float))) e.stale = true;
  }
}

const float* packed_weight(PackedWeights& pw, const Tensor& w, int64_t M, int64_t K, int64_t N, bool trans) {
  if (w.dtype != DType::F32 || w.space != Space::Persistent || !cpu::packed_worthwhile(M, N, K) || cpu::bf16_products()) return nullptr;
  PackedWeights::Entry* e = nullptr;
  for (int i = 0; i < pw.count && !e; ++i) {
    PackedWeights::Entry& c = pw.entries[size_t(i)];
    if (c.src == w.ptr && c.trans == trans && c.K == K && c.N == N) e = &c;
  }
  if (e && e->data) {
    if (e->stale) cpu::pack_b(static_cast<const float*>(w.ptr), K, N, trans, e->data), e->stale = false;
    return e->data;
  }
  if (!e) {
    if (pw.count == int(pw.entries.size())) return nullptr;
    e = &pw.entries[size_t(pw.count++)];
    *e = {w.ptr, K, N, trans, nullptr, 0, false};
  }
  if (M < cpu::kFewRows && ++e->uses < cpu::kPackAfter) return nullptr;
  auto* data = static_cast<float*>(pw.buffers.try_alloc(cpu::packed_floats(K, N) * sizeof(float)));
  if (!data) return nullptr;
  cpu::pack_b(static_cast<const float*>(w.ptr), K, N, trans, data);
  e->data = data;
  return data;
}

void prepare_cell_batch(CellBatches& cb, const Tape& tape, int64_t last_node) {
  for (CellBatch& b : cb.open) b.first = nullptr, b.count = 0;
  cb.remaining = 0;
  cb.next = 0;
  if (!batches_weight_grads(tape)) return;
  const auto& nodes = tape.nodes();
  for (int64_t i = 0; i <= last_node; ++i)
    if ((nodes[size_t(i)].op == OpKind::GruCell || nodes[size_t(i)].op == OpKind::LstmCell) && !cell_inputs(nodes[size_t(i)]).pre)
      ++cb.remaining;
}

}  // namespace detail
#ifdef SEGTAPE_HAVE_CUDA
// ---- CUDA (engine/cuda/op_table.cpp dispatches here; kernels in cuda/kernels.h)
namespace ops {
using cuda::in;
using cuda::out;

// GRU gates of one step into S [B, 4H] (and y [B, H] when non-null): two
// GEMMs into the backend's temporaries, then the fused gate kernel.
// On input gates computed beforehand (gru_cell_gates) gi is the node's x and b_ih zero.
template <class T>
void gru_gates_cuda(cuda::CudaBackend& be, const Node& nd, T* S, T* y) {
  const detail::CellInputs ci = detail::cell_inputs(nd);
  const Tensor &x = nd.in[0], &h = nd.in[1], &w_hh = nd.in[size_t(ci.w_hh)];
  const int64_t B = x.dim(0), I = x.dim(1), H = h.dim(1);
  const T* gi = in<T>(x);
  const T* bi = nullptr;
  if (ci.pre) {
    T* zero = be.temp<T>(3 * H);
    be.zero(zero, size_t(3 * H) * sizeof(T));
    bi = zero;
  } else {
    T* p = be.temp<T>(B * 3 * H);  // [B, 3H]
    be.gemm(false, true, B, 3 * H, I, T(1), in<T>(x), I, in<T>(nd.in[2]), I, T(0), p, 3 * H);
    gi = p, bi = in<T>(nd.in[4]);
  }
  T* gh = be.temp<T>(B * 3 * H);  // [B, 3H]
  be.gemm(false, true, B, 3 * H, H, T(1), in<T>(h), H, in<T>(w_hh), H, T(0), gh, 3 * H);
  cuda::gru_gates_forward<T>(be.stream(), B, H, gi, gh, bi, in<T>(nd.in[size_t(ci.b_hh)]), in<T>(h), S, y);
}

void gru_cell_forward_cuda(cuda::CudaBackend& be, Node& n) {
  detail::dispatch(n.out.dtype, [&]<class T>() { gru_gates_cuda<T>(be, n, static_cast<T*>(n.saved), out<T>(n.out)); });
}

// Each cell's weight gradients by its own GEMMs (no batching across steps on CUDA).
void gru_cell_backward_cuda(cuda::CudaBackend& be, const Node& nd, const void* gout, const Grads& dst) {
  detail::dispatch(nd.out.dtype, [&]<class T>() {
    const cudaStream_t s = be.stream();
    const detail::CellInputs ci = detail::cell_inputs(nd);
    const Tensor &xin = nd.in[0], &hin = nd.in[1], &w_hh = nd.in[size_t(ci.w_hh)];
    const int64_t B = xin.dim(0), I = xin.dim(1), H = hin.dim(1);
    const T* g = static_cast<const T*>(gout);
    const T* S = static_cast<const T*>(nd.saved);
    if (!S) {  // recompute mode: the gates again, from the inputs
      T* R = be.temp<T>(B * 4 * H);
      gru_gates_cuda<T>(be, nd, R, nullptr);
      S = R;
    }
    T* dgi = be.temp<T>(B * 3 * H);  // d(x W_ih^T + b_ih) [B, 3H]
    T* dgh = be.temp<T>(B * 3 * H);  // d(h W_hh^T + b_hh) [B, 3H]
    T* dh = static_cast<T*>(dst[1]);
    cuda::gru_gates_backward<T>(s, B, H, g, in<T>(hin), S, dgi, dgh, dh);
    if (T* dx = static_cast<T*>(dst[0])) {
      if (ci.pre) cuda::add_strided<T>(s, dx, 3 * H, dgi, 3 * H, B, 3 * H);  // gi's gradient is the gates'
      else be.gemm(false, false, B, I, 3 * H, T(1), dgi, 3 * H, in<T>(nd.in[2]), I, T(1), dx, I);
    }
    if (dh) be.gemm(false, false, B, H, 3 * H, T(1), dgh, 3 * H, in<T>(w_hh), H, T(1), dh, H);
    if (T* d = static_cast<T*>(detail::grad_of(dst, ci.w_ih))) be.gemm(true, false, 3 * H, I, B, T(1), dgi, 3 * H, in<T>(xin), I, T(1), d, I);
    if (T* d = static_cast<T*>(detail::grad_of(dst, ci.w_hh))) be.gemm(true, false, 3 * H, H, B, T(1), dgh, 3 * H, in<T>(hin), H, T(1), d, H);
    if (T* d = static_cast<T*>(detail::grad_of(dst, ci.b_ih))) cuda::column_sums<T>(s, dgi, d, B, 3 * H, be.partials<T>());
    if (T* d = static_cast<T*>(detail::grad_of(dst, ci.b_hh))) cuda::column_sums<T>(s, dgh, d, B, 3 * H, be.partials<T>());
  });
}

}  // namespace ops
#endif  // SEGTAPE_HAVE_CUDA

}  // namespace segtape
