// Engine-internal: what the recurrent cells' CPU code shares (ops/gru.cpp,
// ops/lstm.cpp): the products with their own weights, on weights packed once
// per pass where that applies (detail::packed_weight), and backward's weight
// gradients, batched over the steps of a backward (detail::CellBatch) or
// made per step. A cell's node holds x in in[0], its state in in[1] (the
// state's first B x H elements are the h its W_hh multiplies), then w_ih,
// w_hh, b_ih, b_hh; its gates are G = 3H (GRU) or 4H (LSTM) columns. The
// functions declared here are defined in ops/gru.cpp, beside the batch's
// flush (detail::flush_cell_batch).
#pragma once
#include <array>
#include <type_traits>

#include "cpu/blas.h"
#include "cpu/packed.h"
#include "ops/op.h"

namespace segtape::detail {

// A cell node's operands by role: in = {x, state, w_ih, w_hh, b_ih, b_hh},
// or, for a cell on input gates computed beforehand (gru_cell_gates,
// lstm_cell_gates: n_in 4), {gi, state, w_hh, b_hh}, with no w_ih or b_ih
// (-1) and gi read where x W_ih^T + b_ih would be.
struct CellInputs {
  bool pre;
  int w_ih, w_hh, b_ih, b_hh;  // their indices in in[] and a backward's Grads; -1: none
};
inline CellInputs cell_inputs(const Node& n) {
  if (n.n_in == 4) return {true, -1, 2, -1, 3};
  return {false, 2, 3, 4, 5};
}
// Grads[i], or none for i = -1.
inline void* grad_of(const ops::Grads& dst, int i) { return i < 0 ? nullptr : dst[size_t(i)]; }

// d[i] += s[i], i < n (a gradient passed through unchanged).
template <class T>
void add_into(T* __restrict d, const T* __restrict s, int64_t n) {
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

// C [M, N] = A [M, K] op(w) + beta C for a cell's weight w [N, K] (trans) or
// [K, N]: with w packed once per pass where that applies (packed_weight), else BLAS.
template <class T>
void weight_product(PackedWeights& pw, const Tensor& w, bool trans, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, T beta,
                    T* C, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (const float* p = packed_weight(pw, w, M, K, N, trans)) {
      cpu::packed_gemm(M, N, K, A, lda, p, beta, C, ldc);
      return;
    }
  }
  cpu::gemm(false, trans, M, N, K, T(1), A, lda, static_cast<const T*>(w.ptr), trans ? K : N, beta, C, ldc);
}

// dW [G, N] += dg^T v for dg [rows, G], v [rows, N] on segtape's one-thread
// kernel where OpenBLAS runs more threads than pay for so small a product;
// false where it does not apply.
bool weight_grad_on_one_thread(Arena& spare, int64_t rows, int64_t G, int64_t N, const float* dg, const float* v, float* dW);

// dW_ih += dgi^T x, dW_hh += dgh^T h, db_ih += colsum dgi, db_hh += colsum dgh
// over `rows` rows of G gate columns (dgi and dgh may be one buffer); `spare`:
// an arena for weight_grad_on_one_thread's copies (null: BLAS only).
template <class T>
void cell_weight_grads(int64_t rows, int64_t I, int64_t H, int64_t G, const T* dgi, const T* dgh, const T* x, const T* h,
                       std::array<void*, 4> dw, Arena* spare = nullptr) {
  auto product = [&](T* d, const T* dg, const T* v, int64_t N) {
    if constexpr (std::is_same_v<T, float>)
      if (spare && weight_grad_on_one_thread(*spare, rows, G, N, dg, v, d)) return;
    cpu::gemm(true, false, G, N, rows, T(1), dg, G, v, N, T(1), d, N);
  };
  if (T* d = static_cast<T*>(dw[0])) product(d, dgi, x, I);
  if (T* d = static_cast<T*>(dw[1])) product(d, dgh, h, H);
  if (T* d = static_cast<T*>(dw[2])) reduce_rows(d, rows * G, G, [&](int64_t i, int64_t) { return dgi[i]; });
  if (T* d = static_cast<T*>(dw[3])) reduce_rows(d, rows * G, G, [&](int64_t i, int64_t) { return dgh[i]; });
}

// Where a cell's backward writes the gradients of its gate pre-activations,
// d(x W_ih^T + b_ih) and d(h W_hh^T + b_hh), [B, G] each (one buffer where
// the two are equal, `one`: the LSTM's). Batched (TapeOptions::batch_weight_grads,
// the weights persistent and their gradients wanted): rows of the batch,
// with the step's x and h copied beside them; else the op workspace.
struct CellGrads {
  void* dgi = nullptr;
  void* dgh = nullptr;
  CellBatch* batch = nullptr;  // the batch this step's rows went into (null: not batched)
};
CellGrads cell_grads(Tape& tape, CellBatches& cb, const Node& n, const ops::Grads& dst, int64_t H, int64_t G, bool one);
// After the cell's elementwise backward and its products for dx and dh: its
// weight gradients, now (not batched) or when the batch is full.
void cell_grads_done(const Node& n, const ops::Grads& dst, const CellGrads& cg, int64_t H, int64_t G);

}  // namespace segtape::detail
