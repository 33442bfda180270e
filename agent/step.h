// The policy's step, written once (private to the agent library): the env's
// observation on the tape, encode -> the history's recurrence -> heads, the
// actions (argmax or sampled), the env stepped with them, and the episode
// resets. Every algorithm, evaluation and PPO's replay take their steps
// through it; the buffers it fills on the host are sized once.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "context.h"
#include "segtape/replay.h"

namespace segtape::agent {

class HistoryRunner;

// A step's recurrence: the feature the heads read, and the state it leaves
// (the same tensor for a GRU; window:N carries no state and leaves it as it was).
struct Recurred {
  Tensor feature, state;
};

class Step {
 public:
  Step(Context& c, HistoryRunner& history);

  // The env's observation now into tokens / vectors, on the tape.
  Tensor observe();
  // The same through a step's inputs (replay::Inputs): the env's the first
  // time the step runs, the record's when it runs again.
  Tensor observe(Tape& t, replay::Inputs& in);
  // The done flags of the step just taken (act), through its inputs likewise.
  std::span<const uint8_t> done_flags(replay::Inputs& in);
  // A step's observation on the tape from host rows of `rows` streams:
  // tokens [rows] (token envs) or vectors [rows, obs_dim].
  Tensor observation(std::span<const int64_t> tokens, std::span<const float> vectors, int64_t rows) const;
  // encode -> the history's recurrence from h. commit false: a look ahead
  // that leaves the history's own state as it is (a bootstrap value).
  Recurred feature(const Tensor& obs, const Tensor& h, bool commit = true) const;
  // The same in a training step, with the run's dropout (--dropout) where it
  // has one: the step's masks through its inputs, so a replay applies them again.
  Recurred feature(Tape& t, const Tensor& obs, const Tensor& h, replay::Inputs& in);
  Tensor logits(const Tensor& feature) const { return c_.policy->logits(feature); }
  Tensor log_probs(const Tensor& feature) const { return log_softmax(c_.policy->logits(feature)); }  // [B, A]
  Tensor value(const Tensor& feature) const { return c_.policy->value(feature); }                  // [B, 1]

  // Greedy actions: each row's argmax (the rows copied to rows()).
  void greedy(const Tensor& logits, std::span<int64_t> a);
  // a ~ softmax(lp) per stream, one uniform each from the context's act_rng
  // (lp's rows copied to rows()).
  void sample(const Tensor& lp, std::span<int64_t> a);
  // The env stepped with `a`: rewards and done flags into rewards / done.
  void act(std::span<const int64_t> a);
  // Episode returns of the step just taken: the episodes that ended add to return_sum and episodes.
  void note_rewards(double& return_sum, int64_t& episodes);
  // The streams whose episode the step just taken cut by a limit
  // (Env::truncations): their reward gains gamma x the value of the
  // observation they were cut at, from `state`, the state after the step
  // (before its reset); no gradient, the history's own state left as it
  // is. As Stable-Baselines3 and CleanRL bootstrap a truncation: the
  // episode's return to the step then continues as if it had not been cut.
  // Call after note_rewards (an episode's reported return is the env's
  // rewards). Returns whether any stream was truncated.
  bool bootstrap_truncated(const Tensor& state, double gamma);
  // The streams whose episode ended start the next from the zero state:
  // h · (1 − done) (reset_finished); nothing where the history carries no state.
  Tensor reset(const Tensor& h, std::span<const uint8_t> done_flags);
  // The same with the factors on the tape (h's shape, 0 or 1; PPO's device
  // loop): h · keep, recorded even where no stream's episode ended (h · 1 is h).
  Tensor reset(const Tensor& h, const Tensor& keep);

  int64_t batch() const { return B_; }
  int64_t num_actions() const { return A_; }
  // The host buffers of the step: the observation (tokens [B] or vectors
  // [B, obs_dim]), targets, actions, rewards, done flags, and the last rows read.
  std::vector<int64_t> tokens, targets, actions;
  std::vector<float> vectors, rewards;
  std::vector<uint8_t> done;
  std::vector<float> rows;  // [B, A]: the host copy of the last logits or log-probabilities read

  static int64_t argmax_row(const float* p, int64_t n);

 private:
  Context& c_;
  HistoryRunner& history_;
  int64_t B_, A_;
  std::vector<float> reset_mask_;  // the state's shape (reset_finished)
  // bootstrap_truncated's: the truncated flags [B], the final observations
  // (tokens [B] or vectors [B, obs_dim]) and their values [B]
  std::vector<uint8_t> truncated_;
  std::vector<int64_t> final_tokens_;
  std::vector<float> final_vectors_, final_values_;
};

}  // namespace segtape::agent
