// exact:K/T: the exact gradient of every window of T steps, in the memory of
// one K-step segment and the window's boundary states (segtape/replay.h):
// a forward pass keeps the state every K steps, then the segments are
// replayed in reverse, each seeded with the gradient of the state leaving it.
// docs/exact-bptt.md.
#include "history.h"

#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class Exact : public HistoryRunner {
 public:
  using HistoryRunner::HistoryRunner;

  // Its boundary states live in the persistent pool, shaped like the state
  // the algorithm's passes run on (made once: a run's last, shorter window
  // runs on the same ones).
  void prepare(const Tensor& state, bool) override {
    const History& h = c_.config.history;
    home_ = state;
    driver_ = std::make_unique<replay::Driver>(*c_.tape, state, replay::Options{.horizon = h.horizon, .k = h.k, .on_forward = [this](const Tensor& final_state) {
      if (!after_forward_) return;
      const Segment seg = c_.tape->segment();  // (the hook's own: no segment is open there)
      (void)after_forward_(final_state);      // (the losses are the replays')
    }});
  }

  Ran run(Steps& s, int64_t n) override {
    const int64_t first = c_.step;
    after_forward_ = {};
    if (s.after_forward) after_forward_ = [&](const Tensor& final_state) { return s.after_forward(final_state, first, n); };
    const replay::Report rep = window(s, c_.h, first, n);
    if (s.update) s.update();
    copy_into(c_.h_home, driver_->final_state());
    c_.h = c_.h_home;
    c_.step += n;
    return ran(rep);
  }

  Ran replay(Steps& s, int64_t first, int64_t n) override {
    after_forward_ = {};
    home_.from_host(s.state_at(first));
    return ran(window(s, home_, first, n));
  }
  bool replays() const override { return true; }

 private:
  replay::Report window(Steps& s, const Tensor& h0, int64_t first, int64_t n) {
    return driver_->run([&](Tape& t, int64_t i, const Tensor& h, replay::Inputs& in) { return s.step(t, first + i, h, in); }, h0,
                        n);
  }
  static Ran ran(const replay::Report& rep) {
    Ran r;
    r.loss = rep.loss, r.steps_run = rep.steps_run, r.segment_peak = rep.segment_peak, r.stored_bytes = rep.state_bytes;
    return r;
  }

  Tensor home_;  // the state the windows start from (persistent)
  std::unique_ptr<replay::Driver> driver_;
  std::function<Tensor(const Tensor&)> after_forward_;  // the window being run's Steps::after_forward
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
