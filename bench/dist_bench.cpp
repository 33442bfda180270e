// Data-parallel training, timed (docs/figures/dist-bench.sh runs it under
// mpirun -np 1 and -np 2 and writes docs/distributed.md's measured section).
//
//   dist_bench --batch B --hidden H [--segments N] [--warmup W] [--link]
//
// Every rank runs the agent's trainer (recall, tbptt:32, B streams of its
// own) for W untimed segments, then N timed ones; each segment's wall time is
// taken around Trainer::run_segment alone (the forward, backward, gradient
// all-reduce, clipping and Adam step). Rank 0 prints one JSON line: the
// per-segment times (median, min, max), the all-reduce's time and bytes per
// update (GradientAverager's own clock), the parameter count. --link also
// times bare all-reduces of 8 bytes and of 4 MiB (median of 50 and of 20),
// for the alpha-beta model of the link between the ranks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "segtape/agent/trainer.h"
#include "segtape/nn/dist.h"

using namespace segtape;
using clk = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json summary(const std::vector<double>& v) {
  return {{"median", median(v)}, {"min", *std::min_element(v.begin(), v.end())}, {"max", *std::max_element(v.begin(), v.end())}};
}

// Median wall time of `reps` in-place all-reduces of n floats.
double time_allreduce(dist::Communicator& c, size_t n, int reps) {
  std::vector<float> buf(n, 1.0f);
  std::vector<double> t;
  for (int i = 0; i < reps + 3; ++i) {
    c.allgather("", "barrier");
    const auto t0 = clk::now();
    c.allreduce_sum(buf.data(), n, "the link's all-reduce");
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    if (i >= 3) t.push_back(s);
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 32, hidden = 512, segments = 20, warmup = 3;
  bool link = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dist_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--batch") batch = next();
    else if (a == "--hidden") hidden = next();
    else if (a == "--segments") segments = next();
    else if (a == "--warmup") warmup = next();
    else if (a == "--link") link = true;
    else {
      std::fprintf(stderr, "dist_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    std::unique_ptr<dist::Communicator> comm = dist::launched_by_mpirun() ? dist::mpi({.timeout_s = 600}) : dist::local();
    agent::TrainConfig c;
    c.env = "recall";
    c.history = agent::History::parse("tbptt:32");
    c.batch = batch;
    c.hidden = hidden;
    c.steps = (warmup + segments) * 32;
    agent::Trainer tr(c, comm->size() > 1 ? comm.get() : nullptr);
    for (int64_t i = 0; i < warmup; ++i) tr.run_segment();
    const dist::AverageStats before = tr.dist_stats() ? *tr.dist_stats() : dist::AverageStats{};
    std::vector<double> seg;
    comm->allgather("", "barrier");
    for (int64_t i = 0; i < segments; ++i) {
      const auto t0 = clk::now();
      tr.run_segment();
      seg.push_back(std::chrono::duration<double>(clk::now() - t0).count());
    }
    nlohmann::json j = {{"ranks", comm->size()},
                        {"batch", batch},
                        {"hidden", hidden},
                        {"parameters", tr.policy().parameter_count()},
                        {"segment_steps", 32},
                        {"segments", segments},
                        {"segment_seconds", summary(seg)}};
    if (const dist::AverageStats* s = tr.dist_stats()) {
      const double calls = double(s->calls - before.calls);
      // Each rank's time inside average(): the rank that arrives first also
      // waits for the others to end their backward; the one that arrives
      // last waits for the transfer alone.
      const double mine = (s->seconds - before.seconds) / calls;
      double lo = mine, hi = mine;
      for (const std::string& b : comm->allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine), "times")) {
        double v = 0;
        std::memcpy(&v, b.data(), sizeof v);
        lo = std::min(lo, v), hi = std::max(hi, v);
      }
      j["allreduce_seconds_per_update"] = hi;
      j["allreduce_seconds_per_update_last_rank"] = lo;
      j["allreduce_bytes_per_update"] = (s->bytes - before.bytes) / calls;
      j["allreduce_calls_per_update"] = double(s->collectives - before.collectives) / calls;
    }
    if (link && comm->size() > 1) {
      const size_t big = size_t(1) << 20;  // floats: 4 MiB
      j["link"] = {{"allreduce_8B_seconds", time_allreduce(*comm, 2, 50)},
                   {"allreduce_4MiB_seconds", time_allreduce(*comm, big, 20)},
                   {"big_bytes", double(big * sizeof(float))}};
    }
    if (comm->rank() == 0) std::printf("%s\n", j.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
