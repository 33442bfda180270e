// segtape vs LibTorch, side by side, on the workload of bench/workload.h, with
// two floors: the step's sgemm calls issued one step at a time (the per-step
// floor) and the step's GEMM FLOPs at the measured peak of sgemm on a large
// square product (the FLOP floor).
//
//   build/bench/compare [--rounds 3] [--repetitions 3] [--min-time 0.3] [--threads 1,2] [--filter REGEX] [--out docs/benchmarks.md]
//
// --filter is Google Benchmark's for the timing (names like segtape_train/32/512)
// and a std::regex searched in the same names for the memory pass; a filter
// using Google Benchmark's leading '-' (exclude) applies to the timing only.
//
// One source, three roles, so that no timed process carries instrumentation:
//   * the driver (compare): --rounds rounds; in each round, for each thread
//     count in random order, and in random order within it, one worker
//     process times segtape, LibTorch and the floors (Google Benchmark, its
//     repetitions interleaved at random) and one times LibTorch alone under
//     GLIBC_TUNABLES (glibc's malloc tuned, which a process reads only when it
//     starts). Then the memory passes, and segtape's time on each thread count
//     against the first, round by round.
//   * a worker (compare --worker): times only; no allocation hook, no
//     counting allocator. Prints one "time <benchmark> <us>" line per run.
//   * the memory pass (compare_memory, built from this file with
//     SEGTAPE_BENCH_MEMORY and tests/alloc_hook.cpp): segtape's segment
//     high-water, LibTorch's allocator peak (agent/torch_memory.h) and heap
//     allocations per step; nothing in it is timed.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>

#include "segtape/blas.h"
#include "workload.h"
#ifdef SEGTAPE_BENCH_MEMORY
#include "alloc_hook.h"
#endif
#ifdef SEGTAPE_BENCH_TORCH
#include <torch/torch.h>
#ifdef SEGTAPE_BENCH_MEMORY
#include "torch_memory.h"
#endif
#endif

using namespace segtape;
using namespace segtape::bench;

namespace {

struct Size {
  int64_t B, H;
};
const Size kSizes[] = {{1, 128}, {32, 128}, {32, 512}, {64, 1024}};
constexpr int64_t kPeakN = 2048;  // the square sgemm whose rate is the FLOP floor's peak
// LibTorch's best malloc settings on CPU (issue 18): no mmap for blocks under
// 64 MiB, no trimming below 1 GiB, so its per-step tensors are recycled from
// the heap instead of mapped and unmapped.
constexpr const char* kTunables = "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=1073741824";

std::string key_of(const std::string& name, int64_t B, int64_t H) {
  return name + "/" + std::to_string(B) + "/" + std::to_string(H);
}

// The GEMM FLOPs of one training step (the eight products of the per-step
// floor below): forward x W_ih^T, h W_hh^T, h W_out^T; backward dh = dgh W_hh
// + dlogits W_out; weight gradients of the three. Elementwise work (gates,
// cross-entropy, Adam) is not counted: it is memory-bound and small.
[[maybe_unused]] double step_flops(int64_t B, int64_t H) {
  const double b = double(B), h = double(H), g = 3 * h, i = double(kI), c = double(kC);
  const double forward = 2 * b * (g * i + g * h + c * h);
  const double input_grad = 2 * b * (h * g + h * c);
  const double weight_grad = 2 * b * (g * i + g * h + c * h);
  return forward + input_grad + weight_grad;
}

[[maybe_unused]] void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bm, int64_t ldb, float beta,
          float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(M), blasint(N), blasint(K), 1.0f,
              A, blasint(lda), Bm, blasint(ldb), beta, C, blasint(ldc));
}

#ifdef SEGTAPE_BENCH_TORCH
struct TorchModel {
  torch::nn::GRUCell cell;
  torch::nn::Linear head;
  torch::optim::Adam opt;
  torch::Tensor h, x, y;
  TorchModel(int64_t B, int64_t H, const Data& d)
      : cell(kI, H),
        head(H, kC),
        opt([&] {
          std::vector<torch::Tensor> p = cell->parameters();
          for (auto& q : head->parameters()) p.push_back(q);
          return p;
        }(),
            torch::optim::AdamOptions(1e-3)),
        h(torch::zeros({B, H})),
        x(torch::from_blob(const_cast<float*>(d.x.data()), {kK, B, kI}, torch::kFloat).clone()),
        y(torch::from_blob(const_cast<int64_t*>(d.y.data()), {kK, B}, torch::kLong).clone()) {}
  void train_segment() {
    torch::Tensor loss;
    for (int64_t t = 0; t < kK; ++t) {
      h = cell(x[t], h);
      torch::Tensor l = torch::nn::functional::cross_entropy(head(h), y[t]);
      loss = t ? loss + l : l;
    }
    opt.zero_grad();
    loss.backward();
    opt.step();
    h = h.detach();
  }
  void infer_segment() {
    torch::NoGradGuard ng;
    for (int64_t t = 0; t < kK; ++t) {
      h = cell(x[t], h);
      (void)head(h);
    }
  }
};
#endif

void set_threads(int threads) {
  openblas_set_num_threads(threads);
#ifdef SEGTAPE_BENCH_TORCH
  torch::set_num_threads(threads);
#endif
}

#ifdef SEGTAPE_BENCH_MEMORY
// ---- The memory pass: nothing here is timed. ----

template <class F>
double allocs_per_step(F&& segment) {
  segment();  // warm-up
  const uint64_t before = alloc_hook::count();
  alloc_hook::enable(true);
  segment();
  alloc_hook::enable(false);
  return double(alloc_hook::count() - before) / double(kK);
}

// "memory <benchmark> <peak bytes> <heap allocations per step> <saved bytes> <analytic bytes>"
const std::regex* g_wanted = nullptr;
bool wanted(const std::string& key) { return std::regex_search(key, *g_wanted); }

void print_memory(const std::string& key, double peak, double allocs, double saved = 0, double analytic = 0) {
  std::printf("memory %s %.17g %.17g %.17g %.17g\n", key.c_str(), peak, allocs, saved, analytic);
}

void segtape_memory(const std::string& name, int64_t B, int64_t H, bool train) {
  if (!wanted(key_of(name, B, H))) return;
  const Data data(B);
  SegtapeModel m(B, H, data);
  const double allocs = allocs_per_step([&] { train ? m.train_segment() : m.infer_segment(); });
  print_memory(key_of(name, B, H), double(m.tape.stats().last_segment_peak), allocs, train ? double(m.saved_bytes) : 0,
               train ? double(analytic_saved_bytes(B, H)) : 0);
}

#ifdef SEGTAPE_BENCH_TORCH
void torch_memory_pass(const std::string& name, int64_t B, int64_t H, bool train) {
  if (!wanted(key_of(name, B, H))) return;
  const Data data(B);
  TorchModel m(B, H, data);
  auto seg = [&] { train ? m.train_segment() : m.infer_segment(); };
  const double allocs = allocs_per_step(seg);
  auto& s = torch_memory::CountingAllocator::stats();
  const int64_t base = s.live.load();
  torch_memory::CountingAllocator::reset_peak();
  seg();
  print_memory(key_of(name, B, H), double(s.peak.load() - base), allocs);
}
#endif

// compare_memory [--threads N] [--filter REGEX]: the filter as compare's, on the same benchmark names.
int memory_main(int argc, char** argv) {
  int threads = 1;
  std::string filter = ".";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc || (a != "--threads" && a != "--filter")) {
      std::fprintf(stderr, "usage: compare_memory [--threads N] [--filter REGEX]\n");
      return 2;
    }
    if (a == "--threads") threads = std::max(1, std::atoi(argv[i + 1]));
    else filter = argv[i + 1];
  }
  std::regex re;
  try {
    re = std::regex(filter);
  } catch (const std::regex_error& e) {
    std::fprintf(stderr, "compare_memory: --filter '%s' is not a regular expression: %s\n", filter.c_str(), e.what());
    return 2;
  }
  g_wanted = &re;
  set_threads(threads);
#ifdef SEGTAPE_BENCH_TORCH
  // Installed before any LibTorch tensor exists, so every CPU tensor is counted.
  torch_memory::install();
#endif
  for (const Size& z : kSizes) {
    segtape_memory("segtape_train", z.B, z.H, true);
#ifdef SEGTAPE_BENCH_TORCH
    torch_memory_pass("libtorch_train", z.B, z.H, true);
#endif
  }
  segtape_memory("segtape_infer", 1, 128, false);
#ifdef SEGTAPE_BENCH_TORCH
  torch_memory_pass("libtorch_infer", 1, 128, false);
#endif
  return 0;
}

#else
// ---- The timed worker: no hook, no counting allocator. ----

void BM_segtape_train(benchmark::State& st) {
  const Data data(st.range(0));
  SegtapeModel m(st.range(0), st.range(1), data);
  m.train_segment();  // warm-up: the arena and the tape's workspaces reach their size
  for (auto _ : st) m.train_segment();
  st.SetItemsProcessed(st.iterations() * kK);
}

void BM_segtape_infer(benchmark::State& st) {
  const Data data(st.range(0));
  SegtapeModel m(st.range(0), st.range(1), data);
  m.infer_segment();
  for (auto _ : st) m.infer_segment();
  st.SetItemsProcessed(st.iterations() * kK);
}

// The per-step floor: the sgemm calls one training step needs, issued one
// step at a time on preallocated buffers reused every step (step_flops lists them).
void BM_floor_sgemm(benchmark::State& st) {
  const int64_t B = st.range(0), H = st.range(1), G = 3 * H;
  std::vector<float> x(size_t(B * kI), 0.1f), h(size_t(B * H), 0.1f), wih(size_t(G * kI), 0.01f), whh(size_t(G * H), 0.01f),
      wout(size_t(kC * H), 0.01f), gi(size_t(B * G)), gh(size_t(B * G)), lo(size_t(B * kC)), dh(size_t(B * H)),
      dwih(wih.size()), dwhh(whh.size()), dwout(wout.size());
  for (auto _ : st) {
    for (int64_t t = 0; t < kK; ++t) {
      gemm(false, true, B, G, kI, x.data(), kI, wih.data(), kI, 0, gi.data(), G);
      gemm(false, true, B, G, H, h.data(), H, whh.data(), H, 0, gh.data(), G);
      gemm(false, true, B, kC, H, h.data(), H, wout.data(), H, 0, lo.data(), kC);
      gemm(false, false, B, H, G, gh.data(), G, whh.data(), H, 0, dh.data(), H);
      gemm(false, false, B, H, kC, lo.data(), kC, wout.data(), H, 1, dh.data(), H);
      gemm(true, false, G, kI, B, gi.data(), G, x.data(), kI, 1, dwih.data(), kI);
      gemm(true, false, G, H, B, gh.data(), G, h.data(), H, 1, dwhh.data(), H);
      gemm(true, false, kC, H, B, lo.data(), kC, h.data(), H, 1, dwout.data(), H);
    }
    benchmark::DoNotOptimize(dwhh.data());
  }
  st.SetItemsProcessed(st.iterations() * kK);
}

// One square sgemm of side N: its rate is the peak the FLOP floor divides by.
void BM_sgemm_peak(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  gemm(false, false, n, n, n, a.data(), n, b.data(), n, 0, c.data(), n);  // warm-up: threads started, pages touched
  for (auto _ : st) {
    gemm(false, false, n, n, n, a.data(), n, b.data(), n, 0, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
}

#ifdef SEGTAPE_BENCH_TORCH
template <bool Train>
void BM_libtorch(benchmark::State& st) {
  const Data data(st.range(0));
  TorchModel m(st.range(0), st.range(1), data);
  auto seg = [&] { Train ? m.train_segment() : m.infer_segment(); };
  seg();  // warm-up, as for segtape
  for (auto _ : st) seg();
  st.SetItemsProcessed(st.iterations() * kK);
}
#endif

// Prints each repetition's time: "time <benchmark>/<args> <us per step>" on
// stdout (the driver reads it), a progress line on stderr.
class LineReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.iterations <= 0) continue;
      const std::string name = r.run_name.function_name + "/" + r.run_name.args;
      // The peak run is one product per iteration; every other run is K steps per iteration.
      const double per = name.rfind("sgemm_peak", 0) == 0 ? 1.0 : double(kK);
      const double us = r.real_accumulated_time * 1e6 / double(r.iterations) / per;
      std::printf("time %s %.6f\n", name.c_str(), us);
      std::fflush(stdout);
      std::fprintf(stderr, "  %-28s %12.1f us\n", name.c_str(), us);
    }
  }
};

int worker_main(int threads, int reps, double min_time, const std::string& filter, bool torch_only) {
  set_threads(threads);
  if (!torch_only) {
    for (const Size& z : kSizes) {
      benchmark::RegisterBenchmark("segtape_train", BM_segtape_train)->Args({z.B, z.H})->UseRealTime();
      benchmark::RegisterBenchmark("floor_sgemm", BM_floor_sgemm)->Args({z.B, z.H})->UseRealTime();
    }
    benchmark::RegisterBenchmark("segtape_infer", BM_segtape_infer)->Args({1, 128})->UseRealTime();
    benchmark::RegisterBenchmark("sgemm_peak", BM_sgemm_peak)->Args({kPeakN, 0})->UseRealTime();
  }
#ifdef SEGTAPE_BENCH_TORCH
  for (const Size& z : kSizes) benchmark::RegisterBenchmark("libtorch_train", BM_libtorch<true>)->Args({z.B, z.H})->UseRealTime();
  benchmark::RegisterBenchmark("libtorch_infer", BM_libtorch<false>)->Args({1, 128})->UseRealTime();
#endif
  std::string r = "--benchmark_repetitions=" + std::to_string(reps), m = "--benchmark_min_time=" + std::to_string(min_time);
  std::string il = "--benchmark_enable_random_interleaving=true", fl = "--benchmark_filter=" + filter;
  std::string prog = "compare";
  char* args[] = {prog.data(), r.data(), m.data(), il.data(), fl.data(), nullptr};
  int n = 5;
  benchmark::Initialize(&n, args);
  LineReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  return 0;
}

// ---- The driver. ----

struct Summary {
  double median = 0, lo = 0, hi = 0;
  size_t n = 0;
};
Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.lo = v.front(), s.hi = v.back(), s.n = v.size();
  return s;
}

std::string fmt_us(const Summary& s) {
  if (s.n == 0) return "–";
  char b[96];
  std::snprintf(b, sizeof b, "%.1f (%.1f–%.1f)", s.median, s.lo, s.hi);
  return b;
}
std::string fmt_ratio(double a, double b) {
  if (!(a > 0) || !(b > 0)) return "–";
  char s[32];
  std::snprintf(s, sizeof s, "%.2f×", a / b);
  return s;
}
std::string fmt_bytes(double b) {
  char s[32];
  if (b >= 1 << 20) std::snprintf(s, sizeof s, "%.2f MiB", b / (1 << 20));
  else std::snprintf(s, sizeof s, "%.1f KiB", b / 1024);
  return s;
}
std::string fmt_count(double v) {
  char s[32];
  std::snprintf(s, sizeof s, "%.4g", v);
  return s;
}

struct Memory {
  double peak = 0, allocs = 0, saved = 0, analytic = 0;
};

// One thread count's measurements.
struct Results {
  int threads = 1;
  std::map<std::string, std::vector<double>> us;        // benchmark -> every repetition of every round
  std::map<std::string, std::map<int, double>> by_round;  // benchmark -> round -> the median of its repetitions
  std::map<std::string, Memory> mem;
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string self_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, size_t(n));
  return p.substr(0, p.rfind('/'));
}

// Runs a child (a shell command line) and reads its "time"/"memory" lines;
// `rename_torch` renames its LibTorch benchmarks (the tuned-malloc worker's).
void run_child(const std::string& cmd, const std::string& rename_torch, Results& res) {
  std::fprintf(stderr, "compare: %s\n", cmd.c_str());
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    std::fprintf(stderr, "compare: could not start %s\n", cmd.c_str());
    std::exit(1);
  }
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::string kind, name;
    in >> kind >> name;
    if (kind == "time") {
      double us = 0;
      in >> us;
      if (!rename_torch.empty() && name.rfind("libtorch_", 0) == 0) name = rename_torch + name.substr(9);
      res.us[name].push_back(us);
    } else if (kind == "memory") {
      Memory m;
      in >> m.peak >> m.allocs >> m.saved >> m.analytic;
      res.mem[name] = m;
    }
  }
  const int status = pclose(p);
  if (status != 0) {
    std::fprintf(stderr, "compare: %s failed (%s %d)\n", cmd.c_str(), WIFEXITED(status) ? "exit status" : "wait status",
                 WIFEXITED(status) ? WEXITSTATUS(status) : status);
    std::exit(1);
  }
}

std::string time_table(Results& r, bool torch) {
  std::ostringstream o;
  const Summary peak = summarize(r.us[key_of("sgemm_peak", kPeakN, 0)]);
  // The peak is the best repetition's rate (a peak is a best case); its median is shown beside it.
  const double n3 = 2.0 * double(kPeakN) * double(kPeakN) * double(kPeakN);
  const double peak_flops = peak.n ? n3 / (peak.lo * 1e-6) : 0, median_flops = peak.n ? n3 / (peak.median * 1e-6) : 0;
  o << "### " << r.threads << (r.threads == 1 ? " thread" : " threads") << "\n\n";
  char pk[256];
  std::snprintf(pk, sizeof pk,
                "Peak sgemm (%lld × %lld square, %d thread%s): %.1f GFLOP/s, the fastest of %zu repetitions "
                "(median %.1f GFLOP/s).\n\n",
                static_cast<long long>(kPeakN), static_cast<long long>(kPeakN), r.threads, r.threads == 1 ? "" : "s",
                peak_flops * 1e-9, peak.n, median_flops * 1e-9);
  o << pk;
  o << "| B, H | segtape µs/step | LibTorch µs/step | LibTorch, tuned malloc µs/step | faster LibTorch / segtape | "
       "per-step sgemm floor µs/step | segtape / per-step floor | FLOP floor µs/step | segtape / FLOP floor |\n";
  o << "|---|---|---|---|---|---|---|---|---|\n";
  auto row = [&](const std::string& label, const std::string& what, int64_t B, int64_t H, bool train) {
    const Summary s = summarize(r.us[key_of("segtape_" + what, B, H)]);
    const Summary t = summarize(r.us[key_of("libtorch_" + what, B, H)]);
    const Summary tt = summarize(r.us[key_of("libtorch_tuned_" + what, B, H)]);
    const Summary f = train ? summarize(r.us[key_of("floor_sgemm", B, H)]) : Summary{};
    double best = t.median;
    if (tt.n && (best <= 0 || tt.median < best)) best = tt.median;
    const double flop_floor = train && peak_flops > 0 ? step_flops(B, H) / peak_flops * 1e6 : 0;
    char ff[32] = "–";
    if (flop_floor > 0) std::snprintf(ff, sizeof ff, "%.1f", flop_floor);
    o << "| " << label << " | " << fmt_us(s) << " | " << (torch ? fmt_us(t) : "not built") << " | " << (torch ? fmt_us(tt) : "not built")
      << " | " << fmt_ratio(best, s.median) << " | " << fmt_us(f) << " | " << fmt_ratio(s.median, f.median) << " | " << ff << " | "
      << fmt_ratio(s.median, flop_floor) << " |\n";
  };
  for (const Size& z : kSizes) row(std::to_string(z.B) + ", " + std::to_string(z.H), "train", z.B, z.H, true);
  row("inference 1, 128", "infer", 1, 128, false);
  return o.str();
}

// segtape on each further thread count against the first (one thread), round
// by round: the ratio of the two rounds' medians, which ran minutes apart at
// most, then the median (min–max) of those ratios.
std::string threads_table(std::vector<Results>& all) {
  std::ostringstream o;
  const Results& base = all.front();
  o << "segtape's time per step on each thread count against " << base.threads << (base.threads == 1 ? " thread" : " threads")
    << ", round by round: each round's median on each, their ratio, then the median (min–max) of the ratios over the "
       "rounds:\n\n"
       "| B, H |";
  for (size_t i = 1; i < all.size(); ++i) o << " " << all[i].threads << " / " << base.threads << " threads |";
  o << "\n|---|";
  for (size_t i = 1; i < all.size(); ++i) o << "---|";
  o << "\n";
  auto row = [&](const std::string& label, const std::string& key) {
    o << "| " << label << " |";
    const auto b = base.by_round.find(key);
    for (size_t i = 1; i < all.size(); ++i) {
      const auto t = all[i].by_round.find(key);
      std::vector<double> r;
      if (b != base.by_round.end() && t != all[i].by_round.end())
        for (const auto& [round, us] : t->second)  // the rounds both thread counts measured, paired by round
          if (const auto one = b->second.find(round); one != b->second.end()) r.push_back(us / one->second);
      const Summary s = summarize(r);
      char c[96] = "–";
      if (s.n) std::snprintf(c, sizeof c, "%.3f (%.3f–%.3f)", s.median, s.lo, s.hi);
      o << " " << c << " |";
    }
    o << "\n";
  };
  for (const Size& z : kSizes) row(std::to_string(z.B) + ", " + std::to_string(z.H), key_of("segtape_train", z.B, z.H));
  row("inference 1, 128", key_of("segtape_infer", 1, 128));
  return o.str();
}

std::string memory_table(Results& r, bool torch, bool analytic) {
  std::ostringstream o;
  o << "Memory (" << r.threads << (r.threads == 1 ? " thread" : " threads")
    << "), from the separate untimed pass:\n\n"
       "| B, H | segtape segment peak | LibTorch allocator peak | heap allocs/step segtape | heap allocs/step LibTorch |\n"
       "|---|---|---|---|---|\n";
  auto row = [&](const std::string& label, const std::string& what, int64_t B, int64_t H) {
    const Memory& s = r.mem[key_of("segtape_" + what, B, H)];
    const Memory& t = r.mem[key_of("libtorch_" + what, B, H)];
    o << "| " << label << " | " << fmt_bytes(s.peak) << " | " << (torch ? fmt_bytes(t.peak) : "–") << " | " << fmt_count(s.allocs) << " | "
      << (torch ? fmt_count(t.allocs) : "–") << " |\n";
  };
  for (const Size& z : kSizes) row(std::to_string(z.B) + ", " + std::to_string(z.H), "train", z.B, z.H);
  row("inference 1, 128", "infer", 1, 128);
  if (!analytic) return o.str();
  o << "\nSegment memory of segtape's training step against the analytic minimum of what backward must keep "
       "(bench/workload.h: x, h, the four GRU gate vectors, logits, log-sum-exp and targets per step):\n\n"
    << "| B, H | analytic minimum | saved by forward | saved / minimum | segment peak (incl. backward's gradients) | peak / minimum |\n"
    << "|---|---|---|---|---|---|\n";
  for (const Size& z : kSizes) {
    const Memory& e = r.mem[key_of("segtape_train", z.B, z.H)];
    if (e.analytic <= 0) continue;
    o << "| " << z.B << ", " << z.H << " | " << fmt_bytes(e.analytic) << " | " << fmt_bytes(e.saved) << " | "
      << fmt_ratio(e.saved, e.analytic) << " | " << fmt_bytes(e.peak) << " | " << fmt_ratio(e.peak, e.analytic) << " |\n";
  }
  return o.str();
}

std::string trimmed(std::string s) {
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string machine() {
  std::string cpu = "unknown CPU";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  utsname u{};
  uname(&u);
  return cpu + ", " + std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores, Linux " + u.release;
}

// OpenBLAS's kernel set (segtape/blas.h), and OPENBLAS_CORETYPE when that chose it.
std::string blas_core() {
  std::string core = blas_kernels();
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE")) core += std::string(", OPENBLAS_CORETYPE=") + forced;
  return core;
}

// ", LibTorch x.y.z" when LibTorch was timed (a build without it has no TORCH_VERSION).
std::string torch_version(bool torch) {
#ifdef SEGTAPE_BENCH_TORCH
  if (torch) return std::string(", LibTorch ") + TORCH_VERSION;
#endif
  (void)torch;
  return {};
}

int usage() {
  std::fprintf(stderr,
               "usage: compare [--rounds N] [--repetitions N] [--min-time S] [--threads 1,2] [--filter REGEX] [--out FILE]\n");
  return 2;
}

#endif  // SEGTAPE_BENCH_MEMORY

}  // namespace

#ifdef SEGTAPE_BENCH_MEMORY
int main(int argc, char** argv) { return memory_main(argc, argv); }
#else
int main(int argc, char** argv) {
  int reps = 3, rounds = 3;
  double min_time = 0.3;
  bool worker = false, torch_only = false;
  std::string out, threads_arg = "1,2", filter = ".";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "compare: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](double lo) {
      const std::string v = next();
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(d >= lo)) {
        std::fprintf(stderr, "compare: %s takes a number >= %g, not '%s'\n", a.c_str(), lo, v.c_str());
        std::exit(2);
      }
      return d;
    };
    if (a == "--repetitions") reps = int(number(1));
    else if (a == "--rounds") rounds = int(number(1));
    else if (a == "--min-time") min_time = number(0.001);
    else if (a == "--out") out = next();
    else if (a == "--threads") threads_arg = next();
    else if (a == "--filter") filter = next();
    else if (a == "--worker") worker = true;
    else if (a == "--torch-only") torch_only = true;
    else return usage();
  }
#ifdef SEGTAPE_BENCH_TORCH
  const bool torch = true;
#else
  const bool torch = false;
#endif
  std::vector<int> thread_counts;
  {
    std::stringstream ts(threads_arg);
    for (std::string tok; std::getline(ts, tok, ',');) {
      const int t = std::atoi(tok.c_str());
      if (t < 1) {
        std::fprintf(stderr, "compare: --threads takes thread counts >= 1 separated by commas, not '%s'\n", threads_arg.c_str());
        return 2;
      }
      thread_counts.push_back(t);
    }
  }
  if (worker) return worker_main(thread_counts.empty() ? 1 : thread_counts.front(), reps, min_time, filter, torch_only);

  const std::string dir = self_dir(), self = shell_quote(dir + "/compare"), memory = dir + "/compare_memory";
  if (access(memory.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "compare: the memory pass %s is missing (build the compare_memory target)\n", memory.c_str());
    return 1;
  }
  std::fprintf(stderr, "compare: OpenBLAS kernels: %s\n", blas_core().c_str());
  std::mt19937 rng(std::random_device{}());
  std::vector<Results> all(thread_counts.size());
  for (size_t i = 0; i < all.size(); ++i) all[i].threads = thread_counts[i];
  // The thread counts alternate within each round, so that a slow spell of
  // the machine does not fall on one of them only.
  for (int round = 0; round < rounds; ++round) {
    std::vector<size_t> order(all.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      Results& res = all[i];
      char numbers[128];
      std::snprintf(numbers, sizeof numbers, " --worker --threads %d --repetitions %d --min-time %g", res.threads, reps, min_time);
      const std::string common = numbers + std::string(" --filter ") + shell_quote(filter);
      const std::string omp = "OMP_NUM_THREADS=" + std::to_string(res.threads) + " ";
      std::map<std::string, size_t> before;
      for (const auto& [name, v] : res.us) before[name] = v.size();
      bool tuned_first = torch && (rng() & 1);
      for (int k = 0; k < (torch ? 2 : 1); ++k) {
        if ((k == 0) != tuned_first) run_child(omp + self + common, "", res);
        else run_child(omp + "GLIBC_TUNABLES=" + kTunables + " " + self + common + " --torch-only", "libtorch_tuned_", res);
      }
      for (const auto& [name, v] : res.us)
        if (v.size() > before[name])
          res.by_round[name][round] = summarize(std::vector<double>(v.begin() + std::ptrdiff_t(before[name]), v.end())).median;
    }
  }
  std::string doc;
  for (Results& res : all) {
    const std::string omp = "OMP_NUM_THREADS=" + std::to_string(res.threads) + " ";
    run_child(omp + shell_quote(memory) + " --threads " + std::to_string(res.threads) + " --filter " + shell_quote(filter), "", res);
    const std::string t = time_table(res, torch) + "\n" + memory_table(res, torch, doc.empty());
    std::printf("\n%s\n", t.c_str());
    doc += t + "\n";
  }
  if (all.size() > 1) {
    const std::string t = threads_table(all);
    std::printf("\n%s\n", t.c_str());
    doc += t + "\n";
  }
  if (!out.empty()) {
    std::ifstream in(out);
    if (!in) {
      std::fprintf(stderr, "compare: cannot read %s\n", out.c_str());
      return 1;
    }
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const std::string begin = "<!-- compare:begin -->", end = "<!-- compare:end -->";
    const size_t b = text.find(begin), e = text.find(end);
    char how[768];
    std::snprintf(how, sizeof how,
                  "%d rounds, the thread counts in random order within each. In each round and thread count, in random order, "
                  "one process times segtape, LibTorch and the "
                  "floors (%d repetitions of each, interleaved at random by Google Benchmark) and one times LibTorch alone "
                  "with `GLIBC_TUNABLES=%s`. Each cell is the median over the %d repetitions of all rounds (min–max in "
                  "parentheses). Memory and heap allocations come from a separate, untimed pass (`compare_memory`); no "
                  "timed process has an allocation hook or a counting allocator. Threads set explicitly for OpenBLAS and "
                  "LibTorch intra-op.",
                  rounds, reps, kTunables, rounds * reps);
    std::string gen = begin + "\n\nGenerated by `" + std::string(argv[0]) + " --out " + out + "` on " + machine() + "; " +
                      trimmed(OPENBLAS_VERSION) + " (kernels: " + blas_core() + "; segtape's packed kernel: " + packed_kernel() + ")" + torch_version(torch) + ". " + how + "\n\n" +
                      doc + end;
    text = b == std::string::npos || e == std::string::npos ? text + "\n" + gen + "\n" : text.replace(b, e + end.size() - b, gen);
    std::ofstream(out) << text;
    std::printf("wrote %s\n", out.c_str());
  }
  return 0;
}
#endif
