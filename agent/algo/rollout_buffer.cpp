#include "rollout_buffer.h"

#include "../device/rules.h"

namespace segtape::agent {

RolloutBuffer::RolloutBuffer(const TrainConfig& c, const EnvSpec& spec)
    : T(c.rollout), B(c.batch), H(c.hidden), obs_dim(spec.vocab > 0 ? 0 : spec.obs_dim), R(c.state_rows()), W(c.history.stored_every()) {
  S = (T + W - 1) / W;
  const auto TB = size_t(T * B);
  if (spec.vocab > 0) tokens.assign(TB, 0);
  else vectors.assign(TB * size_t(obs_dim), 0.0f);
  actions.assign(TB, 0);
  for (auto* v : {&logp, &values, &rewards, &advantages, &returns}) v->assign(TB, 0.0f);
  done.assign(TB, 0);
  start_state.assign(size_t(S) * size_t(R) * size_t(B) * size_t(H), 0.0f);
  bootstrap.assign(size_t(B), 0.0f);
}

size_t RolloutBuffer::bytes(const TrainConfig& c, const EnvSpec& spec) {
  // per step and stream: action and token (int64), 5 floats, done, the observation vector
  const size_t T = size_t(c.rollout), B = size_t(c.batch), H = size_t(c.hidden), W = size_t(c.history.stored_every()), S = (T + W - 1) / W;
  return T * B * (2 * 8 + 5 * 4 + 1 + size_t(spec.obs_dim) * 4) + S * size_t(c.state_rows()) * B * H * 4;
}

void RolloutBuffer::compute_advantages(int64_t n, double gamma, double lambda) {
  for (size_t b = 0; b < size_t(B); ++b)  // (the device loop's GAE is the same function, agent/device/rules.h)
    rules::gae_stream(n, B, float(gamma), float(lambda), bootstrap[b], rewards.data() + b, values.data() + b, done.data() + b,
                      advantages.data() + b, returns.data() + b);
}

}  // namespace segtape::agent
