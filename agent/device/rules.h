// The device agent loop's rules, written once for the host and the device
// (private to the agent library): a counter-based generator, the device
// envs' per-stream steps, the sampler's per-row draw, and GAE's per-stream
// pass. The host forms (agent/device/functions.cpp), the CUDA kernels
// (agent/device/functions.cu), the host twins of the device envs
// (device_env.cpp) and PPO's host rollout buffer (algo/rollout_buffer.cpp)
// all call these, so that a device loop and its host twin compute the same
// values by the same expressions.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SEGTAPE_AGENT_HD __host__ __device__ inline
#else
#define SEGTAPE_AGENT_HD inline
#endif

namespace segtape::agent::rules {

// ---- a counter-based generator: draw k of stream b under a seed is a pure
// function of (seed, b, k), so B streams draw in parallel, in any order, and
// the host twin draws the same numbers. SplitMix64's finaliser (Steele,
// Lea and Flood 2014) applied to the seed, the stream and the counter in
// turn; a hash for simulation, not for cryptography.
SEGTAPE_AGENT_HD uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
SEGTAPE_AGENT_HD uint64_t draw(uint64_t seed, int64_t stream, int64_t k) {
  return mix64(mix64(mix64(seed) ^ uint64_t(stream)) ^ uint64_t(k));
}
// A uniform double in [0, 1) from the draw's top 53 bits.
SEGTAPE_AGENT_HD double uniform(uint64_t bits) { return double(bits >> 11) * 0x1.0p-53; }
SEGTAPE_AGENT_HD int64_t below(uint64_t bits, int64_t n) { return int64_t(bits % uint64_t(n)); }

// ---- device envs. Each stream's state is a row of int64 of a fixed width;
// observe() gives the stream's token now (or, kVector, writes its vector),
// step() applies its action and
// gives its reward and whether its episode ended (it restarts by itself).
// score counts: the row's last two integers (numerator, denominator).

// recall: the token at step t is draw(seed, b, t) mod V; the target at t
// (t >= lag, and in sparse form only where t is a multiple of lag) is the
// token of t - lag; the reward is 1 for the target (the reward PPO gives a
// supervised env's target, agent/algo/ppo.cpp), and the episode never ends.
// Row: t, numerator, denominator.
struct Recall {
  static constexpr int kWidth = 3;
  static constexpr bool kVector = false;
  uint64_t seed;
  int64_t lag, vocab;
  bool sparse;
  SEGTAPE_AGENT_HD bool shown(int64_t t) const { return !sparse || t % lag == 0; }
  SEGTAPE_AGENT_HD bool asked(int64_t t) const { return t >= lag && shown(t); }
  SEGTAPE_AGENT_HD int64_t token(int64_t b, int64_t t) const { return below(draw(seed, b, t), vocab); }
  SEGTAPE_AGENT_HD void start(int64_t* /*row*/, int64_t /*b*/) const {}
  SEGTAPE_AGENT_HD bool valid(const int64_t* row) const { return row[0] >= 0 && row[1] >= 0 && row[1] <= row[2]; }
  SEGTAPE_AGENT_HD int64_t observe(const int64_t* row, int64_t b) const { return shown(row[0]) ? token(b, row[0]) : vocab; }
  SEGTAPE_AGENT_HD int64_t target(const int64_t* row, int64_t b) const { return asked(row[0]) ? token(b, row[0] - lag) : -100; }
  SEGTAPE_AGENT_HD void step(int64_t* row, int64_t b, int64_t a, float& reward, uint8_t& done) const {
    const int64_t y = target(row, b);
    reward = y >= 0 && a == y ? 1.0f : 0.0f;
    if (y >= 0) row[1] += a == y, row[2] += 1;
    row[0] += 1;
    done = 0;
  }
};

// tmaze: a cue (token 0 or 1) at the corridor's start, N - 1 corridor steps
// (token 2), the junction (token 3), where the action ends the episode:
// +1 for the cued arm, -1 else. Episode e's cue is draw(seed, b, e) mod 2.
// Row: cue, position, episode, numerator, denominator.
struct TMaze {
  static constexpr int kWidth = 5;
  static constexpr bool kVector = false;
  uint64_t seed;
  int64_t corridor;
  SEGTAPE_AGENT_HD void start(int64_t* row, int64_t b) const {
    row[0] = below(draw(seed, b, row[2]), 2);
    row[1] = 0;
  }
  SEGTAPE_AGENT_HD bool valid(const int64_t* row) const {
    return (row[0] == 0 || row[0] == 1) && row[1] >= 0 && row[1] <= corridor && row[2] >= 0 && row[3] >= 0 && row[3] <= row[4];
  }
  SEGTAPE_AGENT_HD int64_t observe(const int64_t* row, int64_t /*b*/) const {
    return row[1] == 0 ? row[0] : row[1] < corridor ? 2 : 3;
  }
  SEGTAPE_AGENT_HD int64_t target(const int64_t*, int64_t) const { return -100; }
  SEGTAPE_AGENT_HD void step(int64_t* row, int64_t b, int64_t a, float& reward, uint8_t& done) const {
    reward = 0.0f, done = 0;
    if (row[1] < corridor) {
      row[1] += 1;
      return;
    }
    const bool ok = a == row[0];
    reward = ok ? 1.0f : -1.0f, done = 1;
    row[3] += ok, row[4] += 1, row[2] += 1;
    start(row, b);
  }
};

// dialogue: each turn's message as its row of a fixed table [messages, dim]
// plus a small jitter (the jitter id's draws, one a dimension), as
// `dialogue`'s frozen embeddings; turn 0 names a city, later turns are a
// new city (15 %), a request (35 %) or small talk; the target is the tool
// for a request (1 + r cities + the last city named), else 0 (reply); the
// reward is 1 for the target; an episode is `turns` turns. Each stream
// draws from its own counter (the row's fifth integer).
// Row: turn, city, message, jitter id, draws, numerator, denominator.
struct Dialogue {
  static constexpr int kWidth = 7;
  static constexpr bool kVector = true;
  static constexpr int64_t kFillers = 6, kRequests = 2;
  uint64_t seed;
  int64_t turns, cities, dim;
  const float* table;  // [messages(), dim], where the rows live
  SEGTAPE_AGENT_HD int64_t messages() const { return cities + kFillers + kRequests; }
  SEGTAPE_AGENT_HD uint64_t next(int64_t* row, int64_t b) const { return draw(seed, b, row[4]++); }
  SEGTAPE_AGENT_HD void set_msg(int64_t* row, int64_t b, int64_t m) const {
    row[2] = m;
    row[3] = int64_t(next(row, b) >> 1);
  }
  SEGTAPE_AGENT_HD void set_city(int64_t* row, int64_t b, int64_t c) const {
    row[1] = c;
    set_msg(row, b, c);
  }
  SEGTAPE_AGENT_HD void start(int64_t* row, int64_t b) const {
    row[0] = 0;
    set_city(row, b, below(next(row, b), cities));
  }
  SEGTAPE_AGENT_HD bool valid(const int64_t* row) const {
    return row[0] >= 0 && row[0] < turns && row[1] >= 0 && row[1] < cities && row[2] >= 0 && row[2] < messages() && row[4] >= 0 &&
           row[5] >= 0 && row[5] <= row[6];
  }
  SEGTAPE_AGENT_HD void observe(const int64_t* row, int64_t /*b*/, float* out) const {
    const float* e = table + row[2] * dim;
    for (int64_t d = 0; d < dim; ++d)
      out[d] = e[d] + float(0.05 * (uniform(draw(uint64_t(row[3]), 0, d)) - 0.5) / ::sqrt(double(dim)));
  }
  SEGTAPE_AGENT_HD int64_t target(const int64_t* row, int64_t /*b*/) const {
    const int64_t r = row[2] - (cities + kFillers);
    return r >= 0 ? 1 + r * cities + row[1] : 0;
  }
  SEGTAPE_AGENT_HD void step(int64_t* row, int64_t b, int64_t a, float& reward, uint8_t& done) const {
    const int64_t y = target(row, b);
    if (y != 0) row[5] += a == y, row[6] += 1;  // (the measure is tool choice on requests)
    reward = a == y ? 1.0f : 0.0f;
    done = row[0] + 1 >= turns;
    if (done) {
      start(row, b);
      return;
    }
    row[0] += 1;
    const int64_t u = below(next(row, b), 100);
    if (u < 15) set_city(row, b, below(next(row, b), cities));
    else if (u < 50) set_msg(row, b, cities + kFillers + below(next(row, b), kRequests));
    else set_msg(row, b, cities + below(next(row, b), kFillers));
  }
};

// ---- the sampler: a ~ softmax(lp) of a row of A log-probabilities, by the
// host Step::sample's rule (the first k whose running sum of exp(lp) in
// double passes u; the last where rounding leaves none), u = uniform(bits).
SEGTAPE_AGENT_HD int64_t sample_row(const float* lp, int64_t A, uint64_t bits) {
  const double u = uniform(bits);
  double acc = 0;
  for (int64_t k = 0; k < A; ++k) {
    acc += ::exp(double(lp[k]));
    if (u < acc) return k;
  }
  return A - 1;
}

// ---- GAE(lambda) of one stream over n steps (rows t * stride): a done
// step does not bootstrap from the next (the next episode's); returns =
// advantages + values. In float, as PPO's host buffer has always computed it.
template <class Done>
SEGTAPE_AGENT_HD void gae_stream(int64_t n, int64_t stride, float gamma, float lambda, float bootstrap, const float* rewards,
                                 const float* values, const Done* done, float* advantages, float* returns) {
  float gae = 0, next_value = bootstrap;
  for (int64_t t = n - 1; t >= 0; --t) {
    const int64_t k = t * stride;
    const float go_on = done[k] ? 0.0f : 1.0f;
    const float delta = rewards[k] + gamma * next_value * go_on - values[k];
    gae = delta + gamma * lambda * go_on * gae;
    advantages[k] = gae;
    returns[k] = gae + values[k];
    next_value = values[k];
  }
}

// ---- PPO's update terms (agent/algo/ppo.cpp), written once for the host
// update and the device's. A minibatch's rows of the rollout's [T, B]
// buffers are rows t * B + mb[i], mb its Bm streams.

// The minibatch's advantages over its n steps: norm = {mean, standard
// deviation (1 where not normalised), 1 / count, normalised (1 or 0)}. In
// double, the steps in order and each step's streams in the minibatch's
// order; a single term is left as it is, as SB3 does (normalised, it would
// be 0). mb null: adv holds the minibatch's advantages already, [n, Bm]
// (B = Bm), in that order.
SEGTAPE_AGENT_HD void advantage_stats(int64_t n, int64_t B, int64_t Bm, const int64_t* mb, const float* adv, double* norm) {
  double mean = 0, sq = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < Bm; ++i) mean += adv[t * B + (mb ? mb[i] : i)];
  const double count = double(n) * double(Bm);
  mean /= count;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < Bm; ++i) {
      const double d = adv[t * B + (mb ? mb[i] : i)] - mean;
      sq += d * d;
    }
  const bool normalise = count > 1;
  norm[0] = mean, norm[1] = normalise ? ::sqrt(sq / (count - 1)) : 1.0, norm[2] = 1.0 / count, norm[3] = normalise ? 1.0 : 0.0;
}

// The loss's settings: --value-clip (0: off), the entropy bonus and the
// value loss's coefficient (the clip range, which a schedule changes, is norm[4]).
struct PpoConstants {
  double value_clip, entropy, value_coef;
};

// One row's terms (norm: advantage_stats' four, then the iteration's clip
// range): the clipped surrogate's gradient weight for the row's
// action into weights [A] (0 for the others, and where the clip bounds the
// objective), the value loss's target into *target, and the row's shares of
// the reported figures into parts [4 + A], in the order ppo_add_row adds
// them: the surrogate's min(r A, clip(r) A) / count (subtracted), the KL
// estimate's term, the clip fraction's (1 / count or 0), the value loss's,
// then each action's entropy term. lp: the row's log-probabilities now,
// value its value now; adv, action, logp_old, ret and value_old the
// rollout's. The log ratio is bounded at 80, so that exp() stays finite (a
// ratio of e^80 is clipped either way). The value loss is (v - R)^2, or
// with a value clip the larger of it and the clipped value's; where the
// clipped one is larger, v is outside v_old +- value_clip and that term is
// constant in v: its target is then v itself (the loss's gradient 0).
SEGTAPE_AGENT_HD void ppo_row(const PpoConstants& k, const double* norm, float adv_raw, int64_t action, float logp_old, float ret,
                              float value_old, const float* lp, float value, int64_t A, float* weights, float* target, double* parts) {
  const double inv_n = norm[2], eps = norm[4];
  const double adv = norm[3] != 0 ? (adv_raw - norm[0]) / (norm[1] + 1e-8) : adv_raw;
  const double d0 = double(lp[action]) - double(logp_old);
  const double d = 80.0 < d0 ? 80.0 : d0;
  const double ratio = ::exp(d);
  const double clipped = ratio < 1.0 - eps ? 1.0 - eps : 1.0 + eps < ratio ? 1.0 + eps : ratio;
  const double ra = ratio * adv, ca = clipped * adv;
  parts[0] = (ca < ra ? ca : ra) * inv_n;
  parts[1] = (::expm1(d) - d) * inv_n;
  parts[2] = clipped != ratio ? inv_n : 0.0;
  for (int64_t j = 0; j < A; ++j) weights[j] = 0.0f;
  // The clip bounds the objective where it is the smaller of the two: no gradient there.
  const bool bounded = (adv > 0 && ratio > 1.0 + eps) || (adv < 0 && ratio < 1.0 - eps);
  if (!bounded) weights[action] = float(-adv * ratio * inv_n);
  *target = ret;
  const double dv = double(value) - double(ret);
  double value_loss = dv * dv;
  if (const double vc = k.value_clip; vc > 0) {
    const double old = value_old, step = double(value) - old;
    const double moved = old + (step < -vc ? -vc : vc < step ? vc : step) - double(ret);
    if (moved * moved > value_loss) value_loss = moved * moved, *target = value;
  }
  parts[3] = 0.5 * k.value_coef * value_loss * inv_n;
  for (int64_t j = 0; j < A; ++j) {
    const double l = lp[j];
    parts[4 + j] = k.entropy * ::exp(l) * l * inv_n;  // (the entropy bonus, negated)
  }
}

// A row's parts (ppo_row) added to a step's figures: the reported loss, the KL estimate, the clip fraction.
SEGTAPE_AGENT_HD void ppo_add_row(const double* parts, int64_t A, double& reported, double& kl, double& clipped) {
  reported -= parts[0];
  kl += parts[1];
  clipped += parts[2];
  reported += parts[3];
  for (int64_t j = 0; j < A; ++j) reported += parts[4 + j];
}

}  // namespace segtape::agent::rules
