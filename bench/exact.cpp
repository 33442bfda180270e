// Exact BPTT by segment replay against full-graph BPTT and truncated BPTT
// (docs/benchmarks.md, "Exact BPTT against full BPTT and LibTorch"). One window of T steps is one update's
// gradients (no optimizer step, for every variant alike) of GRUCell(I = 32, H)
// -> Linear(H, 16) -> cross-entropy at every step, summed over the window,
// float32, one thread:
//   segtape full         one segment of T steps, one backward
//   segtape tbptt:K      segments of K steps, the state carried, a backward per segment
//   segtape exact:K      replay::Driver, uniform schedule (a state at every boundary)
//   segtape exact:K bin  replay::Driver, binomial schedule with `snapshots` stored states
//   LibTorch full        torch::nn::GRUCell + Linear, the per-step losses summed, one backward()
// Every variant starts each window from the same state, with the same weights
// (LibTorch's copied from segtape's) and the same data: x_t [B, 32] floats and
// y_t [B] class indices drawn once, held in memory for the whole run and read
// by step index (the exact variants' steps are a function of t, so the driver
// records no inputs).
//
// Three passes, in this order:
//   1. check (untimed): every variant's gradients against segtape full's
//      (relative error per parameter tensor, ||a - b|| / ||b||, the largest);
//      exits 1 if exact:K or its binomial schedule is off by more than 1e-5
//      (or LibTorch by more than 1e-4);
//   2. time: one warm-up window per variant, then `runs` rounds of one window
//      per variant, interleaved (full, tbptt, exact, binomial, LibTorch, full,
//      ...); nothing but the window inside the timer;
//   3. memory (untimed): segtape's tape statistics (the largest segment's arena
//      high-water + its node bytes + the states the variant holds besides),
//      LibTorch's allocator peak during a window above what was live at its
//      start, counted by agent/torch_memory.h's allocator, installed only now.
//
//   build/bench/exact_bench [--runs 5] [--steps 1000] [--batch 32] [--hidden 128] [--k 32] [--snapshots 10] [--json FILE]
#include <cblas.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "segtape/nn.h"
#include "segtape/replay.h"
#include "workload_data.h"
#ifdef SEGTAPE_BENCH_TORCH
#include <torch/torch.h>

#include "torch_memory.h"
#endif

using namespace segtape;
using Json = nlohmann::ordered_json;

namespace {

using bench::kC;  // classes and input features, the workload's
using bench::kI;

struct Config {
  int64_t runs = 5, T = 1000, B = 32, H = 128, K = 32, snapshots = 10;
  std::string json;
};

// The window's data, drawn once: x [T, B, I], y [T, B], the start state h0 [B, H].
struct Data {
  int64_t T, B, H;
  std::vector<float> x, h0;
  std::vector<int64_t> y;
  Data(int64_t t, int64_t b, int64_t h) : T(t), B(b), H(h), x(size_t(t * b * kI)), h0(size_t(b * h)), y(size_t(t * b)) {
    nn::Rng rng(11);
    for (float& v : x) v = float(rng.uniform(-1, 1));
    for (float& v : h0) v = float(rng.uniform(-1, 1));
    for (int64_t& v : y) v = int64_t(rng.next_u64() % uint64_t(kC));
  }
  std::span<const float> xt(int64_t t) const { return std::span<const float>(x).subspan(size_t(t * B * kI), size_t(B * kI)); }
  std::span<const int64_t> yt(int64_t t) const { return std::span<const int64_t>(y).subspan(size_t(t * B), size_t(B)); }
};

// A generous bound on one step's segment bytes (the K = 32 segment measures
// ~90 KB per step at B = 32, H = 128): the arena is reserved, not touched,
// so a full-BPTT budget of T of these costs address space only.
size_t step_bound(int64_t B, int64_t H) { return sizeof(float) * size_t(B * (kI + 16 * H + 4 * kC)) + (size_t(16) << 10); }

// segtape's model; each variant has its own tape (its own arena and node
// array), and the same weights: every model draws them from Rng(1) in the same order.
struct Model {
  Tape tape;
  nn::Rng rng{1};
  nn::GRUCell cell;
  nn::Linear head;
  Tensor h0;  // [B, H] persistent: every window starts here
  const Data& d;
  Model(const Data& data, size_t budget)
      : tape(Device::cpu(), {.segment_budget = budget}),
        cell(tape, rng, kI, data.H),
        head(tape, rng, data.H, kC),
        h0(tape.persistent({data.B, data.H})),
        d(data) {
    h0.from_host(std::span<const float>(data.h0));
  }
  std::vector<Tensor> params() const { return {cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh, head.weight, head.bias}; }
  Tensor advance(const Tensor& h, int64_t t) { return cell(tape.from(d.xt(t), {d.B, kI}), h); }
  replay::StepResult step(const Tensor& h, int64_t t) {
    Tensor h1 = advance(h, t);
    return {h1, cross_entropy(head(h1), tape.from(d.yt(t), {d.B}))};
  }
};

// What a variant holds for its window, in bytes (the memory pass fills it).
struct Memory {
  size_t arena = 0;      // the largest segment's arena high-water
  size_t nodes = 0;      // the largest segment's tape-node bytes (counted in the budget, outside the arena)
  size_t states = 0;     // states held besides: the carried state (tbptt), the driver's stored states (exact)
  size_t workspace = 0;  // the tape's reused workspace: GRU weight-gradient batches, packed weights (outside the budget; reported apart)
  size_t total() const { return arena + nodes + states; }
};

void note(Memory* mem, const TapeStats& s) {
  if (!mem) return;
  mem->arena = std::max(mem->arena, s.last_segment_peak);
  mem->nodes = std::max(mem->nodes, s.node_peak_bytes);
  mem->states = std::max(mem->states, s.carry_bytes);
  mem->workspace = std::max(mem->workspace, s.workspace_bytes);
}

// Steps [a, b) from h in the open segment: the state after them and their summed loss.
std::pair<Tensor, Tensor> unroll(Model& m, Tensor h, int64_t a, int64_t b) {
  Tensor loss;
  for (int64_t t = a; t < b; ++t, m.tape.next_step()) {
    replay::StepResult s = m.step(h, t);
    h = s.state;
    loss = t > a ? add(loss, s.loss) : s.loss;
  }
  return {h, loss};
}

// Full BPTT: the window in one segment, one backward. Returns the window's loss.
double full_window(Model& m, Memory* mem) {
  double value = 0;
  {
    Segment seg = m.tape.segment();
    auto [h, loss] = unroll(m, m.h0, 0, m.d.T);
    value = loss.item();
    seg.backward(loss);
  }
  note(mem, m.tape.stats());
  return value;
}

// Truncated BPTT: segments of K steps, a backward each, the state carried.
double tbptt_window(Model& m, int64_t K, Memory* mem) {
  double value = 0;
  Tensor h = m.h0;
  for (int64_t a = 0; a < m.d.T; a += K) {
    {
      Segment seg = m.tape.segment();
      auto [h1, loss] = unroll(m, h, a, std::min(m.d.T, a + K));
      value += loss.item();
      seg.backward(loss);
      h = seg.carry(h1);
    }
    note(mem, m.tape.stats());
  }
  return value;
}

// Exact BPTT by segment replay: the driver's window.
struct Exact {
  std::unique_ptr<Model> m;
  replay::Driver drv;
  replay::StepFn step;
  Exact(std::unique_ptr<Model> model, const replay::Options& o)
      : m(std::move(model)), drv(m->tape, m->h0, o), step([mp = m.get()](Tape&, int64_t t, const Tensor& h, replay::Inputs& in) {
          // The driver ignores the forward pass's losses (segtape/replay.h):
          // the head and the loss run only while replaying.
          return in.replaying() ? mp->step(h, t) : replay::StepResult{mp->advance(h, t), Tensor{}};
        }) {}
  replay::Report window() { return drv.run(step, m->h0); }
};

std::vector<std::vector<float>> grads_of(const Model& m) {
  std::vector<std::vector<float>> g;
  for (const Tensor& p : m.params()) g.push_back(p.grad_tensor().to_host<float>());
  return g;
}

// The largest relative error over the parameter tensors: ||a - b|| / ||b||.
double max_rel(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = 0, n = 0;
    for (size_t j = 0; j < a[i].size(); ++j) {
      const double x = a[i][j], y = b[i][j];
      d += (x - y) * (x - y), n += y * y;
    }
    worst = std::max(worst, std::sqrt(d) / std::max(std::sqrt(n), 1e-30));
  }
  return worst;
}

#ifdef SEGTAPE_BENCH_TORCH
// The same model in LibTorch, written as a PyTorch user writes it, with segtape's weights.
struct TorchModel {
  torch::nn::GRUCell cell;
  torch::nn::Linear head;
  torch::Tensor x, y, h0;  // [T, B, I], [T, B], [B, H]
  int64_t T;
  TorchModel(const Data& d, const Model& from)
      : cell(kI, d.H),
        head(d.H, kC),
        x(torch::from_blob(const_cast<float*>(d.x.data()), {d.T, d.B, kI}, torch::kFloat).clone()),
        y(torch::from_blob(const_cast<int64_t*>(d.y.data()), {d.T, d.B}, torch::kLong).clone()),
        h0(torch::from_blob(const_cast<float*>(d.h0.data()), {d.B, d.H}, torch::kFloat).clone()),
        T(d.T) {
    torch::NoGradGuard ng;
    const std::vector<Tensor> ours = from.params();
    const std::vector<torch::Tensor> theirs = params();
    for (size_t i = 0; i < ours.size(); ++i) {
      std::vector<float> v = ours[i].to_host<float>();
      theirs[i].copy_(torch::from_blob(v.data(), theirs[i].sizes(), torch::kFloat));
    }
  }
  std::vector<torch::Tensor> params() const {
    return {cell->weight_ih, cell->weight_hh, cell->bias_ih, cell->bias_hh, head->weight, head->bias};
  }
  double window() {
    torch::Tensor h = h0, loss;
    for (int64_t t = 0; t < T; ++t) {
      h = cell(x[t], h);
      torch::Tensor l = torch::nn::functional::cross_entropy(head(h), y[t]);
      loss = t ? loss + l : l;
    }
    const double value = loss.item<double>();
    loss.backward();
    return value;
  }
  void zero_grad() {
    for (torch::Tensor& p : params())
      if (p.grad().defined()) p.mutable_grad().zero_();
  }
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> g;
    for (const torch::Tensor& p : params()) {
      const torch::Tensor c = p.grad().contiguous();
      g.emplace_back(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
    return g;
  }
};
#endif

struct Summary {
  double median = 0, min = 0, max = 0;
};
Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front(), s.max = v.back();
  return s;
}

std::string fmt_bytes(double b) {
  char s[32];
  if (b >= double(1 << 20)) std::snprintf(s, sizeof s, "%.2f MiB", b / double(1 << 20));
  else std::snprintf(s, sizeof s, "%.1f KiB", b / 1024);
  return s;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string trimmed(std::string s) {
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

int64_t positive(const char* flag, const std::string& v) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < 1) {
    std::fprintf(stderr, "exact_bench: %s must be >= 1, got %s\n", flag, v.c_str());
    std::exit(2);
  }
  return n;
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr,
                   "usage: exact_bench [--runs N] [--steps T] [--batch B] [--hidden H] [--k K] [--snapshots C] [--json FILE]\n");
      std::exit(2);
    }
    const std::string v = argv[++i];
    if (a == "--runs") c.runs = positive("--runs", v);
    else if (a == "--steps") c.T = positive("--steps", v);
    else if (a == "--batch") c.B = positive("--batch", v);
    else if (a == "--hidden") c.H = positive("--hidden", v);
    else if (a == "--k") c.K = positive("--k", v);
    else if (a == "--snapshots") c.snapshots = positive("--snapshots", v);
    else if (a == "--json") c.json = v;
    else {
      std::fprintf(stderr, "exact_bench: unknown flag %s\n", a.c_str());
      std::exit(2);
    }
  }
  return c;
}

struct Variant {
  Variant(std::string k, std::string n) : key(std::move(k)), name(std::move(n)) {}
  std::string key, name;
  std::vector<double> us;  // µs per step, one per timed window
  Memory mem;
  bool memory_measured = false;
  std::string memory_method;
  double recompute = 1;
  int64_t steps_run = 0, stored_states = 0;
  double loss = 0;
};

int run(const Config& c) {
#ifdef SEGTAPE_BENCH_TORCH
  const bool torch_built = true;
  torch::set_num_threads(1);
#else
  const bool torch_built = false;
#endif
  openblas_set_num_threads(1);
  using Clock = std::chrono::steady_clock;

  const Data data(c.T, c.B, c.H);
  const size_t seg_budget = size_t(c.K) * step_bound(c.B, c.H) + (size_t(16) << 20);
  Model full(data, size_t(c.T) * step_bound(c.B, c.H) + (size_t(16) << 20));
  Model tbptt(data, seg_budget);
  Exact exact(std::make_unique<Model>(data, seg_budget), {.horizon = c.T, .k = c.K});
  Exact binomial(std::make_unique<Model>(data, seg_budget),
                 {.horizon = c.T, .k = c.K, .schedule = replay::Schedule::Binomial, .snapshots = c.snapshots});
#ifdef SEGTAPE_BENCH_TORCH
  TorchModel lt(data, full);
#endif
  const std::string ks = std::to_string(c.K);
  std::vector<Variant> v = {
      {"segtape_full", "segtape full BPTT (one segment of " + std::to_string(c.T) + " steps)"},
      {"segtape_tbptt", "segtape tbptt:" + ks},
      {"segtape_exact", "segtape exact:" + ks + " uniform"},
      {"segtape_exact_binomial", "segtape exact:" + ks + " binomial, " + std::to_string(c.snapshots) + " snapshots"},
      {"libtorch_full", "LibTorch full BPTT"},
  };
  enum { kFull, kTbptt, kExact, kBinomial, kTorch };
  const size_t variants = torch_built ? 5 : 4;
  // Variant i's gradients zeroed (before a window, outside any timer).
  auto zero = [&](size_t i) {
    switch (i) {
      case kFull: full.tape.zero_grad(); break;
      case kTbptt: tbptt.tape.zero_grad(); break;
      case kExact: exact.m->tape.zero_grad(); break;
      case kBinomial: binomial.m->tape.zero_grad(); break;
#ifdef SEGTAPE_BENCH_TORCH
      case kTorch: lt.zero_grad(); break;
#endif
      default: break;
    }
  };
  // One window of variant i; its loss. mem: filled by the memory pass (null otherwise).
  auto window = [&](size_t i, Memory* mem) -> double {
    switch (i) {
      case kFull: return full_window(full, mem);
      case kTbptt: return tbptt_window(tbptt, c.K, mem);
      case kExact: return exact.window().loss;
      case kBinomial: return binomial.window().loss;
#ifdef SEGTAPE_BENCH_TORCH
      case kTorch: return lt.window();
#endif
      default: return 0;
    }
  };

  std::printf("exact_bench: B = %lld, H = %lld, T = %lld, K = %lld, binomial snapshots = %lld, %lld runs; float32, 1 thread%s\n",
              (long long)c.B, (long long)c.H, (long long)c.T, (long long)c.K, (long long)c.snapshots, (long long)c.runs,
              torch_built ? "" : "; LibTorch not built: its columns are absent");

  // ---- 1. check: gradients against segtape full BPTT (untimed)
  for (size_t i = 0; i < variants; ++i) zero(i), v[i].loss = window(i, nullptr);
  const auto want = grads_of(full);
  const double rel_exact = max_rel(grads_of(*exact.m), want), rel_binomial = max_rel(grads_of(*binomial.m), want);
  const double rel_tbptt = max_rel(grads_of(tbptt), want);  // not equal by design: the truncation's effect
  std::optional<double> rel_torch;
#ifdef SEGTAPE_BENCH_TORCH
  rel_torch = max_rel(lt.grads(), want);
#endif
  constexpr double kTol = 1e-5, kTorchTol = 1e-4;
  std::printf("gradients vs segtape full (max over parameters of ||a - b|| / ||b||): exact:%s %.3g, binomial %.3g (tolerance %.0e)",
              ks.c_str(), rel_exact, rel_binomial, kTol);
  if (rel_torch) std::printf(", LibTorch %.3g (tolerance %.0e)", *rel_torch, kTorchTol);
  std::printf("; tbptt:%s differs by %.3g (truncation)\n", ks.c_str(), rel_tbptt);
  const bool grads_ok = rel_exact <= kTol && rel_binomial <= kTol && (!rel_torch || *rel_torch <= kTorchTol);

  // ---- 2. time: one warm-up window each, then interleaved rounds
  for (size_t i = 0; i < variants; ++i) zero(i), (void)window(i, nullptr);
  for (int64_t r = 0; r < c.runs; ++r)
    for (size_t i = 0; i < variants; ++i) {
      zero(i);
      const auto t0 = Clock::now();
      (void)window(i, nullptr);
      const auto t1 = Clock::now();
      v[i].us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / double(c.T));
    }

  // ---- 3. memory (untimed)
  const std::string tape_method =
      "tape statistics: the largest segment's arena high-water + its tape-node bytes + the states held besides";
  for (size_t i : {size_t(kFull), size_t(kTbptt)}) {
    zero(i);
    (void)window(i, &v[i].mem);
    v[i].memory_measured = true;
    v[i].memory_method = tape_method;
    v[i].steps_run = c.T;
  }
  for (auto [i, e] : {std::pair<size_t, Exact*>{kExact, &exact}, std::pair<size_t, Exact*>{kBinomial, &binomial}}) {
    zero(i);
    const replay::Report rep = e->window();
    v[i].mem = {.arena = rep.segment_peak, .nodes = rep.node_peak, .states = rep.state_bytes,
                .workspace = e->m->tape.stats().workspace_bytes};
    v[i].memory_measured = true;
    v[i].memory_method = tape_method + " (replay::Report: segment_peak + node_peak + state_bytes; input_bytes " +
                         std::to_string(rep.input_bytes) + ")";
    v[i].recompute = rep.recompute_factor;
    v[i].steps_run = rep.steps_run;
    v[i].stored_states = rep.stored_states;
  }
#ifdef SEGTAPE_BENCH_TORCH
  {
    const c10::Allocator* ours = &torch_memory::install();
    v[kTorch].steps_run = c.T;
    if (c10::GetCPUAllocator() == ours) {
      auto& s = torch_memory::CountingAllocator::stats();
      lt.zero_grad();
      const int64_t base = s.live.load();
      torch_memory::CountingAllocator::reset_peak();
      (void)lt.window();
      v[kTorch].mem.arena = size_t(s.peak.load() - base);
      v[kTorch].memory_measured = true;
      v[kTorch].memory_method =
          "allocator peak during the window above what was live at its start (agent/torch_memory.h's counting allocator: "
          "CPU tensor storage; autograd's graph nodes live on the C++ heap and are not counted)";
    } else {
      v[kTorch].memory_method = "not measured: the counting allocator could not be installed";
    }
  }
#endif

  // ---- report
  const double full_mem = double(v[kFull].mem.total());
  const double torch_mem = torch_built && v[kTorch].memory_measured ? double(v[kTorch].mem.total()) : 0;
  std::vector<Summary> sums;
  for (size_t i = 0; i < variants; ++i) sums.push_back(summarize(v[i].us));
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("\n%-48s %-28s %-12s %-10s %-12s %-9s %s\n", "variant", "us/step median [min-max]", "memory", "vs full",
              "vs LibTorch", "recompute", "states");
  for (size_t i = 0; i < variants; ++i) {
    char us[64], vf[32], vt[32] = "-", rc[32], st[32] = "-";
    std::snprintf(us, sizeof us, "%.1f [%.1f-%.1f]", sums[i].median, sums[i].min, sums[i].max);
    std::snprintf(vf, sizeof vf, "%.2f %%", 100 * ratio(double(v[i].mem.total()), full_mem));
    if (torch_mem > 0) std::snprintf(vt, sizeof vt, "%.2f %%", 100 * ratio(double(v[i].mem.total()), torch_mem));
    std::snprintf(rc, sizeof rc, "%.2f", v[i].recompute);
    if (v[i].stored_states) std::snprintf(st, sizeof st, "%lld", (long long)v[i].stored_states);
    std::printf("%-48s %-28s %-12s %-10s %-12s %-9s %s\n", v[i].name.c_str(), us, fmt_bytes(double(v[i].mem.total())).c_str(), vf, vt,
                rc, st);
  }
  if (!torch_built) std::printf("(LibTorch columns absent: this build has no LibTorch)\n");

  const double mem_vs_full = ratio(double(v[kExact].mem.total()), full_mem);
  const double mem_vs_torch = ratio(double(v[kExact].mem.total()), torch_mem);
  const double time_vs_tbptt = ratio(sums[kExact].median, sums[kTbptt].median);
  std::vector<double> paired;  // each round's exact / tbptt (the two ran back to back)
  for (size_t r = 0; r < v[kExact].us.size(); ++r) paired.push_back(v[kExact].us[r] / v[kTbptt].us[r]);
  const Summary pr = summarize(paired);
  std::printf("\nexact:%s memory / segtape full: %.2f %%", ks.c_str(), 100 * mem_vs_full);
  if (torch_mem > 0) std::printf(", / LibTorch full: %.2f %%", 100 * mem_vs_torch);
  std::printf(" (target <= 5 %%)\nexact:%s time per step / tbptt:%s: %.3fx (per round %.3f-%.3f) (target <= 1.4x)\n", ks.c_str(),
              ks.c_str(), time_vs_tbptt, pr.min, pr.max);
  // The tape's workspace (backward's GRU weight-gradient batching buffers,
  // the packed W_ih / W_hh): held by every segtape variant, outside the
  // segment budget, sized by the chunk and the weights, not by T.
  const double with_ws = double(v[kExact].mem.total() + v[kExact].mem.workspace);
  const double ws_vs_full = ratio(with_ws, double(v[kFull].mem.total() + v[kFull].mem.workspace));
  const double ws_vs_torch = ratio(with_ws, torch_mem);
  std::printf("with the tape's workspace counted (exact:%s %s, full %s): %.2f %% of segtape full", ks.c_str(),
              fmt_bytes(double(v[kExact].mem.workspace)).c_str(), fmt_bytes(double(v[kFull].mem.workspace)).c_str(),
              100 * ws_vs_full);
  if (torch_mem > 0) std::printf(", %.2f %% of LibTorch full", 100 * ws_vs_torch);
  std::printf("\n");
  std::printf("binomial (%lld snapshots): memory %s, %.2f %% of segtape full, recompute factor %.2f, time / tbptt %.3fx\n",
              (long long)c.snapshots, fmt_bytes(double(v[kBinomial].mem.total())).c_str(),
              100 * ratio(double(v[kBinomial].mem.total()), full_mem), v[kBinomial].recompute,
              ratio(sums[kBinomial].median, sums[kTbptt].median));

  if (!c.json.empty()) {
    utsname u{};
    uname(&u);
    Json j;
    j["config"] = {{"batch", c.B}, {"hidden", c.H}, {"steps", c.T}, {"k", c.K}, {"snapshots", c.snapshots}, {"runs", c.runs},
                   {"input", "float x_t of " + std::to_string(kI) + " features per step, read from a data set held in memory"},
                   {"classes", kC}, {"dtype", "float32"}, {"threads", 1},
                   {"update", "one window = one update's gradients (no optimizer step for any variant)"}};
    j["machine"] = {{"cpu", cpu_model()}, {"cores", sysconf(_SC_NPROCESSORS_ONLN)}, {"kernel", u.release},
                    {"openblas", trimmed(OPENBLAS_VERSION)},
#ifdef SEGTAPE_BENCH_TORCH
                    {"libtorch", TORCH_VERSION}
#else
                    {"libtorch", nullptr}
#endif
    };
    j["libtorch_built"] = torch_built;
    Json vs = Json::array();
    for (size_t i = 0; i < variants; ++i) {
      Json e = {{"key", v[i].key}, {"name", v[i].name},
                {"us_per_step", {{"median", sums[i].median}, {"min", sums[i].min}, {"max", sums[i].max},
                                 {"n", v[i].us.size()}, {"runs", v[i].us}}},
                {"memory_bytes", v[i].memory_measured ? Json(v[i].mem.total()) : Json(nullptr)},
                {"memory", {{"arena_peak_bytes", v[i].mem.arena}, {"node_peak_bytes", v[i].mem.nodes},
                            {"state_bytes", v[i].mem.states}, {"workspace_bytes", v[i].mem.workspace},
                            {"method", v[i].memory_method}}},
                {"memory_vs_segtape_full", ratio(double(v[i].mem.total()), full_mem)},
                {"memory_vs_libtorch_full", torch_mem > 0 ? Json(ratio(double(v[i].mem.total()), torch_mem)) : Json(nullptr)},
                {"time_vs_tbptt", ratio(sums[i].median, sums[kTbptt].median)},
                {"recompute_factor", v[i].recompute}, {"steps_run", v[i].steps_run},
                {"stored_states", v[i].stored_states}, {"window_loss", v[i].loss}};
      if (i == kTorch) e["memory"].erase("workspace_bytes");
      vs.push_back(e);
    }
    j["variants"] = vs;
    j["ratios"] = {{"exact_memory_vs_segtape_full", mem_vs_full},
                   {"exact_memory_vs_libtorch_full", torch_mem > 0 ? Json(mem_vs_torch) : Json(nullptr)},
                   {"exact_time_vs_tbptt", time_vs_tbptt},
                   {"exact_time_vs_tbptt_per_round", {{"median", pr.median}, {"min", pr.min}, {"max", pr.max}}},
                   {"binomial_memory_bytes", v[kBinomial].mem.total()},
                   {"binomial_memory_vs_segtape_full", ratio(double(v[kBinomial].mem.total()), full_mem)},
                   {"binomial_memory_vs_libtorch_full",
                    torch_mem > 0 ? Json(ratio(double(v[kBinomial].mem.total()), torch_mem)) : Json(nullptr)},
                   {"binomial_recompute_factor", v[kBinomial].recompute},
                   {"binomial_time_vs_tbptt", ratio(sums[kBinomial].median, sums[kTbptt].median)},
                   // The same with segtape's workspace added (LibTorch's figure unchanged).
                   {"exact_memory_with_workspace_vs_segtape_full", ws_vs_full},
                   {"exact_memory_with_workspace_vs_libtorch_full", torch_mem > 0 ? Json(ws_vs_torch) : Json(nullptr)}};
    j["grad_check"] = {{"metric", "max over parameter tensors of ||g - g_full|| / ||g_full||, against segtape full BPTT"},
                       {"exact", rel_exact}, {"binomial", rel_binomial},
                       {"libtorch", rel_torch ? Json(*rel_torch) : Json(nullptr)}, {"tbptt_truncation", rel_tbptt},
                       {"tolerance", kTol}, {"libtorch_tolerance", kTorchTol}, {"passed", grads_ok}};
    j["targets"] = {{"memory_at_most", 0.05}, {"time_at_most", 1.4},
                    {"memory_vs_segtape_full_met", mem_vs_full <= 0.05},
                    {"memory_vs_libtorch_full_met", torch_mem > 0 ? Json(mem_vs_torch <= 0.05) : Json(nullptr)},
                    {"time_met", time_vs_tbptt <= 1.4}};
    std::ofstream(c.json) << j.dump(2) << "\n";
    std::printf("wrote %s\n", c.json.c_str());
  }
  if (!grads_ok) {
    std::fprintf(stderr, "exact_bench: gradients differ from full BPTT beyond the tolerance: the benchmark measured the wrong thing\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {  // a budget report, a bad flag value: said plainly, not a terminate
    std::fprintf(stderr, "exact_bench: %s\n", e.what());
    return 1;
  }
}
