// exact:K/T: the exact gradient of every window of T steps, in the memory of
// one K-step segment and the window's boundary states (segtape/replay.h):
// a forward pass keeps the state every K steps, then the segments are
// replayed in reverse, each seeded with the gradient of the state leaving it.
// docs/exact-bptt.md.
#include "history.h"

#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class Exact : public ReplayingHistory {
 public:
  using ReplayingHistory::ReplayingHistory;

  void prepare(const Tensor& state, bool) override { make_driver(state, 0); }

  Ran run(Steps& s, int64_t n) override {
    running(&s, c_.step, n, c_.step);
    return learned(s, driver_->run(step_, c_.h, n), n);
  }

  Ran replay(Steps& s, int64_t first, int64_t n) override {
    running(&s, first, n, first);
    stored_state(s, first, home_);
    const replay::Report rep = driver_->run(step_, home_, n);
    running(nullptr, 0, 0, 0);
    return ran_of(rep);
  }
};

History parse(const std::string& s) {
  if (!s.starts_with("exact:")) throw Error("unknown --history '" + s + "' (choose " + History::choices() + ")");
  const std::string spec = s.substr(6);
  const size_t slash = spec.find('/');
  History h{.kind = History::Kind::Exact};
  h.k = history_number(spec.substr(0, slash), s, "K");
  h.horizon = slash == std::string::npos ? 8 * h.k : history_number(spec.substr(slash + 1), s, "T");
  // (the default T = 8K within T's range too: a checkpoint's exact:K/8K is read back through it)
  if (h.horizon > 1'000'000)
    throw Error("--history " + s + ": its window T = 8K = " + std::to_string(h.horizon) +
                " is more than 1000000 steps; give T in [1, 1000000] as exact:K/T");
  return h;
}

}  // namespace

extern const HistoryDef ExactHistory;
const HistoryDef ExactHistory{
    .kind = History::Kind::Exact,
    .name = "exact",
    .alias = nullptr,
    .syntax = "exact:K or exact:K/T",
    .help = "exact:K/T (the gradient of T-step windows in the memory of K-step segments, by replay; T defaults to 8K)",
    .parse = parse,
    .str = [](const History& h) { return "exact:" + std::to_string(h.k) + "/" + std::to_string(h.horizon); },
    .validate = [](const TrainConfig& c) {
      if (c.history.horizon < c.history.k)
        throw Error("--history " + c.history.str() + ": exact:K/T needs T >= K (a window holds at least one segment)");
    },
    .recurrent = true,
    .grows = false,
    .ppo = true,
    .graphs = false,
    .make = [](Context& c) -> std::unique_ptr<HistoryRunner> { return std::make_unique<Exact>(c); },
};

}  // namespace segtape::agent
