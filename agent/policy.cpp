#include "segtape/agent/policy.h"

#include <cmath>
#include <vector>

namespace segtape::agent {

Policy::Policy(Tape& tape, nn::Rng& rng, const EnvSpec& env, const PolicyShape& s) : Module(tape), shape_(s) {
  if (s.embed < 1 || s.hidden < 1) throw Error("policy: embed and hidden sizes must be >= 1");
  if (!std::isfinite(s.update_bias) || (s.update_bias != 0 && s.window > 0))
    throw Error("policy: update_bias must be finite, and 0 in window mode (which has no GRU)");
  if (env.vocab > 0) {
    token_encoder_ = std::make_unique<nn::Embedding>(tape, rng, env.vocab, s.embed);
    register_module("encoder", *token_encoder_);
  } else {
    vector_encoder_ = std::make_unique<nn::Linear>(tape, rng, env.obs_dim, s.embed);
    register_module("encoder", *vector_encoder_);
  }
  if (s.window > 0) {
    compress_ = std::make_unique<nn::Linear>(tape, rng, s.window * s.embed, s.hidden);
    register_module("compress", *compress_);
  } else {
    gru_ = std::make_unique<nn::GRUCell>(tape, rng, s.embed, s.hidden);
    if (s.update_bias != 0) {  // the gates are r, z, n (PyTorch's order): z is the second block
      std::vector<float> b = gru_->bias_hh.to_host<float>();  // (the policy is float32)
      for (int64_t i = s.hidden; i < 2 * s.hidden; ++i) b[size_t(i)] += float(s.update_bias);
      gru_->bias_hh.from_host(std::span<const float>(b));
    }
    register_module("gru", *gru_);
  }
  head_ = std::make_unique<nn::Linear>(tape, rng, s.hidden, env.num_actions);
  register_module("head", *head_);
  if (s.value_head) {
    value_ = std::make_unique<nn::Linear>(tape, rng, s.hidden, 1);
    register_module("value", *value_);
  }
}

int64_t Policy::parameters_for(const EnvSpec& env, const PolicyShape& s) {
  auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  int64_t n = env.vocab > 0 ? env.vocab * s.embed : linear(env.obs_dim, s.embed);  // encoder
  n += s.window > 0 ? linear(s.window * s.embed, s.hidden)                           // compress
                    : 3 * s.hidden * (s.embed + s.hidden) + 6 * s.hidden;            // gru
  n += linear(s.hidden, env.num_actions);                                              // head
  if (s.value_head) n += linear(s.hidden, 1);                                          // value
  return n;
}

Tensor Policy::encode(const Tensor& obs) const {
  if (token_encoder_) return (*token_encoder_)(obs);
  return tanh((*vector_encoder_)(obs));
}

Tensor Policy::compress(std::span<const Tensor> window) const { return tanh((*compress_)(concat(window, 1))); }

}  // namespace segtape::agent
