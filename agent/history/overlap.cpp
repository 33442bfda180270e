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

class Overlap : public ReplayingHistory {
 public:
  using ReplayingHistory::ReplayingHistory;

  // Live: the driver slides over the run; replay (PPO): windows of the
  // rollout from its stored states.
  void prepare(const Tensor& state, bool live) override { make_driver(state, live ? c_.config.history.stride : 0); }

  Ran run(Steps& s, int64_t n) override {
    running(&s, c_.step, n, c_.step - driver_->position());  // (the driver counts its steps from where its history starts)
    return learned(s, driver_->slide(step_, c_.h, n), n);
  }

  // PPO: the window of the last T steps ending at first + n, from the state
  // stored at its first segment, with the losses of [first, first + n).
  Ran replay(Steps& s, int64_t first, int64_t n) override {
    const History& h = c_.config.history;
    const int64_t end = first + n, start = std::max<int64_t>(0, end - h.horizon + h.k - 1) / h.k * h.k;
    running(&s, first, n, start);
    stored_state(s, start, home_);
    const replay::Report rep = driver_->run(step_, home_, end - start, first - start);
    running(nullptr, 0, 0, 0);
    return ran_of(rep);
  }
  void loaded() override { driver_->reset(); }
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
