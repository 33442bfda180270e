// What is learned from the steps (--algo): one interface, one file per
// algorithm in this folder (private to the agent library).
//
// An update runs the algorithm's steps through the history (history.h) and
// reports what it did: the common figures of UpdateResult, and its own
// (Metric: PPO's KL estimate and clip fraction).
//
// A new algorithm: a file here that defines `const AlgorithmDef <Kind>Algorithm`
// and one line in SEGTAPE_ALGORITHMS (segtape/agent/config.h).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../history/history.h"
#include "segtape/agent/trainer.h"
#include "segtape/nn/checkpoint.h"

namespace segtape::agent {

class Algorithm {
 public:
  Algorithm(Context& c, HistoryRunner& h, Step& s) : c_(c), history_(h), step_(s) {}
  virtual ~Algorithm() = default;
  Algorithm(const Algorithm&) = delete;
  Algorithm& operator=(const Algorithm&) = delete;
  // One update over the next steps of the run (at most `remaining` of them).
  virtual UpdateResult update(int64_t remaining) = 0;
  // Whether the update runs its recurrence as one gru_sequence (the device's
  // fused kernel) where it can (Trainer::graph_sequence, ppo_sequence).
  virtual bool sequence() const { return false; }
  // The run stops before its end (Trainer::stopped_figures): the figures then.
  virtual UpdateResult stopped() { return {}; }
  // A checkpoint was loaded (what was captured from the old state is forgotten).
  virtual void loaded() {}
  // What a checkpoint keeps of the algorithm's besides the trainer's state
  // (a language model's vocabulary), as metadata.
  virtual void save_metadata(std::map<std::string, std::string>& /*meta*/) const {}
  // Host values of the algorithm's own that a checkpoint keeps (a learning
  // rate schedule's), as entries over its buffers: a save reads them, a load
  // writes them (then loaded()).
  virtual void entries(std::vector<nn::Entry>& /*e*/) {}

 protected:
  Context& c_;
  HistoryRunner& history_;
  Step& step_;
};

// The figures an update shares with the history that ran its steps: the
// steps, their loss as the history read it, and its memory.
inline UpdateResult result_of(int64_t steps, const Ran& ran) {
  UpdateResult r;
  r.steps = steps;
  r.loss_sum = ran.loss;
  r.steps_run = ran.steps_run;
  r.segment_peak = ran.segment_peak;
  r.stored_bytes = ran.stored_bytes;
  return r;
}

// A step learned from the env's targets (the supervised algorithm's, and the
// language model's): encode -> recur -> logits, the cross-entropy of the
// streams that have a target (their mean, times `scale`) where the pass
// wants the loss, greedy actions that step the env, the resets. loss_steps
// counts the steps with a target the first time they run.
replay::StepResult cross_entropy_step(Context& c, Step& step, Tape& t, const Tensor& h, replay::Inputs& in, double scale,
                                      int64_t& loss_steps);

struct AlgorithmDef {
  Algo kind;
  const char* name;
  bool flag;        // --algo takes its name (supervised is what a2c is on a supervised env)
  const char* help;  // its name and what it does, for segtape train --help
  bool value_head;  // the policy has a value head
  // Its own constraints on a configuration (an Error naming the flag); null: none.
  void (*validate)(const TrainConfig& c);
  // The host bytes its buffers take for a configuration (the memory check); null: none worth counting.
  size_t (*host_bytes)(const TrainConfig& c, const EnvSpec& spec);
  std::unique_ptr<Algorithm> (*make)(Context& c, HistoryRunner& h, Step& s);
};

const AlgorithmDef& algorithm_def(Algo kind);

}  // namespace segtape::agent
