// Engine-internal: what every op family (engine/ops/<family>.cpp) shares, and
// the CPU backend's per-family entry points.
//
// An op's life: its public function (in its family's file) checks the
// inputs, fills one Node (inputs, attributes), and hands it to emit(), which
// makes the output in the segment, has the tape's backend compute it from the
// node (CPU: the family's *_cpu function below; CUDA: engine/cuda/op_table.cpp),
// and records that same node when a gradient is wanted. Backward hands the
// recorded node back to the backend.
#pragma once
#include <array>
#include <initializer_list>
#include <string>

#include "segtape/ops.h"
#include "segtape/tape.h"

namespace segtape {

namespace cuda {
class CudaBackend;  // engine/cuda/cuda_backend.h
}

namespace detail {
// Calls f.template operator()<T>() with T the C++ type of a floating dtype
// (float for F32, double otherwise: callers have excluded I64, or move its
// 8 bytes as a double's, as transpose's device kernel does).
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

// matmul's node: C [M, N] = op(A) op(B) with K inner; ia = {transpose a, transpose b}.
struct MatmulShape {
  bool ta, tb;
  int64_t M, N, K;
};
inline MatmulShape matmul_shape(const Node& n) {
  const bool ta = n.ia[0], tb = n.ia[1];
  return {ta, tb, n.out.dim(0), n.out.dim(1), ta ? n.in[0].dim(0) : n.in[0].dim(1)};
}

// Sums the rows of an [n / bn, bn] array, as terms f(i, c) of element i in
// column c, into d[bn]: the gradient of an operand broadcast over rows.
template <class T, class F>
void reduce_rows(T* d, int64_t n, int64_t bn, F f) {
  if (n == 0) return;
  for (int64_t r = 0; r < n; r += bn)
    for (int64_t c = 0; c < bn; ++c) d[c] += f(r + c, c);
}

// Backward's deferred weight gradients of the recurrent cells (gru_cell,
// lstm_cell; ops/cell.h): the rows of d(x W_ih^T) and d(h W_hh^T) of
// consecutive steps of one kind that share weights are stacked, with the
// steps' x and h, and flushed as one GEMM per weight (see TapeOptions).
struct CellBatch {
  Arena buffers{size_t(64) << 10, true, 0, {.what = "GRU weight-gradient workspace"}};
  const Node* first = nullptr;  // the group's weights and shapes come from this node
  int64_t count = 0, capacity = 0;
  int64_t H = 0, G = 0;  // the group's hidden size and gate columns (3H: GRU, 4H: LSTM)
  void* dgi = nullptr;  // [capacity * B, G]
  void* dgh = nullptr;  // [capacity * B, G]; dgi itself where the two are equal (the LSTM's)
  void* x = nullptr;    // [capacity * B, I]
  void* h = nullptr;    // [capacity * B, H]
  void* dw[4] = {};     // gradient buffers of w_ih, w_hh, b_ih, b_hh
};
// A backward's batches, one open per group of weights: a stack of layers
// meets its layers' cells in turn (layer L-1 at step t, ..., layer 0 at step
// t, then layer L-1 at step t - 1), so each layer keeps a batch of its own
// (with one batch, each cell flushed the other layer's: a batch of one step).
// A cell of a group with no open batch takes a free one, else the next in
// turn, flushed first. One group (a one-layer GRU) uses open[0] alone.
struct CellBatches {
  static constexpr int kOpen = 4;
  std::array<CellBatch, kOpen> open;
  int64_t remaining = 0;  // the cell nodes of this backward not yet met
  int next = 0;           // the batch reused when none is free
};
// Counts the cell nodes of a backward over nodes [0, last_node] of the tape
// that may be batched (sets `remaining`) and empties the batches.
void prepare_cell_batch(CellBatches& cb, const Tape& tape, int64_t last_node);
// Accumulates what a batch holds into its weight gradients and empties it.
void flush_cell_batch(CellBatch& cb);
// The same for every open batch, in order.
void flush_cell_batches(CellBatches& cb);

// Weights packed for cpu::packed_gemm (engine/cpu/packed.h): a recurrent
// cell's W_ih and W_hh are packed at their first product of a pass (under cpu::kFewRows rows,
// their cpu::kPackAfter-th) and reused by every step after it. Cleared when a
// segment opens and when a backward starts and ends; a write segtape sees
// into a weight's bytes marks its copy stale (packed_written), and the next
// product repacks it in place.
struct PackedWeights {
  struct Entry {
    const void* src = nullptr;
    int64_t K = 0, N = 0;
    bool trans = false;
    float* data = nullptr;  // null until packed
    int uses = 0;           // products with fewer than cpu::kFewRows rows, while not yet packed
    bool stale = false;     // the weight was written since: repacked into data at its next product
  };
  Arena buffers{0, true, 0, {.what = "packed weights"}};  // no chunk until a weight is packed; then one per size, kept
  std::array<Entry, 8> entries{};
  int count = 0;
};
void clear_packed(PackedWeights& pw);
// Bytes [p, p + bytes) were written (or handed out to be written): the packed
// copies of weights they overlap are marked stale and repacked in place at
// their next product. The choice of kernel for each product (its place in its
// pass) stays as it was, so a replay takes the same path. Every write segtape
// sees reaches it, most through detail::tensor_written (segtape/tensor.h) and
// Backend::bytes_written: copy_into, from_host(_bytes), data<T>() with a
// non-const T, fill_value, add_scalar, the optimizer steps.
void packed_written(PackedWeights& pw, const void* p, size_t bytes);
// The persistent weight w as the packed operand B [K, N] of C [M, N] = A B
// (B = w^T when trans), packed now if it is not yet; nullptr where the packed
// path does not apply (not float32, not persistent, too small, neither AVX-512F nor AVX2 + FMA,
// more than eight weights in one pass). With fewer than cpu::kFewRows rows
// (B = 1: each product reads the weight once, so packing it pays only over
// several) the weight is packed at its cpu::kPackAfter-th such product in the
// pass; the ones before take BLAS, so a short segment never packs.
const float* packed_weight(PackedWeights& pw, const Tensor& w, int64_t M, int64_t K, int64_t N, bool trans);
// TapeOptions::batch_weight_grads where it applies: a float32 path, off under Precision::Bf16.
inline bool batches_weight_grads(const Tape& t) { return t.options().batch_weight_grads && t.options().precision == Precision::F32; }

// What the CPU backend (engine/cpu/backend.cpp, also the host-emulated
// device) keeps for the recurrent cells (GRU, LSTM), one per tape: backward's
// weight-gradient batch and the packed weights. Its backward_begin /
// backward_end, segment_begin and bytes_written hooks (engine/backend.h)
// drive them; the cells' CPU kernels (ops/gru.cpp, ops/lstm.cpp) are handed it.
struct CpuCells {
  CellBatches batch;
  PackedWeights packed;
};
// The CPU backend's CpuCells of a tape; nullptr on a CUDA tape (tests look at its buffers).
CpuCells* cpu_cells(Tape& tape);
}  // namespace detail

namespace ops {

// Where backward accumulates (+=) the gradient of each input (nullptr: none wanted).
using Grads = std::array<void*, Node::kMaxInputs>;

// ---- the entry checks every op shares (engine/ops/emit.cpp)
std::string list(std::initializer_list<const Tensor*> ts);
// Every op needs an open segment, views included.
void require_segment(const Tape& t, const char* op);
// Defined, live, one tape, an open segment, and one floating dtype shared by all inputs.
// integers: int64 inputs are taken too (the ops that only move values:
// concat, slice, reshape, transpose); every input has the first's dtype.
Tape& check(const char* op, std::initializer_list<const Tensor*> ts, bool integers = false);
// An integer side input (indices, targets): defined, live, and on tape t,
// whose node will point at it (check() covers the floating inputs only).
void check_index(const char* op, const Tape& t, const Tensor& idx, std::initializer_list<const Tensor*> ts);
[[noreturn]] void shape_error(const char* op, const std::string& why, std::initializer_list<const Tensor*> ts);
int norm_axis(const char* op, const Tensor& a, int axis);

// A node of op k over the inputs, attributes to be filled by the caller.
Node node(OpKind k, std::span<const Tensor> ins);
inline Node node(OpKind k, std::initializer_list<Tensor> ins) { return node(k, std::span<const Tensor>(ins.begin(), ins.size())); }

// What an op keeps for backward besides its output (cross-entropy's
// log-sum-exps, the GRU gates): `bytes` in the segment arena when the node is
// recorded (kept), in the op workspace when not, or when `keep` is false
// (recompute mode: backward computes it again; n.saved is then null).
struct Saved {
  size_t bytes = 0;
  bool keep = true;
};

// Makes n.out (shape s, the first input's dtype unless d is given) in the
// segment, computes it on the tape's backend from n, and records n when a
// gradient is wanted. Returns the output.
Tensor emit(Tape& t, Node& n, const Shape& s, const char* op, Saved saved = {});
Tensor emit(Tape& t, Node& n, const Shape& s, DType d, const char* op, Saved saved = {});

// ---- the CPU backend's kernels, by family: forward computes n.out (and
// n.saved) from the node; backward accumulates into d the gradients of n's
// inputs given g, the gradient of n.out. Same contract on every backend.
template <class Op> void unary_forward_cpu(Node& n);                                  // ops/elementwise.cpp
template <class Op> void unary_backward_cpu(const Node& n, const void* g, const Grads& d);
template <class Op> void binary_forward_cpu(Node& n);
template <class Op> void binary_backward_cpu(const Node& n, const void* g, const Grads& d);
void matmul_forward_cpu(Node& n);                                                     // ops/matmul.cpp
void matmul_backward_cpu(const Node& n, const void* g, const Grads& d);
void reduce_forward_cpu(Node& n);                                                     // ops/reduce.cpp: sum, mean
void reduce_backward_cpu(const Node& n, const void* g, const Grads& d);
void softmax_forward_cpu(Node& n);                                                    // ops/reduce.cpp: (log-)softmax
void softmax_backward_cpu(const Node& n, const void* g, const Grads& d);
void cross_entropy_forward_cpu(Node& n);                                              // ops/loss.cpp
void cross_entropy_backward_cpu(const Node& n, const void* g, const Grads& d);
void mse_forward_cpu(Node& n);
void mse_backward_cpu(const Node& n, const void* g, const Grads& d);
void concat_forward_cpu(Node& n);                                                     // ops/shape.cpp
void concat_backward_cpu(const Node& n, const void* g, const Grads& d);
void slice_forward_cpu(Node& n);
void slice_backward_cpu(const Node& n, const void* g, const Grads& d);
void reshape_backward_cpu(const Node& n, const void* g, const Grads& d);
void transpose_forward_cpu(Node& n);
void transpose_backward_cpu(const Node& n, const void* g, const Grads& d);
void embedding_forward_cpu(Node& n);
void embedding_backward_cpu(const Node& n, const void* g, const Grads& d);
void gru_cell_forward_cpu(Tape& t, detail::CpuCells& cells, Node& n);                 // ops/gru.cpp
void gru_cell_backward_cpu(Tape& t, detail::CpuCells& cells, const Node& n, const void* g, const Grads& d);
void lstm_cell_forward_cpu(Tape& t, detail::CpuCells& cells, Node& n);                // ops/lstm.cpp
void lstm_cell_backward_cpu(Tape& t, detail::CpuCells& cells, const Node& n, const void* g, const Grads& d);

// ---- the CUDA backend's, by family, in the same files (compiled when CUDA
// is, SEGTAPE_HAVE_CUDA; engine/cuda/op_table.cpp dispatches to them). Same
// contract, queued on the backend's stream. GruSequence is cuDNN's
// (engine/cuda/gru_sequence.cpp).
template <class Op> void unary_forward_cuda(cuda::CudaBackend& be, Node& n);
template <class Op> void unary_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
template <class Op> void binary_forward_cuda(cuda::CudaBackend& be, Node& n);
template <class Op> void binary_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void matmul_forward_cuda(cuda::CudaBackend& be, Node& n);
void matmul_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void reduce_forward_cuda(cuda::CudaBackend& be, Node& n);
void reduce_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void softmax_forward_cuda(cuda::CudaBackend& be, Node& n);
void softmax_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void cross_entropy_forward_cuda(cuda::CudaBackend& be, Node& n);
void cross_entropy_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void mse_forward_cuda(cuda::CudaBackend& be, Node& n);
void mse_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void concat_forward_cuda(cuda::CudaBackend& be, Node& n);
void concat_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void slice_forward_cuda(cuda::CudaBackend& be, Node& n);
void slice_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void reshape_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void transpose_forward_cuda(cuda::CudaBackend& be, Node& n);
void transpose_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void embedding_forward_cuda(cuda::CudaBackend& be, Node& n);
void embedding_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void gru_cell_forward_cuda(cuda::CudaBackend& be, Node& n);
void gru_cell_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);
void lstm_cell_forward_cuda(cuda::CudaBackend& be, Node& n);
void lstm_cell_backward_cuda(cuda::CudaBackend& be, const Node& n, const void* g, const Grads& d);

}  // namespace ops
}  // namespace segtape
