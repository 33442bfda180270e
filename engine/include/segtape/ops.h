// Differentiable ops. Each takes tensors of one tape; outputs live in the
// open segment's arena. Shapes are checked and a mismatch raises ShapeError
// naming the op and the shapes.
#pragma once
#include <span>

#include "segtape/op_list.h"
#include "segtape/tape.h"

namespace segtape {

// C = op(a) @ op(b), 2-D; op transposes when the flag is set.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// The elementwise ops, one per line of segtape/op_list.h (their formulas are
// there): name(a) for each Unary line (tanh(a), ...), name(a, s) for the
// UnaryScalar one (scale(a, s)), and name(a, b) for each Binary line
// (add(a, b), ...) with row broadcasting: b has a's shape, or numel == a's
// last dim (a bias), or one element.
#define SEGTAPE_DECLARE_UNARY(Kind, name, ...) Tensor name(const Tensor& a);
#define SEGTAPE_DECLARE_UNARY_SCALAR(Kind, name, ...) Tensor name(const Tensor& a, double s);
#define SEGTAPE_DECLARE_BINARY(Kind, name, ...) Tensor name(const Tensor& a, const Tensor& b);
SEGTAPE_UNARY_PLAIN_OPS(SEGTAPE_DECLARE_UNARY)
SEGTAPE_UNARY_SCALAR_OPS(SEGTAPE_DECLARE_UNARY_SCALAR)
SEGTAPE_BINARY_OPS(SEGTAPE_DECLARE_BINARY)
#undef SEGTAPE_DECLARE_UNARY
#undef SEGTAPE_DECLARE_UNARY_SCALAR
#undef SEGTAPE_DECLARE_BINARY
// Reductions: sum(a) / mean(a) of all elements -> shape []; sum(a, axis) /
// mean(a, axis) along one axis, which is removed (negative axes count from
// the end: -1 is the last).
Tensor sum(const Tensor& a);
Tensor mean(const Tensor& a);
Tensor sum(const Tensor& a, int axis);
Tensor mean(const Tensor& a, int axis);
// Along the last axis.
Tensor softmax(const Tensor& a);
Tensor log_softmax(const Tensor& a);
enum class Reduction : uint8_t { Mean, Sum };
// logits [B, C], targets int64 [B]; fused log-softmax + NLL. Targets equal to
// ignore_index contribute nothing (Mean divides by the count of the others).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction r = Reduction::Mean,
                     int64_t ignore_index = -100);
Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction r = Reduction::Mean);
// Any number of parts: more than a node's 6 inputs become a balanced tree of
// concat nodes (each element copied about log_6(n) times; no heap allocation).
// One part is returned as it is (no copy, no node), as reshape returns a view.
Tensor concat(std::span<const Tensor> parts, int axis);
Tensor concat(std::initializer_list<Tensor> parts, int axis);
Tensor slice(const Tensor& a, int axis, int64_t start, int64_t length);
Tensor reshape(const Tensor& a, const Shape& s);  // a view: no bytes
Tensor transpose(const Tensor& a);                // 2-D
Tensor detach(const Tensor& a);                   // a view with no history
// weight [N, D], indices int64 of any shape -> indices.shape + [D]
Tensor embedding(const Tensor& weight, const Tensor& indices);
// PyTorch's GRUCell: x [B, I], h [B, H], w_ih [3H, I], w_hh [3H, H], b_ih/b_hh [3H]
// (gates r, z, n). Forward and backward are fused; saves r, z, n and W_hn h + b_hn.
// recompute: save nothing beyond the inputs and recompute the gates in backward
// (in-step checkpointing: two more GEMMs in backward, 4H fewer floats per row kept).
Tensor gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                const Tensor& b_ih, const Tensor& b_hh, bool recompute = false);

// The cell on input gates computed beforehand: gi = x w_ih^T + b_ih [B, 3H],
// the rest as gru_cell (the same node, with inputs gi, h, w_hh, b_hh). For a
// first layer reading token embeddings E, gi is a token's row of the table
// E w_ih^T + b_ih [vocab, 3H] (embedding(table, tokens)): one product a
// segment instead of three a step (forward, dx, dw_ih), where the vocabulary
// is smaller than the segment's tokens. Its w_hh gradients are not batched
// over the steps (no x to keep); dgi is gi's gradient.
Tensor gru_cell_gates(const Tensor& gi, const Tensor& h, const Tensor& w_hh, const Tensor& b_hh);

// PyTorch's single-layer GRU over a whole sequence, as ONE op: x [T, B, I],
// h0 [B, H], weights and biases as gru_cell's -> the state at every step
// [T, B, H] (the last row is h_T). On CUDA one node runs cuDNN's GRU
// (cudnnRNNForward / BackwardData / BackwardWeights); on the CPU it is
// composed of T fused gru_cell steps (same values, a node per step).
// keep (optional, [T, B], x's dtype, no gradient): per-stream resets inside
// the sequence. The state entering step t is keep[t, b] * h_{t-1} (h0 at
// t = 0): 1 carries it, 0 starts stream b's next episode from zero at step t
// (PyTorch: h = h * (1 - done) before each step). On CUDA the fused kernels
// take it inside their launch; where they do not run, the op composes
// gru_cell steps with the mask (cuDNN's GRU has no resets).
Tensor gru_sequence(const Tensor& x, const Tensor& h0, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                    const Tensor& b_hh, const Tensor& keep = Tensor{});
// Whether gru_sequence with a keep on this tape, for a state [B, H] of dtype
// d, runs as one fused node (the CUDA backend's fused kernels, where their
// plan fits the device and the shape) rather than composed of gru_cell steps.
bool gru_sequence_fused(Tape& tape, int64_t B, int64_t H, DType d);
// The path such a gru_sequence (with a keep) takes, and why, in words: the
// fused kernels and their plan, or gru_cell steps and what kept the kernels
// out (the device, the shape, the kernel switch); for a run's summary.
std::string gru_sequence_path(Tape& tape, int64_t B, int64_t H, DType d);

// PyTorch's LSTMCell as one fused op on a state that holds h and c as one
// tensor: x [B, I], state [2, B, H] (state[0] = h, state[1] = c), w_ih [4H, I],
// w_hh [4H, H], b_ih / b_hh [4H] (gate rows i, f, g, o) -> the new state
// [2, B, H] (h', c'):
//   i, f, o = sigmoid(x W_i?^T + b_i? + h W_h?^T + b_h?) of their rows, g = tanh(...),
//   c' = f c + i g,  h' = o tanh(c').
// Forward and backward are fused; saves i, f, g, o (4H per row). One tensor
// for the pair is what the engine's one-output node carries and what a
// segment carries across its boundary (seg.carry(state)).
Tensor lstm_cell(const Tensor& x, const Tensor& state, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                 const Tensor& b_hh);
// The same on input gates computed beforehand, gi = x w_ih^T + b_ih [B, 4H]
// (as gru_cell_gates: inputs gi, state, w_hh, b_hh).
Tensor lstm_cell_gates(const Tensor& gi, const Tensor& state, const Tensor& w_hh, const Tensor& b_hh);
// (h, c) and the state [2, B, H]: lstm_state(h [B, H], c [B, H]) stacks them
// (a concat: a copy); lstm_h(state) and lstm_c(state) are state[0] and
// state[1] as [B, H] (a slice: a copy). Each records its node, so gradients
// flow through.
Tensor lstm_state(const Tensor& h, const Tensor& c);
Tensor lstm_h(const Tensor& state);
Tensor lstm_c(const Tensor& state);
// PyTorch's torch.lstm_cell(x, (h, c), ...) -> (h', c'): lstm_state, the
// fused op, lstm_h and lstm_c (two copies in and two out, which carrying the
// state [2, B, H] avoids).
struct LstmPair {
  Tensor h, c;  // [B, H] each
};
LstmPair lstm_cell(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                   const Tensor& b_hh);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

// Copies src's values into dst (same shape and dtype), no history. dst may be persistent.
void copy_into(const Tensor& dst, const Tensor& src);

}  // namespace segtape
