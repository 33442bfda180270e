// Engine-internal: the backward dispatch and the CPU kernels it shares with forward.
#pragma once
#include <array>

#include "segtape/tape.h"

namespace segtape {

namespace detail {
// Calls f.template operator()<T>() with T the C++ type of a floating dtype
// (float for F32, double otherwise: callers have excluded I64).
template <class F>
void dispatch(DType d, F&& f) {
  if (d == DType::F32) f.template operator()<float>();
  else f.template operator()<double>();
}

// [outer, n, inner] view of a shape around an axis (the CPU ops and the CUDA op table).
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};
inline AxisView axis_view(const Shape& s, int axis) {
  AxisView v;
  for (int i = 0; i < axis; ++i) v.outer *= s[i];
  v.n = s[axis];
  for (int i = axis + 1; i < s.rank; ++i) v.inner *= s[i];
  return v;
}

// Backward of C [M, N] = op(A) op(B) (K inner), accumulating into dA / dB
// (nullptr: not wanted), through any GEMM with cpu::gemm's row-major
// contract: gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc). The
// CPU passes cpu::gemm, the CUDA backend its cuBLAS mapping.
template <class T, class Gemm>
void matmul_backward(Gemm&& gemm, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* g, const T* a, int64_t lda,
                     const T* b, int64_t ldb, T* da, T* db) {
  if (da) {
    if (!ta) gemm(false, !tb, M, K, N, T(1), g, N, b, ldb, T(1), da, K);  // dA = dC op(B)^T
    else gemm(tb, true, K, M, N, T(1), b, ldb, g, N, T(1), da, M);        // dA = op(B) dC^T
  }
  if (db) {
    if (!tb) gemm(!ta, false, K, N, M, T(1), a, lda, g, N, T(1), db, N);  // dB = op(A)^T dC
    else gemm(true, ta, N, K, M, T(1), g, N, a, lda, T(1), db, K);        // dB = dC^T op(A)
  }
}

// Backward's deferred GRU weight gradients: the rows of d(x W_ih^T) and
// d(h W_hh^T) of consecutive steps that share weights are stacked, with the
// steps' x and h, and flushed as one GEMM per weight (see TapeOptions).
struct GruBatch {
  Arena buffers{size_t(64) << 10, true};
  const Node* first = nullptr;  // the group's weights and shapes come from this node
  int64_t count = 0, capacity = 0, remaining = 0;
  void* dgi = nullptr;  // [capacity * B, 3H]
  void* dgh = nullptr;  // [capacity * B, 3H]
  void* x = nullptr;    // [capacity * B, I]
  void* h = nullptr;    // [capacity * B, H]
  void* dw[4] = {};     // gradient buffers of w_ih, w_hh, b_ih, b_hh
};
bool same_gru_group(const Node& a, const Node& b, const std::array<void*, Node::kMaxInputs>& dst);
void start_gru_batch(Tape& tape, const Node& n, const std::array<void*, Node::kMaxInputs>& dst);
// Accumulates what the batch holds into the weight gradients and empties it.
void flush_gru_batch(Tape& tape);
// Counts the GRU nodes of this backward that may be batched (sets `remaining`).
void prepare_gru_batch(Tape& tape, int64_t last_node);
}  // namespace detail

// Accumulates (+=) the gradients of node n's inputs into dst[j] (nullptr: input j needs none),
// given gout, the gradient of n's output.
void backward_node(Tape& tape, const Node& n, const void* gout, const std::array<void*, Node::kMaxInputs>& dst);

}  // namespace segtape
