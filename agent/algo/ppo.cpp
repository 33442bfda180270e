// Recurrent PPO (`segtape train --algo ppo`, docs/agent.md "Recurrent PPO").
//
// One update = a rollout of T steps over the B streams, then `epochs` passes
// over `minibatches` minibatches of whole streams, each an optimizer step.
// The rollout runs without a gradient in segments of K steps and stores the
// state every W steps (the history's span: K, or exact's T); a minibatch's
// update replays each W-step window from its stored state through the history
// (as Stable-Baselines3's RecurrentPPO starts its sequences from stored
// states), one K-step segment in the arena at a time, the gradients
// accumulating until the step. Episode ends inside a segment reset the
// stream's state by masking (reset_finished), in the rollout and in the
// replay alike.
//
// The clipped surrogate's gradient is -A * ratio * grad log pi(a) where the
// ratio is inside [1 - eps, 1 + eps] or on the side that the clip does not
// bound, and 0 elsewhere. The forward pass gives the ratio before the
// backward, so the loss recorded is sum(log pi * W) with that weight W held
// constant: exactly the surrogate's gradient, without exp() of a possibly
// large -log pi_old. The loss reported is the surrogate itself, computed on
// the host from the same values.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "../device/device_loop.h"
#include "algorithm.h"
#include "rollout_buffer.h"
#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class Ppo : public Algorithm {
 public:
  Ppo(Context& c, HistoryRunner& h, Step& s);
  UpdateResult update(int64_t remaining) override;
  bool sequence() const override { return sequence_; }

 private:
  void rollout(int64_t n, UpdateResult& r);
  void device_rollout(int64_t n, UpdateResult& r);
  void device_rollout_figures(UpdateResult& r);
  void minibatch(int64_t n, std::span<const int64_t> streams, UpdateResult& r);
  Tensor input(int64_t t);
  void host_terms(int64_t t, const float* rows, const float* values, float* weights, float* returns);
  Tensor loss_of(const Tensor& lp, const Tensor& v, std::span<const float> weights, std::span<const float> returns);
  Tensor loss_of(const Tensor& lp, const Tensor& v, const Tensor& weights, const Tensor& returns);
  Tensor device_loss(int64_t t0, const Tensor& lp, const Tensor& v);
  rules::PpoConstants constants() const {
    return {c_.config.value_clip, c_.config.entropy, c_.config.value_coef};
  }
  replay::StepResult step(int64_t t, const Tensor& h, bool with_loss);
  Tensor window_at_once(const Tensor& h0, int64_t t0, int64_t len);

  RolloutBuffer buf_;
  int64_t Bm_, A_;
  std::vector<int64_t> streams_;  // the streams, shuffled each epoch
  // One minibatch: its streams, the normalisation of its advantages, its
  // gathered rows [Bm, ...]
  std::span<const int64_t> mb_;
  double mean_ = 0, std_dev_ = 1, inv_n_ = 1;
  double clip_ = 0.2;  // this iteration's clip range (update() sets it: --clip-range and --clip-schedule)
  bool normalise_ = false;
  std::vector<int64_t> mb_tokens_;
  std::vector<float> mb_vectors_, mb_state_, mb_returns_, mb_weights_, mb_rows_, mb_values_;
  std::vector<uint8_t> mb_done_;
  std::vector<double> step_stats_;  // [T, 3]: each step's share of the reported loss, KL and clip fraction
  std::vector<double> parts_;       // host_terms': a row's parts (rules::ppo_row)
  // Where the history runs a window's recurrence as one gru_sequence
  // (sequence_): its steps' encodings on the tape; the host copies of its
  // log-probabilities [W, Bm, A] and values [W, Bm], the loss's weights
  // [W, Bm, A] and returns [W, Bm]; the state's factor entering each step
  // [W, Bm] (0 after an episode's end).
  bool sequence_ = false;
  std::vector<Tensor> seq_encoded_;
  std::vector<float> seq_rows_, seq_values_, seq_weights_, seq_returns_, seq_keep_;
  std::array<Metric, 2> metrics_{Metric{"approx_kl", 0}, Metric{"clip_fraction", 0}};
  // --device-loop (TrainConfig::device_loop): the twin env's device form and
  // the rollout on the tape's device, and the update's tensors there: the
  // window (the minibatch's streams [Bm] and the window's first step), the
  // advantages' normalisation and the clip range [5], the minibatch's
  // advantages gathered in order [T Bm], the rows' loss parts
  // [rows, 4 + A], each step's figures [T, 3], the iteration's figures and
  // its updates' squared gradient norms [3 + epochs minibatches], and the
  // state a minibatch's window starts from [R Bm, H].
  struct OnDevice {
    OnDevice(Context& c, const RolloutBuffer& buf, int64_t Bm, int64_t A, int64_t rows)
        : env(*c.tape, *c.env, c.config.env_options),
          rollout(*c.tape, *c.policy, env, buf.T, c.config.history.k, Context::act_seed(c.config.seed, c.rank()), buf.W, buf.R),
          window{c.tape->persistent({Bm}, DType::I64), c.tape->persistent({1}, DType::I64)},
          norm(c.tape->persistent({5}, DType::F64)),
          advantages(c.tape->persistent({buf.T * Bm})),
          parts(c.tape->persistent({rows * (4 + A)}, DType::F64)),
          step_stats(c.tape->persistent({buf.T, 3}, DType::F64)),
          totals(c.tape->persistent({3 + c.config.epochs * c.config.minibatches}, DType::F64)),
          state(c.tape->persistent({buf.R * Bm, buf.H})) {}
    device::DeviceEnv env;
    device::DeviceRollout rollout;
    device::UpdateWindow window;
    Tensor norm, advantages, parts, step_stats, totals, state;
    std::vector<double> stats, totals_host;
  };
  std::unique_ptr<OnDevice> dev_;
  bool on_device_ = false;  // this iteration's update runs on the device (its rollout did)
};

Ppo::Ppo(Context& c, HistoryRunner& h, Step& s)
    : Algorithm(c, h, s), buf_(c.config, c.env->spec()), Bm_(c.config.batch / c.config.minibatches), A_(s.num_actions()) {
  const auto Bm = size_t(Bm_), H = size_t(c.config.hidden), A = size_t(A_), R = size_t(c.config.state_rows());
  if (c.env->spec().vocab > 0) mb_tokens_.assign(Bm, 0);
  else mb_vectors_.assign(Bm * size_t(buf_.obs_dim), 0.0f);
  streams_.resize(size_t(c.config.batch));
  mb_state_.assign(R * Bm * H, 0.0f);
  mb_returns_.assign(Bm, 0.0f);
  mb_weights_.assign(Bm * A, 0.0f);
  mb_rows_.assign(Bm * A, 0.0f);
  mb_values_.assign(Bm, 0.0f);
  mb_done_.assign(Bm, 0);
  step_stats_.assign(size_t(buf_.T) * 3, 0.0);
  sequence_ = R == 1 && history_.sequence(Bm_);  // (one gru_sequence: the policy's GRU alone)
  if (sequence_) {
    const auto W = size_t(buf_.W);
    seq_encoded_.resize(W);
    seq_rows_.assign(W * Bm * A, 0.0f), seq_weights_.assign(W * Bm * A, 0.0f);
    seq_values_.assign(W * Bm, 0.0f), seq_returns_.assign(W * Bm, 0.0f), seq_keep_.assign(W * Bm, 1.0f);
  }
  // a history that replays stores a minibatch window's boundary states like its start state (persistent)
  if (history_.replays()) history_.prepare(c.tape->persistent({int64_t(R) * Bm_, c.config.hidden}), false);
  if (c.config.device_loop) dev_ = std::make_unique<OnDevice>(c, buf_, Bm_, A_, (sequence_ ? buf_.W : 1) * Bm_);
}

UpdateResult Ppo::update(int64_t remaining) {
  UpdateResult r;
  const int64_t n = std::min(c_.config.rollout, remaining);
  if (n <= 0) return r;
  // The learning rate of this iteration's updates: a function of the step, so a resumed run has it too.
  const double left = 1.0 - double(c_.step) / double(c_.config.steps);  // (SB3's progress_remaining)
  if (c_.config.lr_schedule == "linear") c_.set_lr(c_.config.lr * left);
  // Likewise the clip range (host_terms reads it): SB3's lin_0.2 is clip_range x left.
  clip_ = c_.config.clip_schedule == "linear" ? c_.config.clip_range * left : c_.config.clip_range;
  on_device_ = dev_ && n == buf_.T;
  // The device update keeps the gradient's norms on the device and reads them after the iteration (Context::norm_on_device).
  c_.norm_on_device = on_device_ && c_.config.nonfinite != "skip" && !c_.avg;
  const int64_t updates0 = c_.optim->step_count() + c_.skipped;
  if (on_device_) {
    device_rollout(n, r);  // (GAE too)
    dev_->totals_host.assign(size_t(dev_->totals.numel()), 0.0);
    dev_->totals.from_host(std::span<const double>(dev_->totals_host));
  } else {
    rollout(n, r);
    buf_.compute_advantages(n, c_.config.gamma, c_.config.gae_lambda);
  }
  // The order starts afresh each iteration, so that it is a function of act_rng alone (which checkpoints keep).
  std::iota(streams_.begin(), streams_.end(), int64_t(0));
  double kl = 0, clipped = 0;
  try {
    for (int64_t e = 0; e < c_.config.epochs; ++e) {
      for (size_t i = streams_.size(); i > 1; --i)  // Fisher-Yates, from act_rng (checkpointed)
        std::swap(streams_[i - 1], streams_[size_t(c_.act_rng.next_u64() % i)]);
      for (int64_t m = 0; m < c_.config.minibatches; ++m) {
        minibatch(n, std::span<const int64_t>(streams_).subspan(size_t(m * Bm_), size_t(Bm_)), r);
        if (on_device_) device::ppo_totals(dev_->step_stats, n, dev_->totals);
        else
          for (int64_t t = 0; t < n; ++t)
            r.loss_sum += step_stats_[size_t(t) * 3], kl += step_stats_[size_t(t) * 3 + 1], clipped += step_stats_[size_t(t) * 3 + 2];
        ++r.loss_steps;
        c_.update(true);
        if (c_.norm_on_device) device::keep_square(c_.clip_sq, dev_->totals, 3 + e * c_.config.minibatches + m);
      }
    }
  } catch (...) {
    // An update that throws leaves the env and the streams' returns moved on by
    // the rollout, as the host loop's does (its error, not a read's, is the one raised).
    if (on_device_) try {
        device_rollout_figures(r);
      } catch (...) {  // NOLINT(bugprone-empty-catch)
      }
    throw;
  }
  if (on_device_) {  // the iteration's figures and norms: one read (the figures' sums in the host update's order)
    device_rollout_figures(r);
    std::vector<double>& totals = dev_->totals_host;
    dev_->totals.to_host(std::span<double>(totals));
    r.loss_sum = totals[0], kl = totals[1], clipped = totals[2];
    if (c_.norm_on_device)
      for (size_t u = 3; u < totals.size(); ++u)
        if (!std::isfinite(totals[u])) [[unlikely]]
          c_.refuse_non_finite_after(updates0 + int64_t(u) - 2, totals[u]);
  }
  history_.check_replays();  // (exact and overlap under --device-loop: their replays' checks, one read)
  metrics_[0].value = kl / double(r.loss_steps);
  metrics_[1].value = clipped / double(r.loss_steps);
  r.metrics = metrics_;
  r.steps = n;
  return r;
}

// n steps over the B streams, sampled actions, no gradient; the state goes
// from segment to segment and into the next iteration in its persistent home.
void Ppo::rollout(int64_t n, UpdateResult& r) {
  const EnvSpec& spec = c_.env->spec();
  const auto B = size_t(buf_.B), A = size_t(A_), RH = size_t(buf_.R * buf_.H);
  const int64_t K = c_.config.history.k, W = buf_.W;
  for (int64_t t0 = 0; t0 < n; r.segment_peak = std::max(r.segment_peak, c_.tape->stats().last_segment_peak)) {
    // Segments of at most K steps, cut where a window starts too (its state is stored there).
    const int64_t end = std::min({n, (t0 / K + 1) * K, (t0 / W + 1) * W});
    Segment seg = c_.tape->segment();
    NoGradGuard ng(*c_.tape);
    if (t0 % W == 0) c_.h.to_host(std::span<float>(buf_.start_state).subspan(size_t(t0 / W) * B * RH, B * RH));
    for (int64_t t = t0; t < end; ++t, ++c_.step, c_.tape->next_step()) {
      const size_t row = size_t(t) * B;
      const Tensor x = step_.observe();
      if (spec.vocab > 0) std::copy(step_.tokens.begin(), step_.tokens.end(), buf_.tokens.begin() + ptrdiff_t(row));
      else std::copy(step_.vectors.begin(), step_.vectors.end(), buf_.vectors.begin() + ptrdiff_t(row * size_t(buf_.obs_dim)));
      if (spec.supervised) c_.env->targets(step_.targets);
      const Recurred f = step_.feature(x, c_.h);
      const Tensor lp = step_.log_probs(f.feature);  // [B, A]
      step_.value(f.feature).to_host(std::span<float>(buf_.values).subspan(row, B));
      step_.sample(lp, step_.actions);  // leaves lp in step_.rows
      step_.act(step_.actions);
      // A supervised env as a task to act in: reward 1 for its target class.
      if (spec.supervised)
        for (size_t b = 0; b < B; ++b)
          step_.rewards[b] += step_.targets[b] != kNoTarget && step_.actions[b] == step_.targets[b] ? 1.0f : 0.0f;
      c_.h = step_.reset(f.state, step_.done);
      step_.note_rewards(r.return_sum, r.episodes);
      step_.bootstrap_truncated(f.state, c_.config.gamma);  // (a time limit's cut: its reward + gamma V(final observation))
      for (size_t b = 0; b < B; ++b) {
        buf_.actions[row + b] = step_.actions[b];
        buf_.logp[row + b] = step_.rows[b * A + size_t(step_.actions[b])];
        buf_.rewards[row + b] = step_.rewards[b];
        buf_.done[row + b] = step_.done[b];
      }
    }
    copy_into(c_.h_home, c_.h);  // the state lives in its home between segments and iterations
    c_.h = c_.h_home;
    t0 = end;
  }
  const Segment seg = c_.tape->segment();
  NoGradGuard ng(*c_.tape);
  step_.value(step_.feature(step_.observe(), c_.h, false).feature).to_host(std::span<float>(buf_.bootstrap));
}

// The same rollout on the tape's device (--device-loop, agent/device/), and
// GAE there: the twin env's state and the streams' returns so far go to the
// device, the rollout and its advantages run with nothing read back, and
// its tensors stay there for the update; after the update the streams'
// episode returns come back in one read and the twin takes the device env's
// state (and the score it counted): device_rollout_figures.
void Ppo::device_rollout(int64_t n, UpdateResult& r) {
  OnDevice& d = *dev_;
  const std::vector<int64_t> twin = c_.env->save_state();
  d.env.load_rows(std::span<const int64_t>(twin).last(size_t(d.env.state().numel())));
  d.rollout.start_at(c_.step, c_.episode_return);
  if (c_.h.ptr != c_.h_home.ptr) copy_into(c_.h_home, c_.h);
  d.rollout.run(c_.h_home);
  c_.h = c_.h_home;
  d.rollout.advantages(c_.config.gamma, c_.config.gae_lambda);
  c_.step += n;
  r.segment_peak = std::max(r.segment_peak, d.rollout.segment_peak);
}

// After the update (so that the host issues the update without waiting for
// the rollout): the streams' returns and the twin env's state, read back.
void Ppo::device_rollout_figures(UpdateResult& r) {
  OnDevice& d = *dev_;
  d.stats.resize(size_t(buf_.B) * 3);
  d.rollout.stats.to_host(std::span<double>(d.stats));
  for (size_t b = 0; b < size_t(buf_.B); ++b)
    c_.episode_return[b] = float(d.stats[3 * b]), r.return_sum += d.stats[3 * b + 1], r.episodes += int64_t(d.stats[3 * b + 2]);
  d.env.sync_to(*c_.env);
}

// Step t's observation rows of the minibatch, on the tape.
Tensor Ppo::input(int64_t t) {
  if (on_device_) {  // gathered from the rollout's tensors, where they are
    const device::DeviceRollout& ro = dev_->rollout;
    const Tensor x = ro.D == 0 ? c_.tape->empty({Bm_}, DType::I64) : c_.tape->empty({Bm_, ro.D});
    device::gather_rows(ro.D == 0 ? ro.tokens : ro.vectors, dev_->window, t, x);
    return x;
  }
  const auto row = size_t(t) * size_t(buf_.B), Bm = mb_.size();
  if (c_.env->spec().vocab > 0) {
    for (size_t i = 0; i < Bm; ++i) mb_tokens_[i] = buf_.tokens[row + size_t(mb_[i])];
    return step_.observation(mb_tokens_, {}, Bm_);
  }
  const auto D = size_t(buf_.obs_dim);
  for (size_t i = 0; i < Bm; ++i)
    std::copy_n(buf_.vectors.begin() + ptrdiff_t((row + size_t(mb_[i])) * D), D, mb_vectors_.begin() + ptrdiff_t(i * D));
  return step_.observation({}, mb_vectors_, Bm_);
}

// Step t's host terms from the host copies of its log-probabilities (rows
// [Bm, A]) and values [Bm]: the surrogate's weights into weights [Bm, A]
// and the returns into returns [Bm], constants of the loss. Its host
// figures go to slot t of step_stats_, overwritten when a replay runs the
// step again (the same values), so each step counts once.
void Ppo::host_terms(int64_t t, const float* rows, const float* values, float* weights, float* returns) {
  const auto row = size_t(t) * size_t(buf_.B), Bm = mb_.size(), A = size_t(A_);
  const rules::PpoConstants k = constants();
  const double norm[5] = {mean_, std_dev_, inv_n_, normalise_ ? 1.0 : 0.0, clip_};
  parts_.resize(4 + A);
  double reported = 0, kl = 0, clipped_terms = 0;
  for (size_t i = 0; i < Bm; ++i) {
    const size_t j = row + size_t(mb_[i]);
    rules::ppo_row(k, norm, buf_.advantages[j], buf_.actions[j], buf_.logp[j], buf_.returns[j], buf_.values[j], rows + i * A, values[i], A_,
                   weights + i * A, returns + i, parts_.data());
    rules::ppo_add_row(parts_.data(), A_, reported, kl, clipped_terms);
  }
  step_stats_[size_t(t) * 3 + 0] = reported, step_stats_[size_t(t) * 3 + 1] = kl, step_stats_[size_t(t) * 3 + 2] = clipped_terms;
}

// The loss of rows (steps x streams) of log-probabilities lp [rows, A] and
// values v [rows, 1], with host_terms' weights and returns of those rows.
Tensor Ppo::loss_of(const Tensor& lp, const Tensor& v, std::span<const float> weights, std::span<const float> returns) {
  const int64_t rows = lp.dim(0);
  return loss_of(lp, v, c_.tape->from(weights, {rows, A_}), c_.tape->from(returns, {rows, 1}));
}
Tensor Ppo::loss_of(const Tensor& lp, const Tensor& v, const Tensor& weights, const Tensor& returns) {
  Tensor pg = sum(mul(lp, weights));
  Tensor vl = scale(mse_loss(v, returns, Reduction::Sum), 0.5 * c_.config.value_coef * inv_n_);
  Tensor neg_entropy = scale(sum(mul(exp(lp), lp)), c_.config.entropy * inv_n_);
  return add(add(pg, vl), neg_entropy);
}

// The same loss with its terms computed on the device (host_terms' rules,
// device::ppo_terms) for the rows of steps t0, t0 + 1, ...: nothing read back.
Tensor Ppo::device_loss(int64_t t0, const Tensor& lp, const Tensor& v) {
  const int64_t rows = lp.dim(0);
  const Tensor weights = c_.tape->empty({rows, A_}), returns = c_.tape->empty({rows, 1});
  device::ppo_terms(dev_->rollout, dev_->window, dev_->norm, t0, lp, v, constants(), weights, returns, dev_->parts, dev_->step_stats);
  return loss_of(lp, v, weights, returns);
}

// Rollout step t of the minibatch from the state h: the state after it
// (reset where the stream's episode ended) and, with_loss, its loss.
replay::StepResult Ppo::step(int64_t t, const Tensor& h, bool with_loss) {
  const auto row = size_t(t) * size_t(buf_.B);
  const Recurred r = step_.feature(input(t), h);  // (the heads read r.feature: an LSTM's h rows of its state)
  const Tensor& f = r.state;
  if (on_device_) {
    const Tensor keep = c_.tape->empty(f.shape);
    device::reset_factors(dev_->rollout.done, dev_->window, t, keep, false);
    if (!with_loss) return {step_.reset(f, keep), Tensor{}};
    const Tensor lp = step_.log_probs(r.feature);
    return {step_.reset(f, keep), device_loss(t, lp, step_.value(r.feature))};
  }
  for (size_t i = 0; i < mb_.size(); ++i) mb_done_[i] = buf_.done[row + size_t(mb_[i])];
  if (!with_loss) return {step_.reset(f, mb_done_), Tensor{}};
  const Tensor lp = step_.log_probs(r.feature);  // [Bm, A]
  const Tensor v = step_.value(r.feature);       // [Bm, 1]
  lp.to_host(std::span<float>(mb_rows_));
  v.to_host(std::span<float>(mb_values_));
  host_terms(t, mb_rows_.data(), mb_values_.data(), mb_weights_.data(), mb_returns_.data());
  const Tensor loss = loss_of(lp, v, mb_weights_, mb_returns_);
  return {step_.reset(f, mb_done_), loss};
}

// A window's steps at once (where the history runs them as one
// gru_sequence): the recurrence one gru_sequence with the episode ends as
// resets (keep), and the heads and the loss over all its steps at once: one
// product each of [len Bm, hidden] rows, whose log-probabilities and values
// reach the host in one read each (step by step, each step's read waits for
// the device).
Tensor Ppo::window_at_once(const Tensor& h0, int64_t t0, int64_t len) {
  const auto B = size_t(buf_.B), Bm = mb_.size(), A = size_t(A_);
  for (int64_t i = 0; i < len; ++i) {
    seq_encoded_[size_t(i)] = c_.policy->encode(input(t0 + i));
    if (!on_device_)
      for (size_t j = 0; j < Bm; ++j)  // the state entering step i is reset where step i - 1 ended an episode
        seq_keep_[size_t(i) * Bm + j] = i > 0 && buf_.done[size_t(t0 + i - 1) * B + size_t(mb_[j])] ? 0.0f : 1.0f;
    if (i + 1 < len) c_.tape->next_step();  // (the sequence and what follows it: the last step)
  }
  const Tensor e = concat(std::span<const Tensor>(seq_encoded_.data(), size_t(len)), 0);
  for (size_t i = 0; i < size_t(len); ++i) seq_encoded_[i] = Tensor{};  // (the handles; e holds the steps now)
  Tensor keep;
  if (on_device_) keep = c_.tape->empty({len, Bm_}), device::reset_factors(dev_->rollout.done, dev_->window, t0, keep, true);
  else keep = c_.tape->from(std::span<const float>(seq_keep_.data(), size_t(len) * Bm), {len, Bm_});
  const Tensor states = c_.policy->recur_sequence(reshape(e, {len, Bm_, e.dim(1)}), h0, keep);
  const Tensor f = reshape(states, {len * Bm_, c_.config.hidden});
  const Tensor lp = step_.log_probs(f);  // [len Bm, A]
  const Tensor v = step_.value(f);       // [len Bm, 1]
  if (on_device_) return device_loss(t0, lp, v);
  const size_t rows = size_t(len) * Bm;
  lp.to_host(std::span<float>(seq_rows_).first(rows * A));
  v.to_host(std::span<float>(seq_values_).first(rows));
  for (int64_t i = 0; i < len; ++i) {
    const size_t at = size_t(i) * Bm;
    host_terms(t0 + i, seq_rows_.data() + at * A, seq_values_.data() + at, seq_weights_.data() + at * A, seq_returns_.data() + at);
  }
  return loss_of(lp, v, std::span<const float>(seq_weights_).first(rows * A), std::span<const float>(seq_returns_).first(rows));
}

// One minibatch of whole streams over the n rollout steps, window by window
// from the states stored at rollout time, through the history; the
// gradients accumulate. step_stats_ gets the minibatch's PPO loss
// (surrogate + value + entropy terms, means over its steps and streams), KL
// estimate and clip fraction, step by step.
void Ppo::minibatch(int64_t n, std::span<const int64_t> streams, UpdateResult& r) {
  mb_ = streams;
  // The minibatch's advantages are normalised by their mean and standard deviation.
  if (on_device_) {
    dev_->window.mb.from_host(streams);
    device::advantage_stats(dev_->rollout.advantages_, dev_->window.mb, n, clip_, dev_->advantages, dev_->norm);
    inv_n_ = 1.0 / (double(n) * double(streams.size()));  // (the loss's scales; as rules::advantage_stats)
  } else {
    double norm[4];
    rules::advantage_stats(n, buf_.B, int64_t(streams.size()), streams.data(), buf_.advantages.data(), norm);
    mean_ = norm[0], std_dev_ = norm[1], inv_n_ = norm[2], normalise_ = norm[3] != 0;
  }
  Steps s;
  s.step = [this](Tape&, int64_t t, const Tensor& h, replay::Inputs& in) { return step(t, h, in.loss_wanted()); };
  s.sequence = [this](const Tensor& h0, int64_t t0, int64_t len) { return window_at_once(h0, t0, len); };
  s.state_at = [this](int64_t t) {  // the minibatch's rows of the state stored at step t (in each of its R blocks of B rows)
    const auto B = size_t(buf_.B), H = size_t(buf_.H), R = size_t(buf_.R), w = size_t(t / buf_.W), Bm = mb_.size();
    for (size_t r = 0; r < R; ++r)
      for (size_t i = 0; i < Bm; ++i)
        std::copy_n(buf_.start_state.begin() + ptrdiff_t(((w * R + r) * B + size_t(mb_[i])) * H), H,
                    mb_state_.begin() + ptrdiff_t((r * Bm + i) * H));
    return std::span<const float>(mb_state_);
  };
  if (on_device_) {  // (the state stored on the device; each window's first step, where its calls count from)
    s.state_on_tape = [this](int64_t t) {
      dev_->window.at(t);
      device::gather_state(dev_->rollout.starts, dev_->window, buf_.W, dev_->state);
      return dev_->state;
    };
    // Windows of the same steps (the span divides the rollout), each one segment: CUDA graphs in a slot of their own.
    s.graph_windows = n % c_.config.history.span() == 0;
  }
  const int64_t span = c_.config.history.span();  // the steps an update learns from at once
  for (int64_t t0 = 0; t0 < n; t0 += span) {
    const Ran ran = history_.replay(s, t0, std::min(n, t0 + span) - t0);
    r.segment_peak = std::max(r.segment_peak, ran.segment_peak);
    r.stored_bytes = std::max(r.stored_bytes, ran.stored_bytes);
  }
}

void validate(const TrainConfig& c) {
  auto need = [](bool ok, const std::string& m) {
    if (!ok) throw Error(m);
  };
  need(history_def(c.history.kind).ppo, "--algo ppo replays each minibatch's windows from the states stored at rollout time, with "
                                        "--history " + history_choices([](const HistoryDef& d) { return d.ppo; }) + "; --history " +
                                            c.history.str() + " is not built for it");
  need(c.rollout >= 1 && c.rollout <= 1'000'000, "--rollout must be in [1, 1000000]");
  need(c.epochs >= 1 && c.epochs <= 1000, "--epochs must be in [1, 1000]");
  need(c.minibatches >= 1 && c.minibatches <= c.batch && c.batch % c.minibatches == 0,
       "--minibatches " + std::to_string(c.minibatches) + ": must divide --batch " + std::to_string(c.batch) +
           " (each minibatch holds whole streams)");
  need(std::isfinite(c.clip_range) && c.clip_range > 0 && c.clip_range < 1, "--clip-range must be in (0, 1)");
  need(c.gae_lambda >= 0 && c.gae_lambda <= 1, "--gae-lambda must be in [0, 1]");
  need(c.lr_schedule == "linear" || c.lr_schedule == "constant", "--lr-schedule '" + c.lr_schedule + "': choose linear or constant");
  need(c.clip_schedule == "linear" || c.clip_schedule == "constant",
       "--clip-schedule '" + c.clip_schedule + "': choose linear or constant");
  need(c.value_clip >= 0 && c.value_clip < 1e30, "--value-clip must be in [0, 1e30) (0: off)");
  need(!c.device_loop || device::is_twin(c.env),
       "--device-loop on runs the rollouts of a device env's host twin (--env device-recall, device-tmaze or device-dialogue); --env " + c.env +
           " has no device form");
  need(!c.device_loop || c.env_shards == 1, "--device-loop on runs one env's streams (not --env-shards " + std::to_string(c.env_shards) + ")");
}

}  // namespace

extern const AlgorithmDef PpoAlgorithm;
const AlgorithmDef PpoAlgorithm{
    .kind = Algo::Ppo,
    .name = "ppo",
    .flag = true,
    .help = "ppo (recurrent PPO: rollouts, GAE, clipped surrogate, minibatches of whole streams replayed from their stored states; on a supervised env the reward is 1 for the target class)",
    .value_head = true,
    .validate = validate,
    .host_bytes = [](const TrainConfig& c, const EnvSpec& spec) {
      // --device-loop: the rollout's and the update's tensors on the tape (host memory on the CPU)
      const size_t T = size_t(c.rollout), B = size_t(c.batch), W = size_t(c.history.stored_every()), S = (T + W - 1) / W;
      const size_t obs = spec.vocab > 0 ? 8 : 4 * size_t(spec.obs_dim), R = size_t(c.state_rows()), H = size_t(c.hidden);
      const size_t Bm = B / size_t(c.minibatches), A = size_t(spec.num_actions);
      const size_t update = W * Bm * (4 + A) * 8 + T * 3 * 8 + R * Bm * H * 4 + T * Bm * 4 + Bm * 8 + 64;
      const size_t tape = T * B * (obs + 8 + 6 * 4) + S * R * B * H * 4 + B * 64 + update;
      return RolloutBuffer::bytes(c, spec) + (c.device_loop && c.device == "cpu" ? tape : 0);
    },
    .make = [](Context& c, HistoryRunner& h, Step& s) -> std::unique_ptr<Algorithm> { return std::make_unique<Ppo>(c, h, s); },
};

}  // namespace segtape::agent
