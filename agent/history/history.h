// How a segment's steps are run and cut (--history): one interface, one file
// per history in this folder (private to the agent library).
//
// An algorithm hands a history its step in the replay driver's contract
// (segtape/replay.h: the state entering step t and the step's inputs -> the
// state leaving it and its loss); the history decides which segments the
// steps are recorded in, what is cut at their boundaries, whether steps are
// run again (replayed) for their gradient, and carries the state from one
// update to the next.
//
// A new history: a file here that defines `const HistoryDef <Kind>History`
// (its text, its traits, its runner) and one line in SEGTAPE_HISTORIES
// (segtape/agent/config.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "../step.h"
#include "segtape/replay.h"

namespace segtape::agent {

// What an update gives a history to run.
struct Steps {
  // One step. t: the step's index in the run (Context::step when it first
  // runs; PPO: its row in the rollout). It takes what comes from outside the
  // tape (observations, actions, rewards) through `in`, so that a replay sees
  // the same; it returns a loss where in.loss_wanted().
  replay::StepFn step;
  // Once the forward pass over the update's steps [first, first + n) has
  // left `final_state`, before any backward, with a segment open: the losses
  // that need the whole window first (A2C's returns). Returns a loss to add
  // to the steps' (undefined: none). Optional.
  std::function<Tensor(const Tensor& final_state, int64_t first, int64_t n)> after_forward;
  // Once the update's gradients are in the parameters (inside its last
  // segment, before the state is carried): the optimizer's update. Optional.
  std::function<void()> update;
  // Replays from stored states (PPO): the host rows [rows, hidden] of the
  // state entering step t, a multiple of History::stored_every().
  std::function<std::span<const float>(int64_t t)> state_at;
  // The same where the states are stored on the tape (PPO's device loop): a
  // tensor [rows, hidden] of the tape holding the state entering step t,
  // valid until the next call. Where set, state_at is not called.
  std::function<Tensor(int64_t t)> state_on_tape;
  // replay()'s windows as CUDA-graph segments (tape.graph_segment(1): a
  // slot of their own, beside the rollout's), where a history replays a
  // window in one segment and the algorithm's windows all issue the same
  // calls (PPO's device update). Calls state_on_tape inside the segment.
  bool graph_windows = false;
  // The steps [first, first + n) from h at once, where a history runs them
  // as one gru_sequence (sequence()): their loss. Optional.
  std::function<Tensor(const Tensor& h, int64_t first, int64_t n)> sequence;
  // A CUDA-graph segment (Tbptt, --device cuda): the pattern of its steps
  // (which have a target, which reset a stream), non-zero where the
  // algorithm knows the steps' inputs before they run; a pattern that
  // repeats runs as one graph. `record` records the segment's ops (graph:
  // whether it is captured or replayed), leaves the state after them in
  // Context::h and returns their loss.
  uint64_t graph_key = 0;
  std::function<Tensor(bool graph)> record;
};

// What a history's run did.
struct Ran {
  double loss = 0;          // the sum of the losses it backpropagated, read on the host (step by step, or a replayed segment's at once)
  int64_t steps_run = 0;    // step evaluations where steps are replayed (forward passes and replays); 0 otherwise
  size_t segment_peak = 0;  // the largest arena high-water of its segments, where it ran several (else the tape's last)
  size_t stored_bytes = 0;  // the boundary states it keeps
  bool graph = false;       // a CUDA-graph segment ran as a graph (captured or replayed), not eagerly
};

class HistoryRunner {
 public:
  explicit HistoryRunner(Context& c) : c_(c) {}
  virtual ~HistoryRunner() = default;
  HistoryRunner(const HistoryRunner&) = delete;
  HistoryRunner& operator=(const HistoryRunner&) = delete;

  // The step's recurrence from h (Step::feature): the policy's by default.
  // between: a stack's dropout masks between its layers (Policy::recur).
  virtual Recurred recur(const Tensor& e, const Tensor& h, bool commit, std::span<const Tensor> between = {});
  // Whether the history carries a recurrent state (Step::reset resets it).
  virtual bool carries_state() const { return true; }

  // Runs the next n steps of the run from the carried state (Context::h),
  // learns from them (backward, then s.update) and carries the state after
  // them; Context::step advances by n.
  virtual Ran run(Steps& s, int64_t n) = 0;
  // The gradient of the losses of steps [first, first + n) (PPO's
  // minibatch windows), run from the states stored at rollout time
  // (Steps::state_at): no update, nothing carried. One segment from the
  // state entering `first` by default; a history reaches back as far as its
  // windows do.
  virtual Ran replay(Steps& s, int64_t first, int64_t n);
  // Whether run() and replay() run steps again for their gradient (the loss
  // is wanted on the replays only).
  virtual bool replays() const { return false; }
  // Under --device-loop a replaying history checks its replays on the device
  // (replay::Options::verify_on_device) and reads no loss per segment: this
  // reads the checks of the windows since the last call and throws what the
  // check found (the algorithm calls it once an iteration).
  virtual void check_replays() {}
  // The state tensor the algorithm's gradient passes run on (Context::h_home,
  // or PPO's minibatch state), and whether they are run() (live) or replay():
  // a history that stores states makes them like it.
  virtual void prepare(const Tensor& /*state*/, bool /*live*/) {}
  // Whether steps known before they run (Steps::sequence) run as one
  // gru_sequence for `rows` streams.
  virtual bool sequence(int64_t /*rows*/) const { return false; }

  // What the history carries between updates besides Context::h, kept in
  // checkpoints and put aside by evaluate: tensors (window:N's ring of
  // embeddings) and a position.
  virtual std::span<const Tensor> carried() const { return {}; }
  virtual int64_t position() const { return 0; }
  virtual void set_position(int64_t) {}
  // A checkpoint was loaded (what was captured from the old state is forgotten).
  virtual void loaded() {}

 protected:
  // The live pass of a segment's steps [first, first + n) from h: each step
  // in turn, its loss added, the tape's step moved on; h becomes the state
  // after them. Returns the summed loss (undefined: none); with `read`, each
  // step's loss read on the host adds to r.loss.
  Tensor run_steps(Steps& s, Tensor& h, int64_t first, int64_t n, Ran& r, bool read = true);
  // The next n steps of the run in `seg` from Context::h, learned from:
  // their loss (and Steps::after_forward's) backpropagated, Context::step
  // moved on, Steps::update. The caller carries the state.
  Ran learn(Steps& s, int64_t n, Segment& seg, const BackwardOptions& o = {});
  // The state stored for step t (Steps::state_on_tape, else state_at)
  // copied into dst, or where dst is undefined into a new tensor of the open segment.
  Tensor stored_state(Steps& s, int64_t t, Tensor dst = {}) const;
  Context& c_;
  replay::Inputs live_ = replay::Inputs::live();  // steps that run once: their inputs pass through
};

// A history whose steps are replayed for their gradient (exact, overlap):
// a replay driver (segtape/replay.h) over the state the algorithm's passes
// run on, and the update it runs: the driver's step and forward hook pass
// the update's Steps on, its step indices counted from `offset_`.
class ReplayingHistory : public HistoryRunner {
 public:
  using HistoryRunner::HistoryRunner;
  bool replays() const override { return true; }
  void check_replays() override {
    if (driver_) driver_->check_replays();
  }

 protected:
  // The driver (its boundary states in the persistent pool, shaped like
  // `state`, made once: a shorter window runs on the same ones); stride > 0:
  // overlapping windows.
  void make_driver(const Tensor& state, int64_t stride);
  // The update about to run: its steps, its first step and how many
  // (Steps::after_forward's), and the run's index of the driver's step 0.
  void running(Steps* s, int64_t first, int64_t n, int64_t offset) { steps_ = s, first_ = first, n_ = n, offset_ = offset; }
  // After a live window: the update, and the state after it carried in Context::h_home.
  Ran learned(Steps& s, const replay::Report& rep, int64_t n);
  static Ran ran_of(const replay::Report& rep);

  Tensor home_;  // the state the replayed windows start from (persistent)
  std::unique_ptr<replay::Driver> driver_;
  const replay::StepFn step_ = [this](Tape& t, int64_t i, const Tensor& h, replay::Inputs& in) {
    return steps_->step(t, offset_ + i, h, in);
  };

 private:
  Steps* steps_ = nullptr;
  int64_t first_ = 0, n_ = 0, offset_ = 0;
};

// A history's text and traits (what the rest of the trainer must know before
// its runner exists) and its runner.
struct HistoryDef {
  History::Kind kind;
  const char* name;    // the text before ':'
  const char* alias;   // another name it answers to (tbptt: "detach"), or null
  const char* syntax;  // its forms, for the list of choices ("tbptt:K, detach")
  const char* help;    // its forms and what they do, for segtape train --help
  History (*parse)(const std::string& text);  // all of --history's text (its name or alias first)
  std::string (*str)(const History& h);
  // Its own constraints on a configuration (an Error naming the flag); null: none.
  void (*validate)(const TrainConfig& c);
  bool recurrent;   // the policy recurs through its GRU (window:N compresses embeddings instead)
  bool grows;       // one segment for the whole run, its arena growing (full: teaching; CPU only, no checkpoint mid-run)
  bool ppo;         // PPO can learn with it (its replay from stored states)
  bool graphs;      // its segments may run as CUDA graphs (K steps that repeat)
  std::unique_ptr<HistoryRunner> (*make)(Context& c);
};

const HistoryDef& history_def(History::Kind kind);
// The forms of the histories `which` takes, as History::choices() lists them.
std::string history_choices(bool (*which)(const HistoryDef&));

// Reads a positive step count of `text` (an Error naming --history and `what` otherwise).
int64_t history_number(const std::string& v, const std::string& text, const char* what);

}  // namespace segtape::agent
