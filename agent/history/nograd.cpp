// nograd-history: only the current step is differentiated. Each step's GRU
// reads the state as a value (detached), so a segment's gradient never
// crosses a step boundary; the state itself is carried as with tbptt.
#include "history.h"

#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class NoGradHistory : public HistoryRunner {
 public:
  using HistoryRunner::HistoryRunner;

  Recurred recur(const Tensor& e, const Tensor& h, bool, std::span<const Tensor> between) override {
    const Tensor h1 = c_.policy->recur(e, detach(h), between);
    return {c_.policy->output(h1), h1};
  }
  Ran run(Steps& s, int64_t n) override {
    Segment seg = c_.tape->segment();
    Ran r = learn(s, n, seg);
    c_.h = seg.carry(c_.h);
    return r;
  }
  Ran replay(Steps&, int64_t, int64_t) override {
    throw Error("--history nograd-history replays nothing");
  }
};

}  // namespace

extern const HistoryDef NoGradHistoryHistory;
const HistoryDef NoGradHistoryHistory{
    .kind = History::Kind::NoGradHistory,
    .name = "nograd-history",
    .alias = nullptr,
    .syntax = "nograd-history",
    .help = "nograd-history (1-step gradient, K-step updates)",
    .parse = [](const std::string& s) {
      if (s != "nograd-history") throw Error("unknown --history '" + s + "' (choose " + History::choices() + ")");
      return History{.kind = History::Kind::NoGradHistory};
    },
    .str = [](const History&) { return std::string("nograd-history"); },
    .validate = nullptr,
    .recurrent = true,
    .grows = false,
    .ppo = false,
    .graphs = false,
    .make = [](Context& c) -> std::unique_ptr<HistoryRunner> { return std::make_unique<NoGradHistory>(c); },
};

}  // namespace segtape::agent
