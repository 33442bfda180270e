// Exact BPTT through a whole window in fixed memory, by segment replay.
//
// A recurrent step function is run over T steps. The forward pass keeps only
// the state at segment boundaries (every K steps); the backward pass walks
// the segments in reverse, replays each one's forward into the same arena
// with its gradient recorded, seeds it with dL/d(state leaving it) from the
// segment after it, and hands dL/d(state entering it) to the segment before
// (Segment::input / Segment::grad). The parameter gradients equal those of
// one T-step segment (full BPTT); memory is one K-step segment plus the
// stored states. docs/exact-bptt.md has the schedules and the measured cost.
//
//   replay::Driver bptt(tape, h0, {.horizon = T, .k = 32});
//   replay::Report r = bptt.run([&](Tape& t, int64_t step, const Tensor& h, replay::Inputs& in) {
//     auto x = in.take<float>(B * I, [&](std::span<float> v) { env.observe(v); });   // stored, replayed
//     Tensor h1 = gru(t.from(x, {B, I}), h);
//     return replay::StepResult{h1, cross_entropy(head(h1), ...)};
//   }, h0);
//   opt.step(); opt.zero_grad();                 // the gradients are the whole window's
//   h0 = bptt.final_state();                     // the state after T steps
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "segtape/tape.h"

namespace segtape::replay {

enum class Schedule : uint8_t {
  Uniform,   // a state stored every K steps: one forward pass, one replay (recompute factor 2)
  Binomial,  // `snapshots` stored states, placed by Griewank's optimal (revolve) schedule: more recompute
};

struct Options {
  int64_t horizon = 0;                    // T: steps per window (>= 1)
  int64_t k = 32;                         // steps per segment (>= 1)
  Schedule schedule = Schedule::Uniform;
  int64_t snapshots = 0;                  // Binomial: states stored besides the window's start (>= 1)
  bool verify = true;                     // check every recomputed boundary state bit for bit
  // verify's check where the state lives (a GPU: no read per segment): each
  // boundary's hash, and the first mismatch, stay on the tape's device
  // until check_replays() reads them, once, when the caller chooses; run()
  // and slide() then raise nothing for it themselves.
  bool verify_on_device = false;
  // false: no segment's loss is read to the host (Report::loss stays 0), for
  // a caller with figures of its own.
  bool read_loss = true;
  // > 0: overlapping windows (slide(); Williams and Peng's BPTT(T; S)): the
  // steps come S at a time, and each stride's losses get their gradient
  // through the last T steps. S and T multiples of K, S <= T; uniform schedule.
  int64_t stride = 0;
  // Called after each segment the window runs, with the unit (K-step block)
  // it ran, whether it recorded the gradient (a replay) or not (a forward
  // advance), and the tape's stats then (last_segment_peak: its high-water).
  std::function<void(int64_t unit, bool replay, const TapeStats&)> on_segment{};
  // Called once per window, when the forward pass has computed the state
  // after its last step and before any segment's backward, with that state. No
  // segment is open: the hook may open its own. For losses that need the
  // whole window first: actor-critic returns depend on the window's later
  // rewards and on the value of the state it ends in. Steps then compute
  // their loss only while Inputs::replaying() (the forward pass ignores it).
  std::function<void(const Tensor& final_state)> on_forward{};
};

// What the steps consumed from outside the tape — observations, actions,
// rewards, random draws — recorded the first time each step runs and served
// from the record on every replay, so the replay sees exactly the same. A
// step must take() the same counts in the same order every time it runs.
class Inputs {
 public:
  // Inputs of steps that run once, with no replay after them (a history that
  // records each step where it runs, agent/history/): take() hands out what
  // produce fills and keeps nothing, and every step's loss is wanted.
  static Inputs live() {
    Inputs in;
    in.live_ = true;
    return in;
  }
  // n values for this step: the first time the step runs, produce(span)
  // fills them and they are stored; on a replay the stored values come back
  // and produce is not called. The span lives until the next take().
  template <class T>
  std::span<const T> take(size_t n, const std::function<void(std::span<T>)>& produce) {
    if (n > (size_t(1) << 40) / sizeof(T)) too_many(n, sizeof(T));  // (n * sizeof(T) wrapped: a buffer too short for n)
    const size_t bytes = n * sizeof(T);
    if (live_) {
      scratch_.resize(std::max(scratch_.size(), (n + 1) * sizeof(T)));
      T* v = reinterpret_cast<T*>(scratch_.data());
      produce(std::span<T>(v, n));
      return {v, n};
    }
    std::vector<std::byte>& rec = steps_[size_t(slot_)];
    if (recording_) {
      const size_t at = rec.size();
      rec.resize(at + bytes);
      scratch_.resize(std::max(scratch_.size(), (n + 1) * sizeof(T)));
      T* v = reinterpret_cast<T*>(scratch_.data());
      produce(std::span<T>(v, n));
      std::memcpy(rec.data() + at, v, bytes);
      cursor_ = rec.size();
      return {v, n};
    }
    if (cursor_ + bytes > rec.size()) mismatch(n, sizeof(T));
    scratch_.resize(std::max(scratch_.size(), (n + 1) * sizeof(T)));
    T* v = reinterpret_cast<T*>(scratch_.data());
    std::memcpy(v, rec.data() + cursor_, bytes);
    cursor_ += bytes;
    return {v, n};
  }
  // true while a step runs again (its inputs come from the record).
  bool replaying() const { return !recording_; }
  // Whether this pass uses the step's loss: a live step's, and a replayed
  // one's (the driver's forward pass ignores losses: a step may leave its
  // loss out there and save the work), except, under overlapping windows,
  // a step an earlier stride has learned from.
  bool loss_wanted() const { return live_ || (!recording_ && wanted_); }
  size_t bytes() const;  // stored bytes of this window

 private:
  friend class Driver;
  // Step `step`'s inputs, kept at `slot` (its index in the record; -1: step).
  void begin(int64_t step, bool first_time, bool wanted = true, int64_t slot = -1);
  void end();
  // Every step's record holds at least the largest of steps [first, last)
  // without growing (overlapping windows: the ring sized by its first stride).
  void reserve_like(int64_t first, int64_t last);
  [[noreturn]] void mismatch(size_t n, size_t size) const;
  [[noreturn]] void too_many(size_t n, size_t size) const;
  std::vector<std::vector<std::byte>> steps_;  // per step: its inputs, in take() order (capacity kept across windows)
  std::vector<std::byte> scratch_;             // the values handed out (aligned for any T by std::vector's allocator)
  int64_t step_ = 0, slot_ = 0;                // the step running (messages name it) and where its inputs are
  size_t cursor_ = 0;
  bool recording_ = true;
  bool live_ = false;
  bool wanted_ = true;
};

// One step: the state leaving it, and its loss (one element; undefined for a
// step without one). Recorded as a step of a segment: ops on the tape.
struct StepResult {
  Tensor state;
  Tensor loss;
};
// (tape, step t in [0, T), the state entering step t, the window's inputs).
// It must be a function of t, the state and what it takes from `in`. The
// forward pass (in.replaying() false) uses the state only: a step may leave
// the loss out there and save its work (the agent's and exact_bench's do).
using StepFn = std::function<StepResult(Tape&, int64_t, const Tensor&, Inputs&)>;

struct Report {
  double loss = 0;               // sum of the window's step losses
  int64_t steps_run = 0;         // step evaluations in all: forward passes and replays
  double recompute_factor = 0;   // steps_run / the window's steps (full BPTT: 1; uniform: 2)
  int64_t segments = 0;          // segments the window is cut into (ceil(steps / K))
  // The driver's, whatever the window's length: what it holds for a window of
  // T steps (a shorter window runs on the same states, using fewer of them).
  int64_t stored_states = 0;     // boundary states, the window's start included
  size_t state_bytes = 0;        // the bytes of all the driver's states (persistent, aligned)
  size_t input_bytes = 0;        // the inputs recorded for the window (host)
  size_t segment_peak = 0;       // the largest arena high-water of the window's segments
  size_t node_peak = 0;          // the largest node bytes of the window's segments
};

namespace detail {
// One pending reversal of the schedule: units [a, a + n) with c free
// snapshots, the state at unit a held in slot `slot`.
struct Task {
  int64_t a, n, c, slot;
};
}  // namespace detail

class Driver {
 public:
  // Validates the options (a clear error before anything runs) and stores
  // the boundary states in persistent tensors shaped like `state`, made once.
  Driver(Tape& tape, const Tensor& state, const Options& options);

  // Runs one window of T steps from `state` (any live tensor; its value is
  // copied at once). Gradients accumulate (+=) into the parameters: exactly
  // those of one T-step segment. No segment may be open. On an error the
  // parameters are unchanged and their gradients partial (zero them).
  Report run(const StepFn& step, const Tensor& state);
  // The same for a shorter window of `steps` in [1, T] (a run's last,
  // partial one), on the states this driver holds: no new driver, no more
  // memory. Its segments are the first ceil(steps / K) of the window's.
  // losses_from: the steps before it are run for their states only (their
  // losses are not wanted: Inputs::loss_wanted), the gradient is of the
  // losses of the steps from it on.
  Report run(const StepFn& step, const Tensor& state, int64_t steps, int64_t losses_from = 0);

  // The state after the last window's steps (persistent, overwritten by the next run).
  const Tensor& final_state() const { return final_; }
  // Options::verify_on_device: reads the checks of the windows run since the
  // last call (one read) and throws the Error run() would have thrown at the
  // first recomputed state that differed, naming its segment; a no-op otherwise.
  void check_replays();
  const Options& options() const { return o_; }
  // Overlapping windows (Options::stride): the next `steps` (<= S) of the
  // run, with the gradient of their losses through the window of the last T
  // steps ending with them (fewer at the run's start, or after reset()): that
  // of one segment of full BPTT over the window, from the state at its start,
  // with the weights as they are now, whose loss is these steps'. The window
  // runs forward (its older steps again, from their records, the new ones for
  // the first time: their inputs and the states at its segment boundaries go
  // into a ring of the last T steps), then its segments are replayed in
  // reverse. The state at the window's start is the one the stride before
  // computed there; `state` is the state entering the first stride of a
  // history (later: the stride before's final state, which is checked).
  // Memory: one K-step segment, T / K states, T steps' inputs; T steps
  // forward and T replayed per stride.
  Report slide(const StepFn& step, const Tensor& state, int64_t steps);
  // The next slide() starts a new history: its window begins at its steps.
  void reset() { slid_ = base_ = 0; }
  // slide: the steps since the history started (the next slide's first step, as its steps count them).
  int64_t position() const { return (slid_ - base_) % o_.k ? 0 : slid_ - base_; }

  // Step evaluations a window costs under this schedule (T for the forward
  // pass plus every replay), without running it; of a window of `steps` in [1, T].
  int64_t planned_steps() const { return planned_steps(o_.horizon); }
  int64_t planned_steps(int64_t steps) const;

 private:
  struct Unit {
    int64_t begin, end;  // steps [begin, end)
  };
  Unit unit(int64_t u) const { return unit(u, window_); }
  Unit unit(int64_t u, int64_t steps) const { return {u * o_.k, std::min(steps, (u + 1) * o_.k)}; }  // of a window of `steps`
  int64_t units_of(int64_t steps) const { return (steps - 1) / o_.k + 1; }  // (steps + k - 1 overflowed for a K near 2^63)
  void check_window(int64_t steps) const;  // 1 <= steps <= T, else an Error
  int64_t snapshots_for(int64_t units) const { return std::min(o_.snapshots, units - 1); }
  // A segment of steps [begin, end) and the boundary after it (check_state's
  // index); its steps' inputs at `at` + (t - begin) (run: the window's own
  // indices; slide: the ring's); with their losses from step `wanted` on.
  struct Pass {
    Unit un;
    int64_t boundary, at, wanted = 0;
  };
  // Runs a segment from `from` with no gradient and copies the resulting
  // state into `into` (a stored state, or the work state).
  void advance(const StepFn& step, int64_t u, const Pass& p, const Tensor& from, const Tensor& into, Report& r);
  void advance(const StepFn& step, int64_t u, const Tensor& from, const Tensor& into, Report& r);
  // Replays a segment from `from` with its gradient recorded, seeded with
  // dh_ at its end, and leaves dL/d(state entering it) in dh_; `last`: its
  // state is the window's final one.
  void reverse_unit(const StepFn& step, int64_t u, const Pass& p, const Tensor& from, bool last, Report& r);
  void reverse_unit(const StepFn& step, int64_t u, const Tensor& from, Report& r);
  void enter(const Tensor& state, const char* call);  // refuses a window that cannot start
  int64_t split(int64_t n, int64_t c) const;  // units to advance before the next snapshot
  // Verifies, or remembers, the state at a boundary (the index of its hash),
  // named in a message by the segment `u` that computed it, steps `un`.
  void check_state(int64_t boundary, const Tensor& h, int64_t u, const Unit& un);
  [[noreturn]] static void not_reproducible(int64_t u, const Unit& un, const char* when);
  void forget(int64_t boundary);  // a boundary's remembered state (-1: every boundary's), for a new window
  void check_step(int64_t t, const StepResult& s) const;  // a state like the driver's; a one-element loss
  void note_segment(Report& r, int64_t u, bool replay) const;

  Tape& tape_;
  Options o_;
  int64_t units_ = 0;                 // segments of a full window (T steps)
  int64_t window_ = 0;                // steps of the window being run (T, or fewer)
  std::vector<Tensor> slots_;       // stored states (persistent): the window's start and the snapshots
  Tensor final_;                    // the state after T steps (persistent)
  Tensor dh_;                       // dL/d(state) at the boundary being reversed (persistent)
  bool have_dh_ = false;            // false: dh_ is zero (nothing after depends on the state)
  bool running_ = false;            // in run(): a hook or step that calls run() again is refused
  Tensor work_;                     // binomial with no snapshot left: the state being advanced
  std::vector<detail::Task> stack_;  // the schedule's pending reversals (capacity kept)
  Inputs inputs_;
  std::vector<uint64_t> hash_;      // per boundary: the hash of the state first computed there
  std::vector<uint8_t> known_;      // per boundary: hash_ is set
  std::vector<uint8_t> ran_;        // per step: it has run this window (its inputs are recorded)
  std::vector<std::byte> host_;     // a state's bytes on the host, for hashing
  Tensor checks_;                   // verify_on_device: the hashes and the first mismatch (replay_check.h)
  std::vector<int64_t> checks_host_;
  std::vector<int32_t> split_;      // binomial: the optimal first advance for (n units, c snapshots)
  int64_t base_ = 0, slid_ = 0;     // slide: where the ring's history starts, and the steps slid so far
  int64_t wanted_ = 0;              // run: the first step whose loss is wanted
  bool reserved_ = false;           // slide: the ring's records are sized
};

}  // namespace segtape::replay
