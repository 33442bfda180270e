#include "segtape/replay.h"

#include <algorithm>
#include <limits>

#include "replay_check.h"
#include "segtape/device_call.h"
#include "segtape/fnv.h"
#include "segtape/ops.h"

#ifdef SEGTAPE_HAVE_CUDA
namespace segtape::cuda {  // engine/cuda/replay_kernels.cu
void replay_check(void* stream, const uint32_t* words, int64_t n, int64_t* checks, int64_t nb, int64_t b, int64_t u, int64_t begin,
                  int64_t end);
void replay_forget(void* stream, int64_t* checks, int64_t nb, int64_t b);
}  // namespace segtape::cuda
#endif

namespace segtape::replay {
namespace {

// Options::verify_on_device's two device functions (replay_check.h): a
// boundary's check, {state} -> {checks}, ints {boundary, segment, begin,
// end, nb}; and forgetting boundaries, {} -> {checks}, ints {boundary (-1:
// all), nb}.
void check_host(const CallArgs& a) {
  const auto* w = a.at<const uint32_t>(0);
  const int64_t n = a.numel[0] * (a.i[5] / 4), nb = a.i[4];  // (the state's 32-bit words: i[5] its element's bytes)
  int64_t* checks = a.at<int64_t>(1);
  uint64_t sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += check::word_hash(uint64_t(i), w[i]);
  checks[2 * nb + 3] = int64_t(sum);
  check::settle(checks, nb, a.i[0], a.i[1], a.i[2], a.i[3]);
}
void forget_host(const CallArgs& a) { check::forget(a.at<int64_t>(0), a.i[1], a.i[0]); }
#ifdef SEGTAPE_HAVE_CUDA
void check_cuda(const CallArgs& a, void* stream) {
  cuda::replay_check(stream, a.at<const uint32_t>(0), a.numel[0] * (a.i[5] / 4), a.at<int64_t>(1), a.i[4], a.i[0], a.i[1], a.i[2], a.i[3]);
}
void forget_cuda(const CallArgs& a, void* stream) { cuda::replay_forget(stream, a.at<int64_t>(0), a.i[1], a.i[0]); }
const DeviceFunction kCheck{"exact BPTT: a boundary state's check", check_host, check_cuda};
const DeviceFunction kForget{"exact BPTT: a new window's checks", forget_host, forget_cuda};
#else
const DeviceFunction kCheck{"exact BPTT: a boundary state's check", check_host, nullptr};
const DeviceFunction kForget{"exact BPTT: a new window's checks", forget_host, nullptr};
#endif

}  // namespace

// ---- Inputs

void Inputs::begin(int64_t step, bool first_time, bool wanted, int64_t slot) {
  step_ = step;
  slot_ = slot < 0 ? step : slot;
  recording_ = first_time;
  wanted_ = wanted;
  cursor_ = 0;
  if (first_time) steps_[size_t(slot_)].clear();
}

void Inputs::end() {
  if (!recording_ && cursor_ != steps_[size_t(slot_)].size())
    throw Error("exact BPTT: the step function is not reproducible: on a replay, step " + std::to_string(step_) + " took " +
                std::to_string(cursor_) + " bytes of inputs where it took " + std::to_string(steps_[size_t(slot_)].size()) +
                " the first time (a step must take() the same inputs in the same order every time it runs)");
  recording_ = true;
  wanted_ = true;
}

void Inputs::mismatch(size_t n, size_t size) const {
  throw Error("exact BPTT: the step function is not reproducible: on a replay, step " + std::to_string(step_) +
              " asked for " + std::to_string(n) + " inputs of " + std::to_string(size) + " bytes beyond the " +
              std::to_string(steps_[size_t(slot_)].size()) +
              " bytes it took the first time (a step must take() the same inputs in the same order every time it runs)");
}

void Inputs::too_many(size_t n, size_t size) const {
  throw Error("exact BPTT: step " + std::to_string(step_) + " asked take() for " + std::to_string(n) + " inputs of " +
              std::to_string(size) + " bytes: more than 1 TiB a step");
}

void Inputs::reserve_like(int64_t first, int64_t last) {
  size_t most = 0;
  for (int64_t t = first; t < last; ++t) most = std::max(most, steps_[size_t(t)].size());
  for (auto& rec : steps_) rec.reserve(most);
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
  if (o_.stride != 0) {  // overlapping windows: a ring of the window's segments
    const std::string ks = " (K = " + std::to_string(o_.k) + ", T = " + std::to_string(o_.horizon) + ", S = " + std::to_string(o_.stride) + ")";
    if (o_.stride < 1 || o_.stride > o_.horizon || o_.stride % o_.k != 0 || o_.horizon % o_.k != 0)
      throw Error("exact BPTT: overlapping windows need a stride S in [K, T] and S and T multiples of K" + ks);
    if (o_.schedule != Schedule::Uniform) throw Error("exact BPTT: overlapping windows replay on the uniform schedule" + ks);
  }
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
  if (o_.verify && o_.verify_on_device) {
    checks_host_.assign(size_t(2 * (units_ + 1) + 4), 0);
    checks_ = tape.persistent({int64_t(checks_host_.size())}, DType::I64);
    checks_.from_host(std::span<const int64_t>(checks_host_));
  }
  ran_.assign(size_t(o_.horizon), 0);
  if (!checks_.defined()) host_.resize(state.nbytes());  // (the host check's copy of a state)
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

void Driver::check_state(int64_t boundary, const Tensor& h, int64_t u, const Unit& un) {
  if (!o_.verify) return;
  if (checks_.defined()) {  // (the state's element size, for its words: float32 1, float64 2)
    Tensor values = h;  // (its values only: the call reads them, records nothing)
    values.requires_grad = false;
    device_call(kCheck, {values}, {checks_}, {boundary, u, un.begin, un.end, units_ + 1, int64_t(dtype_size(h.dtype))});
    return;
  }
  h.to_host_bytes(host_);
  const uint64_t v = hash_bytes(host_);
  if (!known_[size_t(boundary)]) {
    hash_[size_t(boundary)] = v;
    known_[size_t(boundary)] = 1;
    return;
  }
  if (hash_[size_t(boundary)] != v) not_reproducible(u, un, "");
}

void Driver::not_reproducible(int64_t u, const Unit& un, const char* when) {
  throw Error("exact BPTT: the step function is not reproducible: replaying segment " + std::to_string(u) + " (steps " +
              std::to_string(un.begin) + ".." + std::to_string(un.end - 1) + ") gave a state after step " +
              std::to_string(un.end - 1) + " that differs from the one computed there first (" + when + "bit for bit). A step must be "
              "a function of its step index, its state and what it takes from Inputs (no other random draws, no "
              "state kept outside the tape)");
}

void Driver::check_replays() {
  if (!checks_.defined()) return;
  checks_.to_host(std::span<int64_t>(checks_host_));
  const size_t at = size_t(2 * (units_ + 1));
  if (checks_host_[at] == 0) return;
  const Unit un{checks_host_[at + 1], checks_host_[at + 2]};
  const int64_t u = checks_host_[at] - 2;
  checks_host_[at] = 0;  // (reported once)
  checks_.from_host(std::span<const int64_t>(checks_host_));
  not_reproducible(u, un, "found on the tape's device by check_replays(), after the windows it checked ran on; ");
}

void Driver::forget(int64_t boundary) {
  if (checks_.defined()) device_call(kForget, {}, {checks_}, {boundary, units_ + 1});
  else if (boundary < 0) std::fill(known_.begin(), known_.end(), 0);
  else known_[size_t(boundary)] = 0;
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
  advance(step, u, Pass{unit(u), u + 1, unit(u).begin}, from, into, r);
}

void Driver::advance(const StepFn& step, int64_t u, const Pass& p, const Tensor& from, const Tensor& into, Report& r) {
  {
    Segment seg = tape_.segment();
    NoGradGuard ng(tape_);
    Tensor h = from;
    for (int64_t t = p.un.begin; t < p.un.end; ++t, tape_.next_step()) {
      const auto at = size_t(p.at + t - p.un.begin);
      inputs_.begin(t, !ran_[at], false, int64_t(at));  // (a forward pass uses no loss)
      const StepResult res = step(tape_, t, h, inputs_);
      check_step(t, res);
      h = res.state;
      inputs_.end();
      ran_[at] = 1;
      ++r.steps_run;
    }
    check_state(p.boundary, h, u, p.un);
    copy_into(into, h);
  }
  note_segment(r, u, false);
}

void Driver::reverse_unit(const StepFn& step, int64_t u, const Tensor& from, Report& r) {
  reverse_unit(step, u, Pass{unit(u), u + 1, unit(u).begin, wanted_}, from, u + 1 == units_of(window_), r);
}

void Driver::reverse_unit(const StepFn& step, int64_t u, const Pass& p, const Tensor& from, bool last, Report& r) {
  {
    Segment seg = tape_.segment();
    const Tensor h_in = seg.input(from);
    Tensor h = h_in, loss;
    for (int64_t t = p.un.begin; t < p.un.end; ++t, tape_.next_step()) {
      const auto at = size_t(p.at + t - p.un.begin);
      inputs_.begin(t, !ran_[at], t >= p.wanted, int64_t(at));
      StepResult s = step(tape_, t, h, inputs_);
      inputs_.end();
      ran_[at] = 1;
      ++r.steps_run;
      check_step(t, s);
      h = s.state;
      if (s.loss.defined() && t >= p.wanted) loss = loss.defined() ? add(loss, s.loss) : s.loss;  // (an unwanted one is dropped)
    }
    check_state(p.boundary, h, u, p.un);
    if (last) copy_into(final_, h);
    if (loss.defined() && o_.read_loss) r.loss += loss.item();
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

namespace {
// The driver is running while it lives (a run() or slide() from its own step or hooks is refused).
struct Running {
  bool& flag;
  explicit Running(bool& f) : flag(f) { flag = true; }
  ~Running() { flag = false; }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;
};
}  // namespace

// A window's preamble: no driver running (from on_segment or on_forward,
// where no segment is open, a nested run reset the outer window's records
// and stored states under it), no segment open, a state like the driver's.
void Driver::enter(const Tensor& state, const char* call) {
  if (running_) throw TapeError(std::string("exact BPTT: ") + call + " called while this driver runs (from its step, on_segment or on_forward)");
  if (tape_.segment_open())
    throw TapeError("exact BPTT: a segment is open; the driver opens its own segments (end yours first)");
  state.check_live("exact BPTT (state)");
  if (!(state.shape == slots_[0].shape) || state.dtype != slots_[0].dtype)
    throw ShapeError("exact BPTT: state " + state.describe() + " is not shaped like the driver's " + slots_[0].describe());
}

Report Driver::run(const StepFn& step, const Tensor& state, int64_t steps, int64_t losses_from) {
  enter(state, "run()");
  const Running busy(running_);
  check_window(steps);
  if (losses_from < 0 || losses_from >= steps)
    throw Error("exact BPTT: losses from step " + std::to_string(losses_from) + " of a window of " + std::to_string(steps) +
                " steps: give 0 to " + std::to_string(steps - 1));
  window_ = steps;
  wanted_ = losses_from;
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
  forget(-1);
  std::fill(ran_.begin(), ran_.end(), 0);
  have_dh_ = false;
  check_state(0, slots_[0], -1, {});
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

Report Driver::slide(const StepFn& step, const Tensor& state, int64_t steps) {
  if (o_.stride == 0) throw Error("exact BPTT: slide() runs overlapping windows: make the driver with Options::stride");
  enter(state, "slide()");
  const Running busy(running_);
  if (steps < 1 || steps > o_.stride)
    throw Error("exact BPTT: slide() runs 1 to S = " + std::to_string(o_.stride) + " steps, got " + std::to_string(steps));
  const int64_t K = o_.k, T = o_.horizon, R = units_;  // the ring: T / K segments' states, T steps' inputs
  if ((slid_ - base_) % K != 0) base_ = slid_;  // (a shorter stride ended inside a segment: a new history starts)
  // Steps counted from base_: the new ones [q, e); the window [w0, e), its
  // segments [a0, a1), the new steps' from an.
  const int64_t q = slid_ - base_, e = q + steps, w0 = std::max<int64_t>(0, e - T + K - 1) / K * K;
  const int64_t a0 = w0 / K, an = q / K, a1 = (e + K - 1) / K;
  Report r;
  r.segments = a1 - a0;
  r.stored_states = R;
  r.state_bytes = (slots_.size() + 2) * align_up(state.nbytes());  // the ring, final_ and dh_
  for (int64_t t = q; t < e; ++t) ran_[size_t(t % T)] = 0;
  const auto unit_of = [&](int64_t a) { return Unit{a * K, std::min(e, (a + 1) * K)}; };
  const auto after = [&](int64_t a) { return a + 1 == a1 ? R : (a + 1) % R; };  // the boundary after segment a (R: final_)
  const auto pass = [&](int64_t a) { return Pass{unit_of(a), after(a), unit_of(a).begin % T, q}; };
  // The window forward with the weights as they are now, from the state the
  // last stride computed at its start (a new history: from `state`): the
  // older steps again from their records, the new ones for the first time.
  if (a0 == an) copy_into(slots_[size_t(a0 % R)], state);
  for (int64_t a = a0; a < a1; ++a) {
    forget(after(a));  // (each boundary computed anew)
    advance(step, a, pass(a), slots_[size_t(a % R)], a + 1 == a1 ? final_ : slots_[size_t((a + 1) % R)], r);
  }
  if (!reserved_) {  // (the first stride: every step of the ring takes as many bytes as its steps did)
    inputs_.reserve_like(q % T, q % T + steps);
    reserved_ = true;
  }
  if (o_.on_forward) o_.on_forward(final_);
  have_dh_ = false;
  for (int64_t a = a1 - 1; a >= a0; --a) reverse_unit(step, a, pass(a), slots_[size_t(a % R)], a + 1 == a1, r);
  slid_ += steps;
  r.recompute_factor = double(r.steps_run) / double(steps);
  r.input_bytes = inputs_.bytes();
  return r;
}

}  // namespace segtape::replay
