#include "step.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "device/rules.h"
#include "history/history.h"

namespace segtape::agent {

Step::Step(Context& c, HistoryRunner& history) : c_(c), history_(history), B_(c.config.batch), A_(c.env->spec().num_actions) {
  const EnvSpec& spec = c.env->spec();
  const auto B = size_t(B_);
  tokens.assign(B, 0);
  targets.assign(B, kNoTarget);
  actions.assign(B, 0);
  vectors.assign(B * size_t(std::max<int64_t>(spec.obs_dim, 1)), 0.0f);
  rewards.assign(B, 0.0f);
  done.assign(B, 0);
  rows.assign(B * size_t(A_), 0.0f);
  reset_mask_.assign(B * size_t(c.config.state_rows() * c.config.hidden), 0.0f);
  truncated_.assign(B, 0);
  final_tokens_.assign(B, 0);
  final_vectors_.assign(B * size_t(std::max<int64_t>(spec.obs_dim, 1)), 0.0f);
  final_values_.assign(B, 0.0f);
}

Tensor Step::observe() {
  c_.env->observe(tokens, vectors);
  return observation(tokens, vectors, B_);
}

Tensor Step::observe(Tape& t, replay::Inputs& in) {
  const EnvSpec& spec = c_.env->spec();
  if (spec.vocab > 0) {
    auto tok = in.take<int64_t>(size_t(B_), [&](std::span<int64_t> v) { c_.env->observe(v, vectors); });
    return t.from(tok, {B_});
  }
  auto vec = in.take<float>(vectors.size(), [&](std::span<float> v) { c_.env->observe(tokens, v); });
  return t.from(vec, {B_, spec.obs_dim});
}

std::span<const uint8_t> Step::done_flags(replay::Inputs& in) {
  return in.take<uint8_t>(size_t(B_), [&](std::span<uint8_t> v) { std::copy(done.begin(), done.end(), v.begin()); });
}

Tensor Step::observation(std::span<const int64_t> tok, std::span<const float> vec, int64_t n) const {
  const EnvSpec& spec = c_.env->spec();
  if (spec.vocab > 0) return c_.tape->from(tok.first(size_t(n)), {n});
  return c_.tape->from(vec.first(size_t(n * spec.obs_dim)), {n, spec.obs_dim});
}

Recurred Step::feature(const Tensor& obs, const Tensor& h, bool commit) const {
  return history_.recur(c_.policy->encode(obs), h, commit);
}

Recurred Step::feature(Tape& t, const Tensor& obs, const Tensor& h, replay::Inputs& in) {
  if (!c_.dropout) return feature(obs, h);
  // word_language_model's dropout: on the embeddings, between the layers, on
  // the last layer's output; the step's masks one input, drawn the first
  // time it runs and the record's when it runs again.
  const int64_t E = c_.config.embed, H = c_.config.hidden, L = c_.config.layers;
  const std::span<const float> m = in.take<float>(size_t(B_ * (E + L * H)), [&](std::span<float> v) { c_.dropout->mask(v); });
  const auto part = [&](int64_t at, int64_t w) { return t.from(m.subspan(size_t(B_ * at), size_t(B_ * w)), {B_, w}); };
  std::array<Tensor, 16> between;
  for (int64_t l = 0; l + 1 < L; ++l) between[size_t(l)] = part(E + l * H, H);
  Recurred r = history_.recur(mul(c_.policy->encode(obs), part(0, E)), h, true, std::span<const Tensor>(between.data(), size_t(L - 1)));
  r.feature = mul(r.feature, part(E + (L - 1) * H, H));
  return r;
}

int64_t Step::argmax_row(const float* p, int64_t n) {
  // The first index of the row's maximum. The maximum by 16 lanes (a
  // maximum is exact in any order: this vectorizes), then its first place;
  // NaNs are passed over, as a comparison skips them (a row of them: 0).
  constexpr int64_t kLanes = 16;
  std::array<float, kLanes> lane;
  lane.fill(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) lane[size_t(k)] = p[i + k] > lane[size_t(k)] ? p[i + k] : lane[size_t(k)];
  float top = -std::numeric_limits<float>::infinity();
  for (const float v : lane) top = v > top ? v : top;
  for (; i < n; ++i) top = p[i] > top ? p[i] : top;
  for (int64_t j = 0; j < n; ++j)
    if (p[j] == top) return j;
  return 0;
}

void Step::greedy(const Tensor& logits, std::span<int64_t> a) {
  const int64_t n = logits.dim(0);
  logits.to_host(std::span<float>(rows).first(size_t(n * A_)));
  for (int64_t b = 0; b < n; ++b) a[size_t(b)] = argmax_row(rows.data() + b * A_, A_);
}

void Step::sample(const Tensor& lp, std::span<int64_t> a) {
  lp.to_host(std::span<float>(rows));
  if (c_.counter_draws) {  // a twin env's: the device loop's draws (Context::counter_draws)
    const uint64_t seed = Context::act_seed(c_.config.seed, c_.rank());
    for (int64_t b = 0; b < B_; ++b) a[size_t(b)] = rules::sample_row(rows.data() + b * A_, A_, rules::draw(seed, b, c_.step));
    return;
  }
  for (int64_t b = 0; b < B_; ++b)  // (act_rng's uniform() is rules::uniform of its next word)
    a[size_t(b)] = rules::sample_row(rows.data() + b * A_, A_, c_.act_rng.next_u64());
}

void Step::act(std::span<const int64_t> a) { c_.env->step(a, rewards, done); }

void Step::note_rewards(double& return_sum, int64_t& episodes) {
  for (size_t b = 0; b < c_.episode_return.size(); ++b) {
    float& g = c_.episode_return[b];
    g += rewards[b];
    if (done[b]) return_sum += double(g), ++episodes, g = 0.0f;
  }
}

bool Step::bootstrap_truncated(const Tensor& state, double gamma) {
  std::fill(final_tokens_.begin(), final_tokens_.end(), 0);  // (rows an env leaves alone: a token and a vector the policy can run)
  std::fill(final_vectors_.begin(), final_vectors_.end(), 0.0f);
  if (!c_.env->truncations(truncated_, final_tokens_, final_vectors_)) return false;
  {
    NoGradGuard ng(*c_.tape);
    value(feature(observation(final_tokens_, final_vectors_, B_), state, false).feature).to_host(std::span<float>(final_values_));
  }
  for (size_t b = 0; b < truncated_.size(); ++b)
    if (truncated_[b]) rewards[b] += float(gamma) * final_values_[b];
  return true;
}

Tensor Step::reset(const Tensor& h, std::span<const uint8_t> done_flags) {
  if (!history_.carries_state()) return h;
  return reset_finished(h, done_flags, reset_mask_);
}

Tensor Step::reset(const Tensor& h, const Tensor& keep) { return history_.carries_state() ? mul(h, keep) : h; }

}  // namespace segtape::agent
