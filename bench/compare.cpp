// segtape vs LibTorch, side by side, on the workload of bench/workload.h, plus
// the OpenBLAS sgemm floor of that workload. Runs Google Benchmark with
// repetitions interleaved at random (the machine's drift hits both engines
// alike), prints the table and (with --out) regenerates docs/benchmarks.md.
//
//   build/bench/compare [--repetitions 7] [--min-time 0.3] [--threads 1,2] [--out docs/benchmarks.md]
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "alloc_hook.h"
#include "workload.h"
#ifdef SEGTAPE_BENCH_TORCH
#include <torch/torch.h>

#include "torch_memory.h"
#endif

using namespace segtape;
using namespace segtape::bench;

namespace {

struct Size {
  int64_t B, H;
};
const Size kSizes[] = {{1, 128}, {32, 128}, {32, 512}, {64, 1024}};

// Per-benchmark extras measured once outside the timed loop.
struct Extra {
  double peak_bytes = 0;     // segtape: segment high-water; LibTorch: allocator peak above the segment's start
  double allocs_per_step = 0;  // heap allocations per step (operator new + malloc family)
  double saved_bytes = 0;      // segtape: what forward kept for backward
  double analytic_bytes = 0;   // the least backward needs (bench/workload.h)
};
std::map<std::string, Extra> g_extra;

std::string key_of(const char* name, int64_t B, int64_t H) {
  return std::string(name) + "/" + std::to_string(B) + "/" + std::to_string(H);
}

template <class F>
double allocs_per_step(F&& segment) {
  segment();  // warm-up
  const uint64_t before = alloc_hook::count();
  alloc_hook::enable(true);
  segment();
  alloc_hook::enable(false);
  return double(alloc_hook::count() - before) / double(kK);
}

void BM_segtape_train(benchmark::State& st, const char* name) {
  const Data data(st.range(0));
  SegtapeModel m(st.range(0), st.range(1), data);
  Extra e;
  e.allocs_per_step = allocs_per_step([&] { m.train_segment(); });
  e.peak_bytes = double(m.tape.stats().last_segment_peak);
  e.saved_bytes = double(m.saved_bytes);
  e.analytic_bytes = double(analytic_saved_bytes(st.range(0), st.range(1)));
  g_extra[key_of(name, st.range(0), st.range(1))] = e;
  for (auto _ : st) m.train_segment();
  st.SetItemsProcessed(st.iterations() * kK);
}

void BM_segtape_infer(benchmark::State& st, const char* name) {
  const Data data(st.range(0));
  SegtapeModel m(st.range(0), st.range(1), data);
  Extra e;
  e.allocs_per_step = allocs_per_step([&] { m.infer_segment(); });
  e.peak_bytes = double(m.tape.stats().last_segment_peak);
  g_extra[key_of(name, st.range(0), st.range(1))] = e;
  for (auto _ : st) m.infer_segment();
  st.SetItemsProcessed(st.iterations() * kK);
}

// The sgemm calls one training step needs, on preallocated buffers:
// forward x W_ih^T, h W_hh^T, h W_out^T; backward dh = dgh W_hh and dh += dlogits W_out;
// weight gradients dW_ih += dgi^T x, dW_hh += dgh^T h, dW_out += dlogits^T h.
void BM_floor_sgemm(benchmark::State& st) {
  const int64_t B = st.range(0), H = st.range(1), G = 3 * H;
  std::vector<float> x(size_t(B * kI), 0.1f), h(size_t(B * H), 0.1f), wih(size_t(G * kI), 0.01f), whh(size_t(G * H), 0.01f),
      wout(size_t(kC * H), 0.01f), gi(size_t(B * G)), gh(size_t(B * G)), lo(size_t(B * kC)), dh(size_t(B * H)),
      dwih(wih.size()), dwhh(whh.size()), dwout(wout.size());
  auto gemm = [](bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bm, int64_t ldb,
                 float beta, float* C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(M), blasint(N), blasint(K),
                1.0f, A, blasint(lda), Bm, blasint(ldb), beta, C, blasint(ldc));
  };
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

template <bool Train>
void BM_libtorch(benchmark::State& st, const char* name) {
  torch_memory::install();
  const Data data(st.range(0));
  TorchModel m(st.range(0), st.range(1), data);
  Extra e;
  auto seg = [&] { Train ? m.train_segment() : m.infer_segment(); };
  e.allocs_per_step = allocs_per_step(seg);
  auto& s = torch_memory::CountingAllocator::stats();
  const int64_t base = s.live.load();
  torch_memory::CountingAllocator::reset_peak();
  seg();
  e.peak_bytes = double(s.peak.load() - base);
  g_extra[key_of(name, st.range(0), st.range(1))] = e;
  for (auto _ : st) seg();
  st.SetItemsProcessed(st.iterations() * kK);
}
#endif

// Collects every repetition's time per step.
class Collector : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, std::vector<double>> us_per_step;  // run name -> repetitions
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Iteration && r.iterations > 0)
        us_per_step[r.run_name.function_name + "/" + r.run_name.args].push_back(r.real_accumulated_time * 1e6 / double(r.iterations) / double(kK));
    ConsoleReporter::ReportRuns(runs);
  }
};

struct Summary {
  double median = 0, lo = 0, hi = 0;
};
Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.lo = v.front(), s.hi = v.back();
  return s;
}

std::string fmt_us(const Summary& s) {
  char b[96];
  std::snprintf(b, sizeof b, "%.1f (%.1f–%.1f)", s.median, s.lo, s.hi);
  return b;
}
std::string fmt_bytes(double b) {
  char s[32];
  if (b >= 1 << 20) std::snprintf(s, sizeof s, "%.2f MiB", b / (1 << 20));
  else std::snprintf(s, sizeof s, "%.1f KiB", b / 1024);
  return s;
}

std::string table(Collector& c, int threads, bool torch, bool memory_table) {
  std::ostringstream o;
  o << "### " << threads << (threads == 1 ? " thread" : " threads") << "\n\n";
  o << "| B, H | segtape µs/step | LibTorch µs/step | LibTorch / segtape | sgemm floor µs/step | segtape / floor | segtape segment peak | LibTorch allocator peak | heap allocs/step segtape | heap allocs/step LibTorch |\n";
  o << "|---|---|---|---|---|---|---|---|---|---|\n";
  auto key = [&](const char* what, int64_t B, int64_t H) {
    return key_of(what, B, H);
  };
  auto row = [&](const std::string& label, const std::string& ours, const std::string& theirs, const std::string& floor) {
    const Summary s = summarize(c.us_per_step[ours]);
    const Summary t = summarize(c.us_per_step[theirs]);
    const Summary f = summarize(c.us_per_step[floor]);
    char ratio[32] = "–", fr[32] = "–";
    if (torch && s.median > 0) std::snprintf(ratio, sizeof ratio, "%.2f×", t.median / s.median);
    if (f.median > 0) std::snprintf(fr, sizeof fr, "%.2f×", s.median / f.median);
    const Extra& eo = g_extra[ours];
    const Extra& et = g_extra[theirs];
    o << "| " << label << " | " << fmt_us(s) << " | " << (torch ? fmt_us(t) : "not built") << " | " << ratio << " | "
      << (f.median > 0 ? fmt_us(f) : "–") << " | " << fr << " | " << fmt_bytes(eo.peak_bytes) << " | "
      << (torch ? fmt_bytes(et.peak_bytes) : "–") << " | " << eo.allocs_per_step << " | " << (torch ? std::to_string(et.allocs_per_step) : "–")
      << " |\n";
  };
  for (const Size& z : kSizes)
    row(std::to_string(z.B) + ", " + std::to_string(z.H), key("segtape_train", z.B, z.H), key("libtorch_train", z.B, z.H),
        key("floor_sgemm", z.B, z.H));
  row("inference 1, 128", key("segtape_infer", 1, 128), key("libtorch_infer", 1, 128), "");
  if (!memory_table) return o.str();
  o << "\nSegment memory of segtape's training step against the analytic minimum of what backward must keep "
       "(bench/workload.h: x, h, the four GRU gate vectors, logits, log-sum-exp and targets per step):\n\n"
    << "| B, H | analytic minimum | saved by forward | saved / minimum | segment peak (incl. backward's gradients) | peak / minimum |\n"
    << "|---|---|---|---|---|---|\n";
  for (const Size& z : kSizes) {
    const Extra& e = g_extra[key("segtape_train", z.B, z.H)];
    if (e.analytic_bytes <= 0) continue;
    char r1[32], r2[32];
    std::snprintf(r1, sizeof r1, "%.3f×", e.saved_bytes / e.analytic_bytes);
    std::snprintf(r2, sizeof r2, "%.3f×", e.peak_bytes / e.analytic_bytes);
    o << "| " << z.B << ", " << z.H << " | " << fmt_bytes(e.analytic_bytes) << " | " << fmt_bytes(e.saved_bytes) << " | " << r1
      << " | " << fmt_bytes(e.peak_bytes) << " | " << r2 << " |\n";
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

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  double min_time = 0.3;
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
    if (a == "--repetitions") reps = std::stoi(next());
    else if (a == "--min-time") min_time = std::stod(next());
    else if (a == "--out") out = next();
    else if (a == "--threads") threads_arg = next();
    else if (a == "--filter") filter = next();
    else {
      std::fprintf(stderr, "usage: compare [--repetitions N] [--min-time S] [--threads 1,2] [--filter REGEX] [--out FILE]\n");
      return 2;
    }
  }
#ifdef SEGTAPE_BENCH_TORCH
  const bool torch = true;
  const std::string torch_version = std::string(", LibTorch ") + TORCH_VERSION;
#else
  const bool torch = false;
  const std::string torch_version;  // TORCH_VERSION exists only with LibTorch's headers
#endif
  for (const Size& z : kSizes) {
    benchmark::RegisterBenchmark("segtape_train", BM_segtape_train, "segtape_train")->Args({z.B, z.H})->UseRealTime();
#ifdef SEGTAPE_BENCH_TORCH
    benchmark::RegisterBenchmark("libtorch_train", BM_libtorch<true>, "libtorch_train")->Args({z.B, z.H})->UseRealTime();
#endif
    benchmark::RegisterBenchmark("floor_sgemm", BM_floor_sgemm)->Args({z.B, z.H})->UseRealTime();
  }
  benchmark::RegisterBenchmark("segtape_infer", BM_segtape_infer, "segtape_infer")->Args({1, 128})->UseRealTime();
#ifdef SEGTAPE_BENCH_TORCH
  benchmark::RegisterBenchmark("libtorch_infer", BM_libtorch<false>, "libtorch_infer")->Args({1, 128})->UseRealTime();
#endif
  std::string doc_tables;
  std::stringstream ts(threads_arg);
  for (std::string tok; std::getline(ts, tok, ',');) {
    const int threads = std::stoi(tok);
    openblas_set_num_threads(threads);
#ifdef SEGTAPE_BENCH_TORCH
    torch::set_num_threads(threads);
#endif
    std::string r = "--benchmark_repetitions=" + std::to_string(reps), m = "--benchmark_min_time=" + std::to_string(min_time);
    std::string il = "--benchmark_enable_random_interleaving=true", fl = "--benchmark_filter=" + filter;
    char* args[] = {argv[0], r.data(), m.data(), il.data(), fl.data(), nullptr};
    int n = 5;
    benchmark::Initialize(&n, args);
    Collector c;
    benchmark::RunSpecifiedBenchmarks(&c);
    const std::string t = table(c, threads, torch, doc_tables.empty());
    std::printf("\n%s\n", t.c_str());
    doc_tables += t + "\n";
  }
  if (!out.empty()) {
    std::ifstream in(out);
    std::string doc((std::istreambuf_iterator<char>(in)), {});
    const std::string begin = "<!-- compare:begin -->", end = "<!-- compare:end -->";
    const size_t b = doc.find(begin), e = doc.find(end);
    std::string gen = begin + "\n\nGenerated by `build/bench/compare --out docs/benchmarks.md` on " + machine() +
                      "; " + trimmed(OPENBLAS_VERSION) + torch_version +
                      ". Median over " + std::to_string(reps) +
                      " repetitions (min–max in parentheses), repetitions interleaved at random. Threads set explicitly "
                      "for OpenBLAS and LibTorch intra-op.\n\n" + doc_tables + end;
    doc = b == std::string::npos || e == std::string::npos ? doc + "\n" + gen + "\n" : doc.replace(b, e + end.size() - b, gen);
    std::ofstream(out) << doc;
    std::printf("wrote %s\n", out.c_str());
  }
  return 0;
}
