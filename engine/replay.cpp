#include "segtape/replay.h"

#include <algorithm>
#include <limits>

#include "segtape/fnv.h"
#include "segtape/ops.h"

namespace segtape::replay {

// ---- Inputs

void Inputs::begin(int64_t step, bool first_time) {
  step_ = step;
  recording_ = first_time;
  cursor_ = 0;
  if (first_time) steps_[size_t(step)].clear();
}

void Inputs::end() {
  if (!recording_ && cursor_ != steps_[size_t(step_)].size())
    throw Error("exact BPTT: the step function is not reproducible: on a replay, step " + std::to_string(step_) + " took " +
                std::to_string(cursor_) + " bytes of inputs where it took " + std::to_string(steps_[size_t(step_)].size()) +
                " the first time (a step must take() the same inputs in the same order every time it runs)");
  recording_ = true;
}

void Inputs::mismatch(size_t n, size_t size) const {
  throw Error("exact BPTT: the step function is not reproducible: on a replay, step " + std::to_string(step_) +
              " asked for " + std::to_string(n) + " inputs of " + std::to_string(size) + " bytes beyond the " +
              std::to_string(steps_[size_t(step_)].size()) +
              " bytes it took the first time (a step must take() the same inputs in the same order every time it runs)");
}

void Inputs::too_many(size_t n, size_t size) const {
  throw Error("exact BPTT: step " + std::to_string(step_) + " asked take() for " + std::to_string(n) + " inputs of " +
              std::to_string(size) + " bytes: more than 1 TiB a step");
}

size_t Inputs::bytes() const {
  size_t b = 0;
  for (const auto& s : steps_) b += s.size();
  return b;
}

// ---- the schedule

namespace {
constexpr int64_t kMaxBinomialUnits = 4096;  // the optimal plan is an O(units^2 x snapshots) table
constexpr int64_t kMaxPlanWork = int64_t(1) << 30;  // ... of at most this many steps (about a second)
constexpr int64_t kMaxHorizon = 100'000'000;

// FNV-1a over a state's bytes: the first computation of each boundary state
// is remembered by its hash, every recomputation is checked against it.
uint64_t hash_bytes(std::span<const std::byte> b) { return fnv::bytes(b.data(), b.size()); }

using detail::Task;

// Walks the schedule: advance(u, from_slot, to_slot_or_-1_for_work) and
// reverse(u, from_slot or -1 for the work state). split(n, c): units to
// advance before storing the next snapshot (1 <= split < n).
template <class Split, class Advance, class Reverse>
void walk(int64_t units, int64_t snapshots, std::vector<Task>& stack, Split split, Advance advance, Reverse reverse) {
  stack.clear();
  stack.push_back({0, units, snapshots, 0});
  while (!stack.empty()) {
    Task t = stack.back();
    stack.pop_back();
    if (t.n == 1) {
      reverse(t.a, t.slot);
      continue;
    }
    if (t.c == 0) {  // no snapshot left: recompute from the held state for each unit, last first
      for (int64_t j = t.n - 1; j >= 1; --j) {
        for (int64_t i = 0; i < j; ++i) advance(t.a + i, i == 0 ? t.slot : -1, -1);
        reverse(t.a + j, -1);
      }
      reverse(t.a, t.slot);
      continue;
    }
    const int64_t m = split(t.n, t.c);
    for (int64_t i = 0; i < m; ++i) advance(t.a + i, i == 0 ? t.slot : t.slot + 1, t.slot + 1);
    stack.push_back({t.a, m, t.c, t.slot});                  // the left part, after
    stack.push_back({t.a + m, t.n - m, t.c - 1, t.slot + 1});  // the right part, first
  }
}
}  // namespace

Driver::Driver(Tape& tape, const Tensor& state, const Options& options) : tape_(tape), o_(options) {
  // (a step is recorded per step of the window: 2^40 steps ran the machine out of memory)
  if (o_.horizon < 1 || o_.horizon > kMaxHorizon)
    throw Error("exact BPTT: the horizon T must be in [1, " + std::to_string(kMaxHorizon) + "] steps, got " +
                std::to_string(o_.horizon));
  if (o_.k < 1) throw Error("exact BPTT: the segment length K must be >= 1 steps, got " + std::to_string(o_.k));
  state.check_live("exact BPTT (state)");
  if (state.tape != &tape) throw TapeError("exact BPTT: the state belongs to another tape");
  if (state.dtype == DType::I64) throw ShapeError("exact BPTT: the state must be floating point, got " + state.describe());
  units_ = units_of(o_.horizon);
  window_ = o_.horizon;
  int64_t snapshots = units_ - 1;  // uniform: every boundary
  if (o_.schedule == Schedule::Binomial) {
    if (o_.snapshots < 1)
      throw Error("exact BPTT: the binomial schedule needs >= 1 stored states (snapshots), got " + std::to_string(o_.snapshots));
    if (units_ > kMaxBinomialUnits)
      throw Error("exact BPTT: the binomial schedule plans at most " + std::to_string(kMaxBinomialUnits) +
                  " segments per window, T / K = " + std::to_string(units_) + ": raise K");
    snapshots = std::min(o_.snapshots, units_ - 1);
    if (units_ * units_ / 2 * snapshots > kMaxPlanWork)  // (4096 segments and 4095 snapshots planned for minutes)
      throw Error("exact BPTT: the binomial schedule's plan for " + std::to_string(units_) + " segments and " +
                  std::to_string(snapshots) + " snapshots is too large to compute (segments^2 / 2 x snapshots > 2^30): "
                  "give fewer snapshots (a few dozen reach near the uniform schedule's cost), or the uniform schedule");
    // cost[n][c]: units advanced to reverse n units with c snapshots (Griewank's
    // binomial optimum, found by its recurrence); split_ the first advance.
    const size_t C = size_t(snapshots) + 1, N = size_t(units_) + 1;
    std::vector<int64_t> cost(N * C, 0);
    split_.assign(N * C, 1);
    for (size_t n = 2; n < N; ++n) {
      cost[n * C] = int64_t(n * (n - 1) / 2);
      for (size_t c = 1; c < C; ++c) {
        int64_t best = std::numeric_limits<int64_t>::max(), arg = 1;
        for (size_t m = 1; m < n; ++m) {
          const int64_t v = int64_t(m) + cost[(n - m) * C + c - 1] + cost[m * C + c];
          if (v < best) best = v, arg = int64_t(m);
        }
        cost[n * C + c] = best;
        split_[n * C + c] = int32_t(arg);
      }
    }
  }
  o_.snapshots = snapshots;
  for (int64_t i = 0; i <= snapshots; ++i) slots_.push_back(tape.persistent(state.shape, state.dtype));
  final_ = tape.persistent(state.shape, state.dtype);
  dh_ = tape.persistent(state.shape, state.dtype);
  if (o_.schedule == Schedule::Binomial) work_ = tape.persistent(state.shape, state.dtype);
  inputs_.steps_.resize(size_t(o_.horizon));
  hash_.assign(size_t(units_) + 1, 0);
  known_.assign(size_t(units_) + 1, 0);
  ran_.assign(size_t(o_.horizon), 0);
  host_.resize(state.nbytes());
  stack_.reserve(size_t(units_) + 1);
}

int64_t Driver::split(int64_t n, int64_t c) const {
  if (o_.schedule == Schedule::Uniform) return 1;
  return split_[size_t(n) * size_t(o_.snapshots + 1) + size_t(c)];
}

void Driver::check_window(int64_t steps) const {
  if (steps < 1 || steps > o_.horizon)
    throw Error("exact BPTT: a window of " + std::to_string(steps) + " steps on a driver of horizon " +
                std::to_string(o_.horizon) + ": give 1 to " + std::to_string(o_.horizon) + " steps");
}

int64_t Driver::planned_steps(int64_t T) const {
  check_window(T);
  const int64_t units = units_of(T);
  int64_t steps = 0;
  std::vector<Task> stack;
  auto len = [&](int64_t u) { return unit(u, T).end - unit(u, T).begin; };
  walk(units, snapshots_for(units), stack, [&](int64_t n, int64_t c) { return split(n, c); },
       [&](int64_t u, int64_t, int64_t) { steps += len(u); },
       [&](int64_t u, int64_t) { steps += (u == units - 1 ? 2 : 1) * len(u); });
  return steps;
}

void Driver::check_state(int64_t boundary, const Tensor& h) {
  if (!o_.verify) return;
  h.to_host_bytes(host_);
  const uint64_t v = hash_bytes(host_);
  if (!known_[size_t(boundary)]) {
    hash_[size_t(boundary)] = v;
    known_[size_t(boundary)] = 1;
    return;
  }
  if (hash_[size_t(boundary)] != v) {
    const Unit un = unit(boundary - 1);
    throw Error("exact BPTT: the step function is not reproducible: replaying segment " + std::to_string(boundary - 1) +
                " (steps " + std::to_string(un.begin) + ".." + std::to_string(un.end - 1) + ") gave a state after step " +
                std::to_string(un.end - 1) + " that differs from the one computed there first (bit for bit). A step must be "
                "a function of its step index, its state and what it takes from Inputs (no other random draws, no "
                "state kept outside the tape)");
  }
}

void Driver::note_segment(Report& r, int64_t u, bool replay) const {
  const TapeStats s = tape_.stats();
  if (o_.on_segment) o_.on_segment(u, replay, s);
  r.segment_peak = std::max(r.segment_peak, s.last_segment_peak);
  r.node_peak = std::max(r.node_peak, s.node_peak_bytes);
}

void Driver::check_step(int64_t t, const StepResult& s) const {
  const Tensor& like = slots_[0];
  if (!s.state.defined()) throw Error("exact BPTT: step " + std::to_string(t) + " returned no state");
  if (!(s.state.shape == like.shape) || s.state.dtype != like.dtype)
    throw ShapeError("exact BPTT: step " + std::to_string(t) + " returned the state " + s.state.describe() +
                     ", not shaped like the driver's " + like.describe() + " (a step returns the next state of the one it is given)");
  if (s.loss.defined() && s.loss.numel() != 1)
    throw ShapeError("exact BPTT: step " + std::to_string(t) + " returned the loss " + s.loss.describe() +
                     "; a step's loss has one element (sum or average it)");
}

void Driver::advance(const StepFn& step, int64_t u, const Tensor& from, const Tensor& into, Report& r) {
  const Unit un = unit(u);
  {
    Segment seg = tape_.segment();
    NoGradGuard ng(tape_);
    Tensor h = from;
    for (int64_t t = un.begin; t < un.end; ++t, tape_.next_step()) {
      inputs_.begin(t, !ran_[size_t(t)]);
      const StepResult res = step(tape_, t, h, inputs_);
      check_step(t, res);
      h = res.state;
      inputs_.end();
      ran_[size_t(t)] = 1;
      ++r.steps_run;
    }
    check_state(u + 1, h);
    copy_into(into, h);
  }
  note_segment(r, u, false);
}

void Driver::reverse_unit(const StepFn& step, int64_t u, const Tensor& from, Report& r) {
  const Unit un = unit(u);
  {
    Segment seg = tape_.segment();
    const Tensor h_in = seg.input(from);
    Tensor h = h_in, loss;
    for (int64_t t = un.begin; t < un.end; ++t, tape_.next_step()) {
      inputs_.begin(t, !ran_[size_t(t)]);
      StepResult s = step(tape_, t, h, inputs_);
      inputs_.end();
      ran_[size_t(t)] = 1;
      ++r.steps_run;
      check_step(t, s);
      h = s.state;
      if (s.loss.defined()) loss = loss.defined() ? add(loss, s.loss) : s.loss;
    }
    check_state(u + 1, h);
    if (u + 1 == units_of(window_)) copy_into(final_, h);
    if (loss.defined()) r.loss += loss.item();
    // The state leaving this segment carries dL/dh from the segment after it
    // (none after the last), where h has history to carry it back through;
    // a state that left as it entered passes that gradient straight on.
    const bool through = h.node == h_in.node;
    const bool seeded = have_dh_ && !through && h.requires_grad && h.node >= 0;
    const Seed seed{h, dh_};
    if (loss.defined() || seeded) {
      seg.backward(loss.defined() ? &loss : nullptr, seeded ? std::span<const Seed>(&seed, 1) : std::span<const Seed>());
      Tensor g = seg.grad(h_in);
      if (through && have_dh_) g = add(g, dh_);
      copy_into(dh_, g);  // dL/d(state entering it), for the segment before
      have_dh_ = true;
    } else if (!(through && have_dh_)) {
      have_dh_ = false;  // nothing of the objective depends on the state entering this segment
    }
  }
  note_segment(r, u, true);
}

Report Driver::run(const StepFn& step, const Tensor& state) { return run(step, state, o_.horizon); }

Report Driver::run(const StepFn& step, const Tensor& state, int64_t steps) {
  // (from on_segment or on_forward, where no segment is open, a nested run
  // reset the outer window's records and stored states under it)
  if (running_) throw TapeError("exact BPTT: run() called while this driver runs (from its step, on_segment or on_forward)");
  if (tape_.segment_open())
    throw TapeError("exact BPTT: a segment is open; the driver opens its own segments (end yours first)");
  running_ = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{running_};
  state.check_live("exact BPTT (state)");
  if (!(state.shape == slots_[0].shape) || state.dtype != slots_[0].dtype)
    throw ShapeError("exact BPTT: state " + state.describe() + " is not shaped like the driver's " + slots_[0].describe());
  check_window(steps);
  window_ = steps;
  const int64_t units = units_of(steps);
  // A longer window's records past this one's end: dropped (capacity kept), so
  // input_bytes counts this window's.
  for (size_t t = size_t(steps); t < inputs_.steps_.size(); ++t) inputs_.steps_[t].clear();
  Report r;
  r.segments = units;
  r.stored_states = o_.snapshots + 1;
  const size_t states = slots_.size() + 2 + (work_.defined() ? 1 : 0);  // the slots, final_, dh_ and (binomial) work_ (all held)
  r.state_bytes = states * align_up(state.nbytes());
  copy_into(slots_[0], state);
  std::fill(known_.begin(), known_.end(), 0);
  std::fill(ran_.begin(), ran_.end(), 0);
  have_dh_ = false;
  check_state(0, slots_[0]);
  auto held = [&](int64_t slot) -> const Tensor& { return slot < 0 ? work_ : slots_[size_t(slot)]; };
  walk(
      units, snapshots_for(units), stack_, [&](int64_t n, int64_t c) { return split(n, c); },
      [&](int64_t u, int64_t from, int64_t into) { advance(step, u, held(from), held(into), r); },
      [&](int64_t u, int64_t from) {
        // The last segment is first run without a gradient too: every replay,
        // the first included, is then checked before its backward changes anything.
        if (u == units - 1) {
          advance(step, u, held(from), final_, r);
          if (o_.on_forward) o_.on_forward(final_);
        }
        reverse_unit(step, u, held(from), r);
      });
  r.recompute_factor = double(r.steps_run) / double(steps);
  r.input_bytes = inputs_.bytes();
  return r;
}

}  // namespace segtape::replay
