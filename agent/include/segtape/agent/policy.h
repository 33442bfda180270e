// The recurrent policy: observation encoder -> GRUCell (the compressed,
// fixed-size history) -> heads (action logits; a value head for RL).
// In window mode the GRU is replaced by a Linear layer compressing the last N
// step embeddings (no recurrent gradient by construction).
// A language model (--task lm) may instead recur through a stack of GRU or
// LSTM layers ("rnn", PyTorch's nn.GRU / nn.LSTM names), with the output
// layer tied to the embeddings: word_language_model's RNNModel.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "segtape/agent/env.h"
#include "segtape/nn/layers.h"
#include "segtape/ops.h"

namespace segtape::agent {

struct PolicyShape {
  int64_t embed = 32;
  int64_t hidden = 128;
  int64_t window = 0;  // > 0: window mode over this many step embeddings
  bool value_head = false;
  // Added to the GRU's update-gate (z) bias after PyTorch's initialization
  // (bias_hh's second block of H): with b > 0 the cell keeps about sigmoid(b)
  // of its state per step from the start, so a gradient from a long lag is not
  // gone before training begins. 0 (the default) leaves PyTorch's init bit for bit.
  double update_bias = 0;
  // The stack (--task lm): its cell, its layers, the output layer tied to
  // the embeddings (hidden == embed), and word_language_model's
  // initialisation (embeddings and output weights U(-0.1, 0.1), output
  // bias 0). A one-layer GRU, untied, is the agent's "gru" above.
  bool lstm = false;
  int64_t layers = 1;
  bool tied = false;
  bool lm_init = false;
  // A stack over tokens: layer 0's input product x W_ih^T + b_ih read from
  // the table E W_ih^T + b_ih [vocab, gates] (made once a segment, at its
  // first step) instead of made at every step (gru_cell_gates,
  // lstm_cell_gates). The same model, fewer products where the vocabulary
  // is smaller than a segment's tokens; not with dropout on the embeddings
  // (policy_shape decides: docs/agent.md, "Language models").
  bool input_table = false;
  // The value head reads a cell of its own ("critic", over the same
  // embeddings) instead of the policy's: the agent's one-layer GRU or LSTM
  // with a value head only (--critic separate). Its state is the policy's
  // rows then the critic's: [2 B, hidden] (GRU), [4 B, hidden] (LSTM: the
  // policy's h, c, then the critic's h, c).
  bool separate_critic = false;
  // > 0: Linear(hidden, head_hidden) + ReLU ("pi") before the action head,
  // and one ("vf") before the value head, which then read head_hidden units
  // (--head-hidden; not with a tied head).
  int64_t head_hidden = 0;
  // Vector observations go into the recurrent cell as they are, with no
  // encoder (--encoder none: SB3's Flatten features extractor; embed is then
  // the env's obs_dim); false: Linear(obs_dim, embed) + tanh ("encoder").
  bool raw_obs = false;
  // SB3's ortho_init: once every module is made (PyTorch's init, from the
  // same draws as without it), the linear layers outside the recurrent core
  // are drawn again orthogonal (torch.nn.init.orthogonal_), their biases 0:
  // the vector encoder and the heads' hidden layers with gain sqrt(2), the
  // action head 0.01, the value head 1. The recurrent cells, the window's
  // compress layer and token embeddings keep PyTorch's (--ortho-init).
  bool ortho_init = false;
  // The state's rows per stream (TrainConfig::state_rows): the state is
  // [state_rows() x B, hidden], layer after layer, an LSTM layer's h rows
  // then its c rows (one layer's [2, B, hidden], lstm_cell's state); with a
  // separate critic, the policy's rows then the critic's.
  int64_t state_rows() const { return (lstm ? 2 : 1) * (layers + (separate_critic ? 1 : 0)); }
  bool stacked() const { return lstm || layers > 1 || tied; }
};

class Policy : public nn::Module {
 public:
  Policy(Tape& tape, nn::Rng& rng, const EnvSpec& env, const PolicyShape& shape);
  ~Policy() override;
  // The number of parameters such a policy has, without building it (the
  // Trainer refuses a model too large for the machine before allocating
  // it); a test keeps it equal to parameter_count() of a built one for
  // every env and history.
  static int64_t parameters_for(const EnvSpec& env, const PolicyShape& shape);
  // The elements of its largest parameter (the size check's data-parallel
  // buffers: a gradient at least the bucket's size is all-reduced whole).
  static int64_t largest_parameter_for(const EnvSpec& env, const PolicyShape& shape);
  // obs: int64 tokens [B] or float vectors [B, obs_dim] -> [B, embed]; with
  // input_table, layer 0's input gates [B, gates] (what recur reads then);
  // with raw_obs, the vectors themselves.
  Tensor encode(const Tensor& obs) const;
  // The recurrent step: [B, embed], the state [state_rows B, hidden] -> the new
  // state (a one-layer GRU's is its h). `between`: for a stack, the
  // dropout masks [B, hidden] applied to each layer's output but the last's
  // (none, or layers - 1 of them).
  Tensor recur(const Tensor& e, const Tensor& h, std::span<const Tensor> between = {}) const {
    if (critic_ || lstm_critic_) return recur_with_critic(e, h);
    return gru_ ? (*gru_)(e, h) : recur_stack(e, h, between);
  }
  // What the heads read from a state: the last layer's h ([B, hidden]; the
  // state itself for the one-layer GRU), and with a separate critic the
  // policy's h then the critic's ([2 B, hidden]: each head reads its rows).
  Tensor output(const Tensor& state) const;
  // recur over T steps at once: e [T, B, embed] -> the states [T, B, hidden],
  // the state entering step t multiplied by keep[t, b] (gru_sequence).
  Tensor recur_sequence(const Tensor& e, const Tensor& h0, const Tensor& keep) const {
    if (!gru_ || critic_ || lstm_critic_) throw Error("policy: recur_sequence is the one-layer GRU's (this policy is a stack, or has a critic of its own)");
    return gru_sequence(e, h0, gru_->weight_ih, gru_->weight_hh, gru_->bias_ih, gru_->bias_hh, keep);
  }
  // Window mode: the last N embeddings, oldest first -> [B, hidden]
  Tensor compress(std::span<const Tensor> window) const;
  Tensor logits(const Tensor& feature) const;
  Tensor value(const Tensor& feature) const;
  const PolicyShape& shape() const { return shape_; }

 private:
  Tensor recur_stack(const Tensor& e, const Tensor& h, std::span<const Tensor> between) const;
  Tensor recur_with_critic(const Tensor& e, const Tensor& h) const;
  // A separate critic's feature [2 B, hidden]: the policy's rows or the critic's.
  Tensor rows_of(const Tensor& feature, bool critic) const;
  // input_table: the table of the open segment, made at its first step (and
  // again where the grad mode changed since).
  const Tensor& input_table() const;

  PolicyShape shape_;
  std::unique_ptr<nn::GRU> gru_stack_;
  std::unique_ptr<nn::LSTM> lstm_stack_;
  struct TiedHead;
  std::unique_ptr<TiedHead> tied_;  // --tied: the output layer's bias (its weight is the encoder's)
  std::unique_ptr<nn::Embedding> token_encoder_;
  std::unique_ptr<nn::Linear> vector_encoder_;
  std::unique_ptr<nn::GRUCell> gru_, critic_;
  std::unique_ptr<nn::LSTMCell> lstm_critic_;  // --critic separate with --cell lstm
  std::unique_ptr<nn::Linear> compress_;
  std::unique_ptr<nn::Linear> head_, value_;
  std::unique_ptr<nn::Linear> pi_, vf_;  // head_hidden > 0: the layers before the heads
  mutable Tensor table_;  // input_table: E W_ih^T + b_ih of layer 0 in segment table_segment_
  mutable uint32_t table_segment_ = 0;
  mutable bool table_grad_ = false;
};

// Episode resets inside a segment: the state with the rows of the streams
// whose episode just ended set to zero, h · (1 − done), so each of them starts
// its next episode from the zero state while the segment goes on for all.
// Nothing flows back across a reset (the gradient of h · 0 is 0). h is
// [R B, H] of element type T (float or double): R blocks of B rows (a
// stack's layers), row r stream r mod B's; `mask` is the caller's buffer of
// h's size (resized once). With no stream done, h comes back untouched and
// nothing is recorded.
template <class T>
Tensor reset_finished(const Tensor& h, std::span<const uint8_t> done, std::vector<T>& mask) {
  if (std::none_of(done.begin(), done.end(), [](uint8_t d) { return d != 0; })) return h;
  const auto rows = size_t(h.shape[0]), H = size_t(h.shape[1]), B = done.size();
  if (B == 0 || rows % B != 0) throw ShapeError("reset_finished: " + std::to_string(B) + " done flags for a state " + h.describe());
  mask.resize(rows * H);
  for (size_t r = 0; r < rows; ++r) std::fill_n(mask.begin() + ptrdiff_t(r * H), H, done[r % B] ? T(0) : T(1));
  return mul(h, h.tape->from(std::span<const T>(mask), h.shape));
}

}  // namespace segtape::agent
