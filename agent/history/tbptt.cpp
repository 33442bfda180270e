// tbptt:K (detach is tbptt:1): each update is one segment of K steps; the
// state leaving it is carried (its value kept, its history cut). On a GPU,
// a segment whose steps' inputs are known before it runs and whose pattern
// repeats runs as one CUDA graph (docs/agent.md, "CUDA graphs").
#include "history.h"

#include "segtape/ops.h"

namespace segtape::agent {
namespace {

class Tbptt : public HistoryRunner {
 public:
  using HistoryRunner::HistoryRunner;

  Ran run(Steps& s, int64_t n) override {
    if (s.graph_key) return run_graph(s, n);
    Segment seg = c_.tape->segment();
    Ran r = learn(s, n, seg);
    c_.h = seg.carry(c_.h);  // the TBPTT boundary
    return r;
  }

  bool sequence(int64_t rows) const override {
    const TrainConfig& c = c_.config;
    return c.history.k > 1 && (gru_sequence_fused(*c_.tape, rows, c.hidden, DType::F32) || c.force_sequence);
  }

  void loaded() override {  // (the optimizer's count reaches the device at the next step, a call no graph holds: capture anew)
    if (!c_.graph) return;
    c_.tape->discard_graph();
    graph_key_ = last_key_ = 0;
  }

 private:
  // A segment as a CUDA graph: a pattern the graphs do not hold runs
  // eagerly; one that repeats (the same as the last segment's) replaces them.
  // A graph segment whose graph does not run (a replay whose calls differ
  // from its capture: an error inside the segment, or one raised by the
  // synchronize below) changed nothing on the device, but Adam's host count
  // moved: it is put back, and the graphs forgotten (the next segments
  // capture anew).
  Ran run_graph(Steps& s, int64_t n) {
    const uint64_t key = s.graph_key;
    if (key != graph_key_ && key == last_key_) {
      if (graph_key_) c_.tape->discard_graph();
      graph_key_ = key;
    }
    last_key_ = key;
    Ran r;
    r.graph = key == graph_key_ && n == c_.config.history.k;  // (a shorter segment is the run's last)
    const int64_t count0 = c_.optim->step_count();
    const TapeStats before = c_.tape->stats();
    try {
      Segment seg = r.graph ? c_.tape->segment() : c_.tape->eager_segment();
      const Tensor loss = s.record(r.graph);
      c_.step += n;
      if (loss.defined()) {
        seg.backward(loss);
        s.update();
      }
      c_.h = seg.carry(c_.h);  // the TBPTT boundary
      seg.end();               // (the graph runs here)
      const TapeStats after = c_.tape->stats();
      if (r.graph && after.graph_captures + after.graph_replays == before.graph_captures + before.graph_replays)
        c_.tape->synchronize();  // (its graph did not run: raises why, a replay that issued fewer calls than its capture)
    } catch (...) {
      if (r.graph) {
        c_.tape->discard_graph();
        graph_key_ = last_key_ = 0;
        c_.optim->set_step_count(count0);
      }
      throw;
    }
    return r;
  }

  uint64_t graph_key_ = 0, last_key_ = 0;  // the steps' pattern the graphs hold, and the last segment's
};

History parse(const std::string& s) {
  History h;
  if (s == "detach") h.k = 1;
  else if (s.starts_with("detach")) throw Error("unknown --history '" + s + "' (choose " + History::choices() + ")");
  else if (s != "tbptt") h.k = history_number(s.substr(s.find(':') + 1), s, "K");
  return h;
}

std::string str(const History& h) { return h.k == 1 ? "detach" : "tbptt:" + std::to_string(h.k); }

}  // namespace

extern const HistoryDef TbpttHistory;
const HistoryDef TbpttHistory{
    .kind = History::Kind::Tbptt,
    .name = "tbptt",
    .alias = "detach",
    .syntax = "tbptt:K, detach",
    .help = "tbptt:K (segments of K steps), detach (K=1)",
    .parse = parse,
    .str = str,
    .validate = nullptr,
    .recurrent = true,
    .grows = false,
    .ppo = true,
    .graphs = true,
    .make = [](Context& c) -> std::unique_ptr<HistoryRunner> { return std::make_unique<Tbptt>(c); },
};

}  // namespace segtape::agent
