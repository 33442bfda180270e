// The device agent loop's per-element work (private to the agent library):
// each body is a plain struct of pointers and scalars whose operator()(i)
// does element i, run by a host loop (agent/device/functions.cpp, the CPU
// and the host-emulated device) or by one CUDA thread each
// (agent/device/functions.cu). Plain C++17 (nvcc compiles it too), no
// engine header. Pointers are the tape's: device memory on a GPU.
//
// The rollout buffers are [T, B] arrays; `cursor` (one int64 where the
// tensors live) is the row the step now writes, so every step of every
// rollout issues the same calls (a CUDA graph replays them).
#pragma once
#include <cstdint>

#include "rules.h"

namespace segtape::agent::device {

// Element b: stream b's observation, into obs[b] and the rollout's tokens
// row (none: tokens null, the look-ahead after the rollout's last step).
// Vector envs (Rules::kVector): its row of D reals, into obs [B, D] and
// the rollout's vectors [T, B, D].
template <class Rules>
struct Observe {
  Rules rules;
  const int64_t* state;  // [B, Rules::kWidth]
  const int64_t* cursor;
  void* obs;  // int64 [B], or float [B, D]
  void* buffer;  // int64 [T, B], or float [T, B, D]; null: none
  int64_t B, D;
  SEGTAPE_AGENT_HD void operator()(int64_t b) const {
    if constexpr (Rules::kVector) {
      float* o = static_cast<float*>(obs) + b * D;
      rules.observe(state + b * Rules::kWidth, b, o);
      if (buffer)
        for (int64_t d = 0; d < D; ++d) static_cast<float*>(buffer)[(*cursor * B + b) * D + d] = o[d];
    } else {
      const int64_t tok = rules.observe(state + b * Rules::kWidth, b);
      static_cast<int64_t*>(obs)[b] = tok;
      if (buffer) static_cast<int64_t*>(buffer)[*cursor * B + b] = tok;
    }
  }
};

// Element b: stream b's action applied; its reward and done flag into the
// rollout's rows, its state factor (1 - done) into keep[b], and its episode
// return into stats[b] = {the return so far, finished returns' sum, episodes}
// (the host Step::note_rewards's sums, one stream each).
template <class Rules>
struct EnvStep {
  Rules rules;
  int64_t* state;
  const int64_t* actions;  // [B]
  const int64_t* cursor;
  float* rewards;  // [T, B]
  float* done;     // [T, B]: 0 or 1
  float* keep;     // [B]
  double* stats;   // [B, 3]
  int64_t B;
  SEGTAPE_AGENT_HD void operator()(int64_t b) const {
    float r = 0;
    uint8_t d = 0;
    rules.step(state + b * Rules::kWidth, b, actions[b], r, d);
    const int64_t k = *cursor * B + b;
    rewards[k] = r, done[k] = d ? 1.0f : 0.0f, keep[b] = d ? 0.0f : 1.0f;
    double* s = stats + 3 * b;
    const float g = float(s[0]) + r;  // (in float, as the host's episode_return)
    if (d) s[1] += double(g), s[2] += 1, s[0] = 0;
    else s[0] = double(g);
  }
};

// Element b: an action for stream b from its row of log-probabilities lp
// [B, A], with draw counters[b] of its stream (then counted); the action
// into actions[b] and the rollout's row, its log-probability too.
struct Sample {
  uint64_t seed;
  const float* lp;
  const int64_t* cursor;
  int64_t* counters;  // [B]
  int64_t* actions;   // [B]
  int64_t* taken;     // [T, B]
  float* logp;        // [T, B]
  int64_t B, A;
  SEGTAPE_AGENT_HD void operator()(int64_t b) const {
    const int64_t a = rules::sample_row(lp + b * A, A, rules::draw(seed, b, counters[b]));
    counters[b] += 1;
    actions[b] = a;
    taken[*cursor * B + b] = a;
    logp[*cursor * B + b] = lp[b * A + a];
  }
};

// Element b: v[b] into the rollout's row (cursor), or into out[b] (no cursor).
struct Store {
  const float* v;
  const int64_t* cursor;  // nullptr: row 0
  float* out;
  int64_t B;
  SEGTAPE_AGENT_HD void operator()(int64_t b) const { out[(cursor ? *cursor : 0) * B + b] = v[b]; }
};

// Element i of a state [rows, H] (rows: R blocks of B streams): times keep
// of its stream, the episode reset h * (1 - done) of reset_finished.
struct Reset {
  float* h;
  const float* keep;  // [B]
  int64_t B, H;
  SEGTAPE_AGENT_HD void operator()(int64_t i) const { h[i] = h[i] * keep[(i / H) % B]; }
};

// Element i of a state [rows, H] (n = rows H elements): into its slot of
// the stored states [S, rows, H] where the row now (cursor) starts a
// window of W steps; nothing elsewhere.
struct StoreState {
  const float* h;
  const int64_t* cursor;
  float* starts;
  int64_t n, W;
  SEGTAPE_AGENT_HD void operator()(int64_t i) const {
    if (*cursor % W == 0) starts[(*cursor / W) * n + i] = h[i];
  }
};

// The one element: the cursor's next row, back to 0 after row T - 1.
struct Advance {
  int64_t* cursor;
  int64_t T;
  SEGTAPE_AGENT_HD void operator()(int64_t) const { *cursor = *cursor + 1 == T ? 0 : *cursor + 1; }
};

// Element b: GAE(lambda) of stream b over the rollout's T rows.
struct Gae {
  const float* rewards;
  const float* values;
  const float* done;
  const float* bootstrap;  // [B]
  float* advantages;
  float* returns;
  int64_t T, B;
  float gamma, lambda;
  SEGTAPE_AGENT_HD void operator()(int64_t b) const {
    rules::gae_stream(T, B, gamma, lambda, bootstrap[b], rewards + b, values + b, done + b, advantages + b, returns + b);
  }
};

// ---- PPO's update on the device (agent/algo/ppo.cpp): a minibatch's rows
// of the rollout's [T, B] buffers are rows t * B + mb[i], mb [Bm] its
// streams. A call's step is *row + off: row (one int64 where the tensors
// live) is the update window's first step, off the step's place in it, so
// that every window issues the same calls (a CUDA graph replays them).

// Element e of out [Bm, D]: row t of a rollout buffer [T, B, D] (D = 1: [T, B]) at the minibatch's streams.
template <class T>
struct GatherRows {
  const T* buffer;
  const int64_t* mb;
  const int64_t* row;
  T* out;
  int64_t off, B, D;
  SEGTAPE_AGENT_HD void operator()(int64_t e) const { out[e] = buffer[((*row + off) * B + mb[e / D]) * D + e % D]; }
};

// Element e of an episode-reset factor, 0 where a stream's episode ended,
// else 1. A step's (window 0): of its state [R Bm, H], after step t. A
// window's (window 1): keep [len, Bm] of a window from step t, entering
// each step i > 0 after step t + i - 1.
struct ResetFactors {
  const float* done;  // [T, B], 0 or 1
  const int64_t* mb;
  const int64_t* row;
  float* out;
  int64_t off, B, Bm, H, window;
  SEGTAPE_AGENT_HD void operator()(int64_t e) const {
    const int64_t t = *row + off;
    if (window) {
      const int64_t i = e / Bm;
      out[e] = i > 0 && done[(t + i - 1) * B + mb[e % Bm]] != 0 ? 0.0f : 1.0f;
    } else {
      out[e] = done[t * B + mb[(e / H) % Bm]] != 0 ? 0.0f : 1.0f;
    }
  }
};

// Element e of out [R Bm, H]: the minibatch's rows of the state stored for
// step *row (a multiple of W: window *row / W), starts [S, R B, H] (R
// blocks of B streams each).
struct GatherState {
  const float* starts;
  const int64_t* mb;
  const int64_t* row;
  float* out;
  int64_t W, R, B, Bm, H;
  SEGTAPE_AGENT_HD void operator()(int64_t e) const {
    const int64_t r_ = e / H, r = r_ / Bm, w = *row / W;
    out[e] = starts[((w * R + r) * B + mb[r_ % Bm]) * H + e % H];
  }
};

// Element e of out [n, Bm]: the minibatch's advantages of the rollout's
// [T, B], step by step, in its streams' order (AdvantageStats' one thread
// then reads them in order, not scattered).
struct GatherAdvantages {
  const float* adv;
  const int64_t* mb;
  float* out;
  int64_t B, Bm;
  SEGTAPE_AGENT_HD void operator()(int64_t e) const { out[e] = adv[(e / Bm) * B + mb[e % Bm]]; }
};

// The one element: the minibatch's advantages' normalisation over n steps
// (rules::advantage_stats of GatherAdvantages' [n, Bm], in the host's order
// of sums: one chain, so one thread) into norm[0..3], and the iteration's
// clip range into norm[4].
struct AdvantageStats {
  const float* adv;  // [n, Bm]
  double* norm;      // [5]
  int64_t n, Bm;
  double clip_range;
  SEGTAPE_AGENT_HD void operator()(int64_t) const {
    rules::advantage_stats(n, Bm, Bm, nullptr, adv, norm);
    norm[4] = clip_range;
  }
};

// Element r of rows [len Bm] (step *row + off + r / Bm, stream mb[r %
// Bm]): the row's loss terms (rules::ppo_row) from its log-probabilities lp
// [rows, A] and value v [rows] now and the rollout's buffers.
struct PpoTerms {
  rules::PpoConstants k;
  const float* lp;
  const float* v;
  const int64_t* mb;
  const int64_t* row;
  const double* norm;
  const float* adv;
  const int64_t* actions;
  const float* logp;
  const float* returns;
  const float* values;
  float* weights;  // [rows, A]
  float* target;   // [rows]
  double* parts;   // [rows, 4 + A]
  int64_t off, B, Bm, A;
  SEGTAPE_AGENT_HD void operator()(int64_t r) const {
    const int64_t k_ = (*row + off + r / Bm) * B + mb[r % Bm];
    rules::ppo_row(k, norm, adv[k_], actions[k_], logp[k_], returns[k_], values[k_], lp + r * A, v[r], A, weights + r * A, target + r,
                   parts + r * (4 + A));
  }
};

// Element s: step *row + off + s's figures [3] (the reported loss, the KL
// estimate, the clip fraction) from its Bm rows' parts, added in the rows' order.
struct PpoStepSums {
  const double* parts;
  const int64_t* row;
  double* stats;  // [T, 3]
  int64_t off, Bm, A;
  SEGTAPE_AGENT_HD void operator()(int64_t s) const {
    double reported = 0, kl = 0, clipped = 0;
    for (int64_t i = 0; i < Bm; ++i) rules::ppo_add_row(parts + (s * Bm + i) * (4 + A), A, reported, kl, clipped);
    double* out = stats + (*row + off + s) * 3;
    out[0] = reported, out[1] = kl, out[2] = clipped;
  }
};

// The one element: steps [0, n)'s figures added to the iteration's totals [3], step by step.
struct PpoTotals {
  const double* stats;
  double* totals;
  int64_t n;
  SEGTAPE_AGENT_HD void operator()(int64_t) const {
    for (int64_t t = 0; t < n; ++t) totals[0] += stats[t * 3], totals[1] += stats[t * 3 + 1], totals[2] += stats[t * 3 + 2];
  }
};

// An update's squared gradient norm (sq, float64 [1]) kept at into[at].
struct KeepSquare {
  const double* sq;
  double* into;
  int64_t at;
  SEGTAPE_AGENT_HD void operator()(int64_t) const { into[at] = *sq; }
};

// nvcc's launch of n elements of a body on a stream (functions.cu).
template <class Body>
void launch(const Body& body, int64_t n, void* stream);

}  // namespace segtape::agent::device
