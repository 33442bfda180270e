// Recurrent PPO (`segtape train --algo ppo`, docs/agent.md "Recurrent PPO").
//
// One iteration (Trainer::run_segment) = a rollout of T steps over the B
// streams, then `epochs` passes over `minibatches` minibatches of whole
// streams, each an optimizer step. The rollout runs without a gradient in
// segments of K steps and stores the state every W steps (ppo_window); a
// minibatch's update replays each W-step window from its stored state (as
// Stable-Baselines3's RecurrentPPO starts its sequences from stored states),
// one K-step segment in the arena at a time, the gradients accumulating until
// the step. Episode
// ends inside a segment reset the stream's state by masking (reset_finished),
// in the rollout and in the replay alike.
//
// The clipped surrogate's gradient is -A * ratio * grad log pi(a) where the
// ratio is inside [1 - eps, 1 + eps] or on the side that the clip does not
// bound, and 0 elsewhere. The forward pass gives the ratio before the
// backward, so the loss recorded is sum(log pi * W) with that weight W held
// constant: exactly the surrogate's gradient, without exp() of a possibly
// large -log pi_old. The loss reported is the surrogate itself, computed on
// the host from the same values.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ppo.h"
#include "segtape/ops.h"

namespace segtape::agent {

std::unique_ptr<Trainer::PpoBuffers> Trainer::make_ppo_buffers() const {
  const EnvSpec& spec = env_->spec();
  auto p = std::make_unique<PpoBuffers>();
  p->T = config_.rollout, p->B = config_.batch, p->H = config_.hidden, p->K = config_.history.k;
  p->W = ppo_window(config_);
  p->S = (p->T + p->W - 1) / p->W;
  p->obs_dim = spec.vocab > 0 ? 0 : spec.obs_dim;
  p->A = spec.num_actions;
  const auto TB = size_t(p->T * p->B), Bm = size_t(p->B / config_.minibatches), H = size_t(p->H);
  if (spec.vocab > 0) p->tokens.assign(TB, 0), p->mb_tokens.assign(Bm, 0);
  else p->vectors.assign(TB * size_t(p->obs_dim), 0.0f), p->mb_vectors.assign(Bm * size_t(p->obs_dim), 0.0f);
  p->actions.assign(TB, 0);
  for (auto* v : {&p->logp, &p->values, &p->rewards, &p->advantages, &p->returns}) v->assign(TB, 0.0f);
  p->done.assign(TB, 0);
  p->start_state.assign(size_t(p->S) * size_t(p->B) * H, 0.0f);
  p->bootstrap.assign(size_t(p->B), 0.0f);
  p->streams.resize(size_t(p->B));
  p->mb_state.assign(Bm * H, 0.0f);
  p->mb_returns.assign(Bm, 0.0f);
  p->mb_weights.assign(Bm * size_t(p->A), 0.0f);
  p->mb_rows.assign(Bm * size_t(p->A), 0.0f);
  p->mb_values.assign(Bm, 0.0f);
  p->mb_done.assign(Bm, 0);
  p->step_stats.assign(size_t(p->T) * 3, 0.0);
  p->sequence = recurrence_as_sequence(*tape_, config_, int64_t(Bm));
  if (p->sequence) {
    const auto W = size_t(p->W);
    p->seq_encoded.resize(W);
    p->seq_rows.assign(W * Bm * size_t(p->A), 0.0f), p->seq_weights.assign(W * Bm * size_t(p->A), 0.0f);
    p->seq_values.assign(W * Bm, 0.0f), p->seq_returns.assign(W * Bm, 0.0f), p->seq_keep.assign(W * Bm, 1.0f);
  }
  if (config_.history.kind == History::Kind::Exact) {  // the window's boundary states live in the persistent pool
    p->mb_h0 = tape_->persistent({int64_t(Bm), p->H});
    p->driver = std::make_unique<replay::Driver>(*tape_, p->mb_h0, replay::Options{.horizon = p->W, .k = p->K});
  }
  return p;
}

bool Trainer::ppo_sequence() const { return ppo_ && ppo_->sequence; }

SegmentResult Trainer::ppo_iteration(int64_t n) {
  SegmentResult r;
  if (n <= 0) return r;
  // The learning rate of this iteration's updates: a function of the step, so a resumed run has it too.
  if (config_.lr_schedule == "linear") optim_->options().lr = config_.lr * (1.0 - double(step_) / double(config_.steps));
  ppo_rollout(n, r);
  ppo_advantages(n);
  PpoBuffers& p = *ppo_;
  const auto Bm = size_t(p.B / config_.minibatches);
  // The order starts afresh each iteration, so that it is a function of act_rng_ alone (which checkpoints keep).
  std::iota(p.streams.begin(), p.streams.end(), int64_t(0));
  for (int64_t e = 0; e < config_.epochs; ++e) {
    for (size_t i = p.streams.size(); i > 1; --i)  // Fisher-Yates, from act_rng_ (checkpointed)
      std::swap(p.streams[i - 1], p.streams[size_t(act_rng_.next_u64() % i)]);
    for (int64_t m = 0; m < config_.minibatches; ++m) {
      ppo_minibatch(n, std::span<const int64_t>(p.streams).subspan(size_t(m) * Bm, Bm), r);
      ++r.loss_steps;
      update();
    }
  }
  r.approx_kl /= double(r.loss_steps);
  r.clip_fraction /= double(r.loss_steps);
  r.steps = n;
  return r;
}

// n steps over the B streams, sampled actions, no gradient; the state goes
// from segment to segment and into the next iteration in its persistent home.
void Trainer::ppo_rollout(int64_t n, SegmentResult& r) {
  PpoBuffers& p = *ppo_;
  const EnvSpec& spec = env_->spec();
  const auto B = size_t(p.B), A = size_t(p.A), H = size_t(p.H);
  for (int64_t t0 = 0; t0 < n; r.segment_peak = std::max(r.segment_peak, tape_->stats().last_segment_peak)) {
    // Segments of at most K steps, cut where a window starts too (its state is stored there).
    const int64_t end = std::min({n, (t0 / p.K + 1) * p.K, (t0 / p.W + 1) * p.W});
    Segment seg = tape_->segment();
    NoGradGuard ng(*tape_);
    if (t0 % p.W == 0) h_.to_host(std::span<float>(p.start_state).subspan(size_t(t0 / p.W) * B * H, B * H));
    for (int64_t t = t0; t < end; ++t, ++step_, tape_->next_step()) {
      const size_t row = size_t(t) * B;
      Tensor x = observe_tensor();
      if (spec.vocab > 0) std::copy(tokens_.begin(), tokens_.end(), p.tokens.begin() + ptrdiff_t(row));
      else std::copy(vectors_.begin(), vectors_.end(), p.vectors.begin() + ptrdiff_t(row * size_t(p.obs_dim)));
      if (spec.supervised) env_->targets(targets_);
      Tensor f = feature(policy_->encode(x));
      Tensor lp = log_softmax(policy_->logits(f));  // [B, A]
      policy_->value(f).to_host(std::span<float>(p.values).subspan(row, B));
      sample_actions(lp, actions_);  // leaves lp in host_rows_
      env_->step(actions_, rewards_, done_);
      // A supervised env as a task to act in: reward 1 for its target class.
      if (spec.supervised)
        for (size_t b = 0; b < B; ++b) rewards_[b] += targets_[b] != kNoTarget && actions_[b] == targets_[b] ? 1.0f : 0.0f;
      reset_finished_streams();
      note_rewards(r);
      for (size_t b = 0; b < B; ++b) {
        p.actions[row + b] = actions_[b];
        p.logp[row + b] = host_rows_[b * A + size_t(actions_[b])];
        p.rewards[row + b] = rewards_[b];
        p.done[row + b] = done_[b];
      }
    }
    copy_into(h_home_, h_);  // the state lives in its home between segments and iterations
    h_ = h_home_;
    t0 = end;
  }
  Segment seg = tape_->segment();
  bootstrap_value(h_, std::span<float>(p.bootstrap));
}

// GAE(lambda) (Schulman et al. 2016) over the rollout; a done step does not
// bootstrap from the next one (the next episode's). returns = advantages + values.
void Trainer::ppo_advantages(int64_t n) {
  PpoBuffers& p = *ppo_;
  const auto B = size_t(p.B);
  const auto gamma = float(config_.gamma), lambda = float(config_.gae_lambda);
  for (size_t b = 0; b < B; ++b) {
    float gae = 0, next_value = p.bootstrap[b];
    for (int64_t t = n - 1; t >= 0; --t) {
      const size_t k = size_t(t) * B + b;
      const float go_on = p.done[k] ? 0.0f : 1.0f;
      const float delta = p.rewards[k] + gamma * next_value * go_on - p.values[k];
      gae = delta + gamma * lambda * go_on * gae;
      p.advantages[k] = gae;
      p.returns[k] = gae + p.values[k];
      next_value = p.values[k];
    }
  }
}

// One minibatch of whole streams over the n rollout steps, window by window
// from the states stored at rollout time; the gradients accumulate. Adds to
// r the minibatch's PPO loss (surrogate + value + entropy terms, means over
// its steps and streams), KL estimate and clip fraction.
void Trainer::ppo_minibatch(int64_t n, std::span<const int64_t> streams, SegmentResult& r) {
  PpoBuffers& p = *ppo_;
  const EnvSpec& spec = env_->spec();
  const auto B = size_t(p.B), A = size_t(p.A), H = size_t(p.H), Bm = streams.size();
  const auto mb = int64_t(Bm);
  // The minibatch's advantages are normalised by their mean and standard deviation.
  double mean = 0, sq = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b : streams) mean += p.advantages[size_t(t) * B + size_t(b)];
  const double count = double(n) * double(Bm);
  mean /= count;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b : streams) sq += std::pow(p.advantages[size_t(t) * B + size_t(b)] - mean, 2);
  // (A single term is left as it is, as SB3 does: normalised, it would be 0.)
  const bool normalise = count > 1;
  const double std_dev = normalise ? std::sqrt(sq / (count - 1)) : 1.0;
  const double inv_n = 1.0 / count, eps = config_.clip_range;

  // Step t's observation rows of the minibatch, on the tape.
  const auto input = [&](int64_t t) {
    const size_t row = size_t(t) * B;
    if (spec.vocab > 0) {
      for (size_t i = 0; i < Bm; ++i) p.mb_tokens[i] = p.tokens[row + size_t(streams[i])];
      return tape_->from(std::span<const int64_t>(p.mb_tokens), {mb});
    }
    const auto D = size_t(p.obs_dim);
    for (size_t i = 0; i < Bm; ++i)
      std::copy_n(p.vectors.begin() + ptrdiff_t((row + size_t(streams[i])) * D), D, p.mb_vectors.begin() + ptrdiff_t(i * D));
    return tape_->from(std::span<const float>(p.mb_vectors), {mb, p.obs_dim});
  };
  // Step t's host terms from the host copies of its log-probabilities (rows
  // [Bm, A]) and values [Bm]: the surrogate's weights into weights [Bm, A]
  // and the returns into returns [Bm], constants of the loss. Its host
  // figures go to slot t of step_stats, overwritten when a replay runs the
  // step again (the same values), so each step counts once.
  const auto host_terms = [&](int64_t t, const float* rows, const float* values, float* weights, float* returns) {
    const size_t row = size_t(t) * B;
    std::fill_n(weights, Bm * A, 0.0f);
    double reported = 0, kl = 0, clipped_terms = 0;
    for (size_t i = 0; i < Bm; ++i) {
      const size_t k = row + size_t(streams[i]);
      const double adv = normalise ? (p.advantages[k] - mean) / (std_dev + 1e-8) : p.advantages[k];
      const auto a = size_t(p.actions[k]);
      // log ratio, bounded so that exp() stays finite (a ratio of e^80 is clipped either way)
      const double d = std::min(double(rows[i * A + a]) - double(p.logp[k]), 80.0);
      const double ratio = std::exp(d);
      const double clipped = std::clamp(ratio, 1.0 - eps, 1.0 + eps);
      reported -= std::min(ratio * adv, clipped * adv) * inv_n;
      kl += (std::expm1(d) - d) * inv_n;
      clipped_terms += clipped != ratio ? inv_n : 0.0;
      // The clip bounds the objective where it is the smaller of the two: no gradient there.
      const bool bounded = (adv > 0 && ratio > 1.0 + eps) || (adv < 0 && ratio < 1.0 - eps);
      if (!bounded) weights[i * A + a] = float(-adv * ratio * inv_n);
      returns[i] = p.returns[k];
      const double dv = double(values[i]) - double(p.returns[k]);
      reported += 0.5 * config_.value_coef * dv * dv * inv_n;
      for (size_t j = 0; j < A; ++j) {
        const double l = rows[i * A + j];
        reported += config_.entropy * std::exp(l) * l * inv_n;  // -entropy bonus
      }
    }
    p.step_stats[size_t(t) * 3 + 0] = reported, p.step_stats[size_t(t) * 3 + 1] = kl, p.step_stats[size_t(t) * 3 + 2] = clipped_terms;
  };
  // The loss of rows (steps x streams) of log-probabilities lp [rows, A] and
  // values v [rows, 1], with host_terms' weights and returns of those rows.
  const auto loss_of = [&](const Tensor& lp, const Tensor& v, std::span<const float> weights, std::span<const float> returns) {
    const int64_t rows = lp.dim(0);
    Tensor pg = sum(mul(lp, tape_->from(weights, {rows, p.A})));
    Tensor vl = scale(mse_loss(v, tape_->from(returns, {rows, 1}), Reduction::Sum), 0.5 * config_.value_coef * inv_n);
    Tensor neg_entropy = scale(sum(mul(exp(lp), lp)), config_.entropy * inv_n);
    return add(add(pg, vl), neg_entropy);
  };
  // Rollout step t of the minibatch from the state h: the state after it
  // (reset where the stream's episode ended) and, when `with_loss`, its loss.
  const auto step = [&](int64_t t, const Tensor& h, bool with_loss) {
    const size_t row = size_t(t) * B;
    Tensor f = policy_->recur(policy_->encode(input(t)), h);
    for (size_t i = 0; i < Bm; ++i) p.mb_done[i] = p.done[row + size_t(streams[i])];
    if (!with_loss) return replay::StepResult{reset_finished(f, p.mb_done, reset_mask_), Tensor{}};
    Tensor lp = log_softmax(policy_->logits(f));  // [Bm, A]
    Tensor v = policy_->value(f);                 // [Bm, 1]
    lp.to_host(std::span<float>(p.mb_rows));
    v.to_host(std::span<float>(p.mb_values));
    host_terms(t, p.mb_rows.data(), p.mb_values.data(), p.mb_weights.data(), p.mb_returns.data());
    Tensor loss = loss_of(lp, v, p.mb_weights, p.mb_returns);
    return replay::StepResult{reset_finished(f, p.mb_done, reset_mask_), loss};
  };

  for (int64_t w = 0; w * p.W < n; ++w) {
    const int64_t t0 = w * p.W, len = std::min(n, t0 + p.W) - t0;
    for (size_t i = 0; i < Bm; ++i)
      std::copy_n(p.start_state.begin() + ptrdiff_t((size_t(w) * B + size_t(streams[i])) * H), H,
                  p.mb_state.begin() + ptrdiff_t(i * H));
    if (p.driver) {
      // exact:K/T: the window's gradient by replay (segtape/replay.h), K steps in the arena at a time.
      // A rollout's last, shorter window runs on the same driver (its first segments).
      p.mb_h0.from_host(std::span<const float>(p.mb_state));
      const replay::Report rep = p.driver->run(
          [&](Tape&, int64_t i, const Tensor& h, replay::Inputs& in) { return step(t0 + i, h, in.replaying()); }, p.mb_h0,
          len);
      r.segment_peak = std::max(r.segment_peak, rep.segment_peak);
      r.stored_bytes = std::max(r.stored_bytes, rep.state_bytes);
      continue;
    }
    // tbptt:K (and detach): the window is one segment from its stored state.
    {
      Segment seg = tape_->segment();
      const Tensor h0 = tape_->from(std::span<const float>(p.mb_state), {mb, p.H});
      if (p.sequence) {
        // Where gru_sequence fuses: its recurrence one gru_sequence with the
        // episode ends as resets (keep), and the heads and the loss over all
        // its steps at once: one product each of [len Bm, hidden] rows, whose
        // log-probabilities and values reach the host in one read each (step
        // by step, each step's read waits for the device).
        for (int64_t i = 0; i < len; ++i) {
          p.seq_encoded[size_t(i)] = policy_->encode(input(t0 + i));
          for (size_t j = 0; j < Bm; ++j)  // the state entering step i is reset where step i - 1 ended an episode
            p.seq_keep[size_t(i) * Bm + j] = i > 0 && p.done[size_t(t0 + i - 1) * B + size_t(streams[j])] ? 0.0f : 1.0f;
          if (i + 1 < len) tape_->next_step();  // (the sequence and what follows it: the last step)
        }
        const Tensor e = concat(std::span<const Tensor>(p.seq_encoded.data(), size_t(len)), 0);
        const Tensor states = policy_->recur_sequence(reshape(e, {len, mb, e.dim(1)}), h0,
                                                      tape_->from(std::span<const float>(p.seq_keep.data(), size_t(len) * Bm), {len, mb}));
        const Tensor f = reshape(states, {len * mb, p.H});
        const Tensor lp = log_softmax(policy_->logits(f));  // [len Bm, A]
        const Tensor v = policy_->value(f);                 // [len Bm, 1]
        const size_t rows = size_t(len) * Bm;
        lp.to_host(std::span<float>(p.seq_rows).first(rows * A));
        v.to_host(std::span<float>(p.seq_values).first(rows));
        for (int64_t i = 0; i < len; ++i) {
          const size_t at = size_t(i) * Bm;
          host_terms(t0 + i, p.seq_rows.data() + at * A, p.seq_values.data() + at, p.seq_weights.data() + at * A, p.seq_returns.data() + at);
        }
        seg.backward(loss_of(lp, v, std::span<const float>(p.seq_weights).first(rows * A), std::span<const float>(p.seq_returns).first(rows)));
        tape_->next_step();
        for (size_t i = 0; i < size_t(len); ++i) p.seq_encoded[i] = Tensor{};
      } else {
        Tensor h = h0, loss;
        for (int64_t t = t0; t < t0 + len; ++t, tape_->next_step()) {
          const replay::StepResult sr = step(t, h, true);
          loss = loss.defined() ? add(loss, sr.loss) : sr.loss;
          h = sr.state;
        }
        seg.backward(loss);
      }
    }
    r.segment_peak = std::max(r.segment_peak, tape_->stats().last_segment_peak);
  }
  for (int64_t t = 0; t < n; ++t)
    r.loss_sum += p.step_stats[size_t(t) * 3], r.approx_kl += p.step_stats[size_t(t) * 3 + 1],
        r.clip_fraction += p.step_stats[size_t(t) * 3 + 2];
}

}  // namespace segtape::agent
