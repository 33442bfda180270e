// window:N: no recurrent state. A step's feature compresses the last N step
// embeddings (this step's and the N - 1 before it, kept as values in a ring:
// no gradient reaches an earlier step by construction); segments of K steps
// learn from their losses, and nothing is carried but the ring.
#include "history.h"

#include <array>

#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class Window : public HistoryRunner {
 public:
  explicit Window(Context& c) : HistoryRunner(c) {
    for (int64_t i = 0; i + 1 < c.config.history.window; ++i) ring_.push_back(c.tape->persistent({c.config.batch, c.config.embed}));
  }

  // The last N - 1 embeddings (detached values) and this step's, oldest
  // first; commit: this step's embedding takes the oldest one's place.
  Recurred recur(const Tensor& e, const Tensor& h, bool commit, std::span<const Tensor>) override {
    std::array<Tensor, 64> parts;
    const size_t n = ring_.size();
    for (size_t i = 0; i < n; ++i) parts[i] = ring_[(size_t(pos_) + i) % n];
    parts[n] = e;
    const Tensor f = c_.policy->compress(std::span<const Tensor>(parts.data(), n + 1));
    if (n && commit) {
      copy_into(ring_[size_t(pos_)], detach(e));
      pos_ = (pos_ + 1) % int64_t(n);
    }
    return {f, h};
  }
  bool carries_state() const override { return false; }

  Ran run(Steps& s, int64_t n) override {
    Segment seg = c_.tape->segment();
    return learn(s, n, seg);
  }
  Ran replay(Steps&, int64_t, int64_t) override {
    throw Error("--history window:N carries no state to replay from");
  }

  std::span<const Tensor> carried() const override { return ring_; }
  int64_t position() const override { return pos_; }
  void set_position(int64_t p) override { pos_ = p; }

 private:
  std::vector<Tensor> ring_;  // the last N - 1 embeddings [B, embed] (persistent)
  int64_t pos_ = 0;           // the oldest one's place
};

}  // namespace

extern const HistoryDef WindowHistory;
const HistoryDef WindowHistory{
    .kind = History::Kind::Window,
    .name = "window",
    .alias = nullptr,
    .syntax = "window:N",
    .help = "window:N (last N embeddings, no recurrence)",
    .parse = [](const std::string& s) {
      if (!s.starts_with("window:")) throw Error("unknown --history '" + s + "' (choose " + History::choices() + ")");
      return History{.kind = History::Kind::Window, .window = history_number(s.substr(7), s, "N")};
    },
    .str = [](const History& h) { return "window:" + std::to_string(h.window); },
    .validate = [](const TrainConfig& c) {
      if (c.history.window > 64) throw Error("--history window:N needs N <= 64");
    },
    .recurrent = false,
    .grows = false,
    .ppo = false,
    .graphs = false,
    .make = [](Context& c) -> std::unique_ptr<HistoryRunner> { return std::make_unique<Window>(c); },
};

}  // namespace segtape::agent
