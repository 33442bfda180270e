#include "segtape/agent/policy.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

namespace segtape::agent {
namespace {
// U(-bound, bound), float32 (word_language_model's init_weights).
void fill_uniform(const Tensor& t, nn::Rng& rng, double bound) {
  std::vector<float> v(size_t(t.numel()));
  for (float& x : v) x = float(rng.uniform(-bound, bound));
  t.from_host(std::span<const float>(v));
}

// torch.nn.init.orthogonal_ of a [rows, cols] weight: a normal matrix's QR
// (the larger side first), Q's columns signed by R's diagonal (modified
// Gram-Schmidt, twice, gives R's diagonal positive), times gain; the bias 0.
void fill_orthogonal(const nn::Linear& l, nn::Rng& rng, double gain) {
  const int64_t rows = l.weight.dim(0), cols = l.weight.dim(1);
  const bool wide = rows < cols;
  const auto n = size_t(wide ? cols : rows), m = size_t(wide ? rows : cols);
  std::vector<double> q(n * m);  // column j: q[j * n, (j + 1) * n)
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < m; ++j) q[j * n + i] = rng.normal();  // (row-major [n, m], as torch draws it)
  for (size_t j = 0; j < m; ++j) {
    double* c = &q[j * n];
    for (int pass = 0; pass < 2; ++pass)
      for (size_t k = 0; k < j; ++k) {
        const double* o = &q[k * n];
        double dot = 0;
        for (size_t i = 0; i < n; ++i) dot += o[i] * c[i];
        for (size_t i = 0; i < n; ++i) c[i] -= dot * o[i];
      }
    double norm = 0;
    for (size_t i = 0; i < n; ++i) norm += c[i] * c[i];
    norm = std::sqrt(norm);
    for (size_t i = 0; i < n; ++i) c[i] /= norm;
  }
  std::vector<float> w(size_t(rows * cols));
  for (size_t r = 0; r < size_t(rows); ++r)
    for (size_t c = 0; c < size_t(cols); ++c) w[r * size_t(cols) + c] = float(gain * (wide ? q[r * n + c] : q[c * n + r]));
  l.weight.from_host(std::span<const float>(w));
  if (l.bias.defined()) l.bias.from_host(std::span<const float>(std::vector<float>(size_t(l.bias.numel()), 0.0f)));
}
}  // namespace

// --tied: the output layer's own bias, "head.bias" (its weight is the encoder's).
struct Policy::TiedHead : nn::Module {
  TiedHead(Tape& t, int64_t n) : Module(t), bias(register_parameter("bias", {n})) {}
  Tensor bias;
};

Policy::~Policy() = default;

Policy::Policy(Tape& tape, nn::Rng& rng, const EnvSpec& env, const PolicyShape& s) : Module(tape), shape_(s) {
  if (s.embed < 1 || s.hidden < 1) throw Error("policy: embed and hidden sizes must be >= 1");
  if (!std::isfinite(s.update_bias) || (s.update_bias != 0 && s.window > 0))
    throw Error("policy: update_bias must be finite, and 0 in window mode (which has no GRU)");
  if (s.raw_obs && (env.vocab > 0 || s.embed != env.obs_dim || s.layers > 1 || s.tied || s.window > 0))
    throw Error("policy: raw observations are vectors of obs_dim (embed " + std::to_string(s.embed) + ", obs_dim " +
                std::to_string(env.obs_dim) + ") into the agent's one-layer GRU or LSTM");
  if (env.vocab > 0) {
    token_encoder_ = std::make_unique<nn::Embedding>(tape, rng, env.vocab, s.embed);
    register_module("encoder", *token_encoder_);
  } else if (!s.raw_obs) {
    vector_encoder_ = std::make_unique<nn::Linear>(tape, rng, env.obs_dim, s.embed);
    register_module("encoder", *vector_encoder_);
  }
  if (s.stacked() && (s.window > 0 || s.update_bias != 0 || (s.tied && (env.vocab == 0 || s.hidden != s.embed))))
    throw Error("policy: a stack of layers recurs (no window), has no update_bias, and ties its output to token embeddings of its hidden size");
  if (s.input_table && (!s.stacked() || env.vocab == 0)) throw Error("policy: an input table is a stack's over tokens");
  if (s.lm_init) fill_uniform(token_encoder_ ? token_encoder_->weight : vector_encoder_->weight, rng, 0.1);
  if (s.stacked()) {
    if (s.lstm) register_module("rnn", *(lstm_stack_ = std::make_unique<nn::LSTM>(tape, rng, s.embed, s.hidden, s.layers)));
    else register_module("rnn", *(gru_stack_ = std::make_unique<nn::GRU>(tape, rng, s.embed, s.hidden, s.layers)));
  } else if (s.window > 0) {
    compress_ = std::make_unique<nn::Linear>(tape, rng, s.window * s.embed, s.hidden);
    register_module("compress", *compress_);
  } else {
    gru_ = std::make_unique<nn::GRUCell>(tape, rng, s.embed, s.hidden);
    register_module("gru", *gru_);
  }
  if (s.separate_critic) {
    if (!(gru_ || (lstm_stack_ && s.layers == 1 && !s.tied && !s.input_table)) || !s.value_head)
      throw Error("policy: a separate critic is the one-layer GRU's or LSTM's, with a value head");
    if (gru_) register_module("critic", *(critic_ = std::make_unique<nn::GRUCell>(tape, rng, s.embed, s.hidden)));
    else register_module("critic", *(lstm_critic_ = std::make_unique<nn::LSTMCell>(tape, rng, s.embed, s.hidden)));
  }
  for (nn::GRUCell* cell : {gru_.get(), critic_.get()})
    if (cell && s.update_bias != 0) {  // the gates are r, z, n (PyTorch's order): z is the second block
      std::vector<float> b = cell->bias_hh.to_host<float>();  // (the policy is float32)
      for (int64_t i = s.hidden; i < 2 * s.hidden; ++i) b[size_t(i)] += float(s.update_bias);
      cell->bias_hh.from_host(std::span<const float>(b));
    }
  if (s.head_hidden < 0 || (s.head_hidden > 0 && s.tied)) throw Error("policy: head_hidden must be >= 0, and 0 with a tied head");
  const int64_t into_heads = s.head_hidden > 0 ? s.head_hidden : s.hidden;
  if (s.head_hidden > 0) {
    pi_ = std::make_unique<nn::Linear>(tape, rng, s.hidden, s.head_hidden);
    register_module("pi", *pi_);
  }
  if (s.tied) {  // the output layer's weight is the encoder's [vocab, embed]; its bias is its own, zero (the example's)
    tied_ = std::make_unique<TiedHead>(tape, env.num_actions);
    register_module("head", *tied_);
  } else {
    head_ = std::make_unique<nn::Linear>(tape, rng, into_heads, env.num_actions);
    register_module("head", *head_);
    if (s.lm_init) {
      fill_uniform(head_->weight, rng, 0.1);
      const std::vector<float> zero(size_t(env.num_actions), 0.0f);
      head_->bias.from_host(std::span<const float>(zero));
    }
  }
  if (s.value_head && s.head_hidden > 0) {
    vf_ = std::make_unique<nn::Linear>(tape, rng, s.hidden, s.head_hidden);
    register_module("vf", *vf_);
  }
  if (s.value_head) {
    value_ = std::make_unique<nn::Linear>(tape, rng, into_heads, 1);
    register_module("value", *value_);
  }
  if (s.ortho_init) {  // (SB3's module gains: features and MLP sqrt(2), action 0.01, value 1)
    if (s.lm_init) throw Error("policy: ortho_init is the agents' (SB3's ortho_init); a language model initialises as word_language_model");
    const double root2 = std::sqrt(2.0);
    using Gain = std::pair<const nn::Linear*, double>;
    for (const auto& [layer, gain] : {Gain{vector_encoder_.get(), root2}, Gain{pi_.get(), root2}, Gain{vf_.get(), root2},
                                      Gain{head_.get(), 0.01}, Gain{value_.get(), 1.0}})
      if (layer) fill_orthogonal(*layer, rng, gain);
  }
}

int64_t Policy::parameters_for(const EnvSpec& env, const PolicyShape& s) {
  auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  int64_t n = env.vocab > 0 ? env.vocab * s.embed : s.raw_obs ? 0 : linear(env.obs_dim, s.embed);  // encoder
  const int64_t gates = s.lstm ? 4 : 3;
  n += s.window > 0 ? linear(s.window * s.embed, s.hidden)                                        // compress
                    : gates * s.hidden * (s.embed + s.hidden) + 2 * gates * s.hidden +             // gru / rnn layer 0
                          (s.layers - 1) * (gates * s.hidden * 2 * s.hidden + 2 * gates * s.hidden);  // rnn layers 1...
  if (s.separate_critic) n += gates * s.hidden * (s.embed + s.hidden) + 2 * gates * s.hidden;     // critic
  const int64_t into_heads = s.head_hidden > 0 ? s.head_hidden : s.hidden;
  if (s.head_hidden > 0) n += linear(s.hidden, s.head_hidden) * (s.value_head ? 2 : 1);          // pi, vf
  n += s.tied ? env.num_actions : linear(into_heads, env.num_actions);                              // head
  if (s.value_head) n += linear(into_heads, 1);                                        // value
  return n;
}

int64_t Policy::largest_parameter_for(const EnvSpec& env, const PolicyShape& s) {
  const int64_t gates = s.lstm ? 4 : 3, into_heads = s.head_hidden > 0 ? s.head_hidden : s.hidden;
  int64_t n = env.vocab > 0 ? env.vocab * s.embed : s.raw_obs ? 0 : env.obs_dim * s.embed;  // encoder
  if (s.window > 0) n = std::max(n, s.window * s.embed * s.hidden);                         // compress
  else n = std::max({n, gates * s.hidden * s.embed, gates * s.hidden * s.hidden});           // W_ih (any layer), W_hh
  if (s.head_hidden > 0) n = std::max(n, s.hidden * s.head_hidden);
  return std::max(n, s.tied ? env.num_actions : into_heads * env.num_actions);  // head
}

Tensor Policy::encode(const Tensor& obs) const {
  if (shape_.input_table) return embedding(input_table(), obs);
  if (token_encoder_) return (*token_encoder_)(obs);
  if (shape_.raw_obs) return obs;
  return tanh((*vector_encoder_)(obs));
}

const Tensor& Policy::input_table() const {
  Tape& t = *token_encoder_->weight.tape;
  if (!table_.defined() || table_segment_ != t.segment_index() || table_grad_ != t.grad_enabled()) {
    const Tensor& w = shape_.lstm ? lstm_stack_->layers()[0].weight_ih : gru_stack_->layers()[0].weight_ih;
    const Tensor& b = shape_.lstm ? lstm_stack_->layers()[0].bias_ih : gru_stack_->layers()[0].bias_ih;
    table_ = add(matmul(token_encoder_->weight, w, false, true), b);  // [vocab, gates]
    table_segment_ = t.segment_index(), table_grad_ = t.grad_enabled();
  }
  return table_;
}

Tensor Policy::recur_stack(const Tensor& e, const Tensor& h, std::span<const Tensor> between) const {
  const int64_t H = shape_.hidden, L = shape_.layers, P = shape_.lstm ? 2 : 1, B = e.dim(0);
  if (h.rank() != 2 || h.dim(0) != P * L * B || h.dim(1) != H)
    throw ShapeError("policy: the state " + h.describe() + " must be [" + std::to_string(P * L * B) + ", " + std::to_string(H) + "] (" +
                     std::to_string(L) + (shape_.lstm ? " LSTM" : " GRU") + " layers of " + std::to_string(H) + " for " +
                     std::to_string(B) + " streams)");
  if (!between.empty() && int64_t(between.size()) != L - 1)
    throw ShapeError("policy: " + std::to_string(between.size()) + " dropout masks between " + std::to_string(L) + " layers");
  std::array<Tensor, 16> next;  // each layer's new state (layers <= 16: TrainConfig::validate)
  Tensor x = e;
  for (int64_t l = 0; l < L; ++l) {
    const Tensor s = L == 1 ? h : slice(h, 0, l * P * B, P * B);  // (one copy; none for one layer)
    const bool gates = l == 0 && shape_.input_table;  // x: layer 0's input gates (encode)
    if (shape_.lstm) {
      const auto& W = lstm_stack_->layers()[size_t(l)];
      const Tensor st = gates ? lstm_cell_gates(x, reshape(s, {2, B, H}), W.weight_hh, W.bias_hh)
                              : lstm_cell(x, reshape(s, {2, B, H}), W.weight_ih, W.weight_hh, W.bias_ih, W.bias_hh);
      next[size_t(l)] = reshape(st, {2 * B, H});
      if (l + 1 < L) x = lstm_h(st);
    } else {
      const auto& W = gru_stack_->layers()[size_t(l)];
      x = next[size_t(l)] = gates ? gru_cell_gates(x, s, W.weight_hh, W.bias_hh) : gru_cell(x, s, W.weight_ih, W.weight_hh, W.bias_ih, W.bias_hh);
    }
    if (l + 1 < L && !between.empty()) x = mul(x, between[size_t(l)]);
  }
  return concat(std::span<const Tensor>(next.data(), size_t(L)), 0);  // (one copy; none for one layer)
}

Tensor Policy::recur_with_critic(const Tensor& e, const Tensor& h) const {
  const int64_t B = e.dim(0), H = shape_.hidden, P = lstm_critic_ ? 2 : 1;
  if (h.rank() != 2 || h.dim(0) != 2 * P * B || h.dim(1) != H)
    throw ShapeError("policy: the state " + h.describe() + " must be [" + std::to_string(2 * P * B) + ", " + std::to_string(H) +
                     "] (the policy's " + (lstm_critic_ ? "LSTM" : "GRU") + " and the critic's, " + std::to_string(B) + " streams each)");
  if (critic_) return concat({(*gru_)(e, slice(h, 0, 0, B)), (*critic_)(e, slice(h, 0, B, B))}, 0);
  const Tensor mine = recur_stack(e, slice(h, 0, 0, 2 * B), {});
  const Tensor theirs = reshape((*lstm_critic_)(e, reshape(slice(h, 0, 2 * B, 2 * B), {2, B, H})), {2 * B, H});
  return concat({mine, theirs}, 0);
}

Tensor Policy::rows_of(const Tensor& feature, bool critic) const {
  const int64_t B = feature.dim(0) / 2;
  return slice(feature, 0, critic ? B : 0, B);
}

Tensor Policy::value(const Tensor& feature) const {
  const Tensor x = critic_ || lstm_critic_ ? rows_of(feature, true) : feature;
  return (*value_)(vf_ ? relu((*vf_)(x)) : x);
}

Tensor Policy::output(const Tensor& state) const {
  if (gru_ || !shape_.stacked()) return state;
  if (lstm_critic_) {  // [h; c; critic's h; critic's c] -> [h; critic's h]
    const int64_t B = state.dim(0) / 4;
    return concat({slice(state, 0, 0, B), slice(state, 0, 2 * B, B)}, 0);
  }
  const int64_t P = shape_.lstm ? 2 : 1, B = state.dim(0) / (P * shape_.layers);
  return shape_.layers == 1 && !shape_.lstm ? state : slice(state, 0, (shape_.layers - 1) * P * B, B);
}

Tensor Policy::logits(const Tensor& feature) const {
  if (tied_) return add(matmul(feature, token_encoder_->weight, false, true), tied_->bias);
  const Tensor x = critic_ || lstm_critic_ ? rows_of(feature, false) : feature;
  return (*head_)(pi_ ? relu((*pi_)(x)) : x);
}

Tensor Policy::compress(std::span<const Tensor> window) const { return tanh((*compress_)(concat(window, 1))); }

}  // namespace segtape::agent
