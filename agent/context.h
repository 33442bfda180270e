// What a trainer's history and algorithm share (private to the agent
// library): the configuration, the tape with the policy and its optimizer,
// the env, the carried state and the counters. The Trainer (trainer.h)
// owns one; agent/history/ and agent/algo/ work on it.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "segtape/agent/config.h"
#include "segtape/agent/env.h"
#include "segtape/agent/policy.h"
#include "segtape/nn/dist.h"
#include "segtape/nn/layers.h"
#include "segtape/nn/optim.h"
#include "segtape/nn/random.h"
#include "segtape/tape.h"

namespace segtape::agent {

struct Context {
  Context(const TrainConfig& c, int rank) : config(c), init_rng(c.seed), act_rng(act_seed(c.seed, rank)) {}

  TrainConfig config;
  // Data parallel: the ranks (null with one process), the gradient averaging,
  // the updates so far, and the stop request that travels with them.
  dist::Communicator* comm = nullptr;
  std::unique_ptr<dist::GradientAverager> avg;
  int64_t updates = 0;
  bool stop_requested = false, stop_agreed = false;
  int stop_reason = 0;  // Trainer::request_stop's: this rank's, then the agreed one

  std::unique_ptr<Tape> tape;
  nn::Rng init_rng, act_rng;  // the parameters' initialisation; the actions' sampling (and PPO's shuffles)
  // A device env's host twin (device-recall, device-tmaze: agent/device/):
  // the actions are drawn as the device loop draws them, stream b's at step
  // `step` from rules::draw(act_seed, b, step) (Step::sample), so that a
  // run's rollouts are the same on the host and on the device
  // (TrainConfig::device_loop); act_rng then only shuffles PPO's streams.
  bool counter_draws = false;
  Env* env = nullptr;         // the B streams (the Trainer's; evaluate's own while it runs)
  std::unique_ptr<Policy> policy;
  std::unique_ptr<nn::Optimizer> optim;  // Adam (AdamW, or SGD: --task lm's --optim)
  std::unique_ptr<nn::Dropout> dropout;  // --dropout > 0 (--task lm): the masks' generator (Step::feature)
  int64_t step = 0;                   // env steps taken
  Tensor h;                           // the GRU state [B, hidden]: carried between segments, or h_home
  Tensor h_home, eval_h;              // persistent homes of the training state and of evaluate's
  std::vector<float> episode_return;  // RL: each stream's return so far in its episode
  // --device cuda: segments as CUDA graphs (the clip keeps its norm on the
  // device, clip_sq); committed: a graph segment's update is done, a throw
  // after it keeps it (Trainer::run_segment)
  bool graph = false;
  bool committed = false;
  Tensor clip_sq;
  // --device-loop's PPO update (set per iteration): the gradient's norm stays
  // on the device too, in clip_sq, and the algorithm checks the iteration's
  // norms after it (refuse_non_finite_after); not under --nonfinite skip,
  // whose skip is decided before the step, nor under data parallelism
  bool norm_on_device = false;
  // Updates whose gradient was not finite (TrainConfig::nonfinite): skipped
  // in the run (checkpointed) and in a row; the first step of the segment
  // that runs now (the updates' errors name its steps).
  int64_t skipped = 0, skipped_in_a_row = 0;
  int64_t segment_step0 = 0;
  // Set when a NonFiniteError ended a segment part-way (the env, the
  // samplers and, in PPO, earlier minibatches' updates moved on; the step
  // count and the state did not): the trainer then refuses to train, save
  // or evaluate until a checkpoint is loaded. What stopped it.
  std::string stopped_at_non_finite;

  int rank() const { return comm ? comm->rank() : 0; }
  int ranks() const { return comm ? comm->size() : 1; }
  // The update after a backward: the gradients averaged over the ranks,
  // clipped, Adam's step, zeroed. has_loss false: this rank had no loss
  // (under data parallelism it still joins the all-reduce; no rank with a
  // loss: no step).
  void update(bool has_loss);
  // An update whose gradient's norm is not finite: under --nonfinite stop
  // (or after --max-skips skipped in a row) throws NonFiniteError naming it;
  // else its gradients are zeroed and it is counted skipped.
  void refuse_non_finite(const std::string& what);
  // norm_on_device: the run's update `update` (counted from 1) had a norm
  // whose square `sq` is not finite, found after its iteration, whose
  // updates were all taken: throws NonFiniteError naming it.
  [[noreturn]] void refuse_non_finite_after(int64_t update, double sq);
  // Both: stopped_at_non_finite set for the run's update `update` (counted
  // from 1), and their error's start naming it and its segment's steps.
  std::string stop_at_update(int64_t update);

  // This rank's training env, made as the Trainer makes it: its shards'
  // seeds, and (lm) its streams of the text. An algorithm that steps a copy
  // ahead of the model (an open-loop env) makes its copy with this.
  std::unique_ptr<Env> make_training_env() const;

  // The optimizer's learning rate, read and set whatever its kind.
  double lr() const;
  void set_lr(double lr);
  // Rank r's sampling seed (rank 0's: what one process has always used).
  static uint64_t act_seed(uint64_t seed, int rank);
};

// Refuses (Error naming `what`) a call made while a segment runs (busy):
// save, load, run_segment and evaluate are for between segments.
void refuse_inside_a_segment(bool busy, const char* what);

}  // namespace segtape::agent
