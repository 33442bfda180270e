// overlap:K/T/S: overlapping exact windows, Williams and Peng's BPTT(T; S)
// (1990). Every S steps an update, whose gradient is that of those S steps'
// losses through the last T steps (fewer at the run's start): one segment of
// full BPTT over the window, from the state at its start, with the weights
// as they are now. Each loss reaches back at least T - S steps, every loss
// counts in one update, and there are T / S times as many updates as
// exact:K/T makes. The cost: the window's T steps forward (its older steps
// again, from what they recorded) and replayed in reverse (segtape/replay.h,
// Driver::slide), 2 T step evaluations per S steps, in the memory of one
// K-step segment, the window's T / K boundary states (a ring) and the inputs
// its steps recorded. overlap:K/T is overlap:K/T/K; S and T are multiples of
// K, S <= T; overlap:K/T/T is exact:K/T.
//
// The ring is the history's own: a checkpoint does not hold it, so a resumed
// run starts its windows afresh at the step it resumes from (the first
// updates after it reach back fewer steps than an uninterrupted run's).
#include "history.h"

#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class Overlap : public HistoryRunner {
 public:
  using HistoryRunner::HistoryRunner;

  // Live: the driver slides over the run (its ring in the persistent pool,
  // like the state); replay (PPO): windows of the rollout from its stored states.
  void prepare(const Tensor& state, bool live) override {
    const History& h = c_.config.history;
    home_ = state;
    replay::Options o{.horizon = h.horizon, .k = h.k, .stride = live ? h.stride : 0};
    o.on_forward = [this](const Tensor& final_state) {
      if (!steps_ || !steps_->after_forward) return;
      const Segment seg = c_.tape->segment();  // (the hook's own: no segment is open there)
      (void)steps_->after_forward(final_state, first_, n_);  // (the losses are the replays')
    };
    driver_ = std::make_unique<replay::Driver>(*c_.tape, state, o);
  }

  Ran run(Steps& s, int64_t n) override {
    steps_ = &s, first_ = c_.step, n_ = n;
    offset_ = c_.step - driver_->position();  // (the driver counts its steps from where its history starts)
    const replay::Report rep = driver_->slide(step_, c_.h, n);
    steps_ = nullptr;
    if (s.update) s.update();
    copy_into(c_.h_home, driver_->final_state());
    c_.h = c_.h_home;
    c_.step += n;
    return ran(rep);
  }

  // PPO: the window of the last T steps ending at first + n, from the state
  // stored at its first segment, with the losses of [first, first + n).
  Ran replay(Steps& s, int64_t first, int64_t n) override {
    const History& h = c_.config.history;
    const int64_t end = first + n, start = std::max<int64_t>(0, end - h.horizon + h.k - 1) / h.k * h.k;
    steps_ = &s, first_ = first, n_ = n, offset_ = start;
    home_.from_host(s.state_at(start));
    const replay::Report rep = driver_->run(step_, home_, end - start, first - start);
    steps_ = nullptr;
    return ran(rep);
  }
  bool replays() const override { return true; }
  void loaded() override { driver_->reset(); }

 private:
  static Ran ran(const replay::Report& rep) {
    Ran r;
    r.loss = rep.loss, r.steps_run = rep.steps_run, r.segment_peak = rep.segment_peak, r.stored_bytes = rep.state_bytes;
    return r;
  }

  Tensor home_;  // the state the replayed windows start from (persistent)
  std::unique_ptr<replay::Driver> driver_;
  // The update being run: its steps, and where the driver's step 0 is in the run.
  Steps* steps_ = nullptr;
  int64_t first_ = 0, n_ = 0, offset_ = 0;
  const replay::StepFn step_ = [this](Tape& t, int64_t i, const Tensor& h, replay::Inputs& in) {
    return steps_->step(t, offset_ + i, h, in);
  };
};

History parse(const std::string& s) {
  if (!s.starts_with("overlap:")) throw Error("unknown --history '" + s + "' (choose " + History::choices() + ")");
  const std::string spec = s.substr(8);
  const size_t a = spec.find('/'), b = a == std::string::npos ? a : spec.find('/', a + 1);
  if (a == std::string::npos) throw Error("--history " + s + ": give overlap:K/T/S (or overlap:K/T, S = K)");
  History h{.kind = History::Kind::Overlap};
  h.k = history_number(spec.substr(0, a), s, "K");
  h.horizon = history_number(spec.substr(a + 1, b == std::string::npos ? b : b - a - 1), s, "T");
  h.stride = b == std::string::npos ? h.k : history_number(spec.substr(b + 1), s, "S");
  const auto n = [](int64_t v) { return std::to_string(v); };
  if (h.horizon % h.k != 0) throw Error("--history " + s + ": T = " + n(h.horizon) + " must be a multiple of K = " + n(h.k));
  if (h.stride % h.k != 0) throw Error("--history " + s + ": S = " + n(h.stride) + " must be a multiple of K = " + n(h.k));
  if (h.stride > h.horizon)
    throw Error("--history " + s + ": S = " + n(h.stride) + " is more than T = " + n(h.horizon) + " (an update learns from the last S "
                "steps through the last T; S <= T)");
  return h;
}

}  // namespace

extern const HistoryDef OverlapHistory;
const HistoryDef OverlapHistory{
    .kind = History::Kind::Overlap,
    .name = "overlap",
    .alias = nullptr,
    .syntax = "overlap:K/T/S",
    .help = "overlap:K/T/S (every S steps, the gradient of those steps' losses through the last T steps, by replay; S defaults to K)",
    .parse = parse,
    .str = [](const History& h) { return "overlap:" + std::to_string(h.k) + "/" + std::to_string(h.horizon) + "/" + std::to_string(h.stride); },
    .validate = nullptr,
    .recurrent = true,
    .grows = false,
    .ppo = true,
    .graphs = false,
    .make = [](Context& c) -> std::unique_ptr<HistoryRunner> { return std::make_unique<Overlap>(c); },
};

}  // namespace segtape::agent
