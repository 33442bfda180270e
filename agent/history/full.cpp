// full: the teaching policy. One segment for the whole run, its arena
// growing; every K steps an update backpropagates through all of the history
// recorded so far (retained, as PyTorch's retain_graph=True), reaching steps
// that read weights the updates since have changed (docs/agent.md, "Note on
// full"). It grows until the budget stops it: the OOM that truncation
// prevents, measured. CPU only; no checkpoint mid-run.
#include "history.h"

#include <optional>

namespace segtape::agent {
namespace {

class Full : public HistoryRunner {
 public:
  using HistoryRunner::HistoryRunner;

  Ran run(Steps& s, int64_t n) override {
    if (!seg_) seg_.emplace(c_.tape->segment());
    Ran r = learn(s, n, *seg_, {.retain_graph = true, .allow_overwritten = true});
    if (c_.step >= c_.config.steps) {  // keep the final state, then end the one segment
      c_.h = seg_->carry(c_.h);
      seg_.reset();
    }
    return r;
  }
  Ran replay(Steps&, int64_t, int64_t) override {
    throw Error("--history full keeps its run in one growing segment; it replays nothing");
  }

 private:
  std::optional<Segment> seg_;  // the one segment of the whole run
};

}  // namespace

extern const HistoryDef FullHistory;
const HistoryDef FullHistory{
    .kind = History::Kind::Full,
    .name = "full",
    .alias = nullptr,
    .syntax = "full",
    .help = "full (one growing segment; teaching)",
    .parse = [](const std::string& s) {
      if (s != "full") throw Error("unknown --history '" + s + "' (choose " + History::choices() + ")");
      return History{.kind = History::Kind::Full};
    },
    .str = [](const History&) { return std::string("full"); },
    .validate = nullptr,
    .recurrent = true,
    .grows = true,
    .ppo = false,
    .graphs = false,
    .make = [](Context& c) -> std::unique_ptr<HistoryRunner> { return std::make_unique<Full>(c); },
};

}  // namespace segtape::agent
