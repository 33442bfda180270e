// The CUDA backend against the CPU (label `cuda`). Without a GPU every test
// that needs one skips, with the reason Tape(Device::cuda()) gave, after its
// CPU part has run.
//
//  - CudaOps: one table, every op on CUDA (float32 and float64) against the
//    CPU float64 reference, values and gradients, small and large shapes,
//    with a tolerance per op widened by the inputs' measured conditioning
//    (the CPU's own float32 gap, which must be small: see "conditioning").
//  - the cuDNN GRU sequence (one op over K steps) and the fused GRU cell
//    stepped K times, against the CPU: values and every gradient.
//  - a TBPTT training run of 20 segments on CPU, CUDA and CUDA with graph
//    replay: a loss that falls, the same curve on every device; on CUDA the
//    same arena high-water in every segment and no device allocation after
//    setup; replay bit-equal to eager.
//  - errors: no GPU, data<T>() on device memory, out of memory at setup,
//    device-found index errors, graph replay of a different segment.
//
// Built twice: as cuda_test (label `cuda`, the real backend) and as
// emulated_cuda_test (label `emulated`, SEGTAPE_TEST_EMULATED_DEVICE), where
// Device::cuda() is the host-emulated device of segtape/emulation.h: there
// the CPU parts (conditioning, the loss falling) and the device code paths
// run on every machine, in CI; the device's numbers are the CPU's there, so
// only the real backend tests CUDA's numerics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda/fused_gru.h"
#include "gpu.h"
#include "op_cases.h"
#include "segtape/emulation.h"
#include "segtape/kernels.h"
#include "segtape/nn/optim.h"
#include "util.h"

using namespace segtape;
using namespace segtape::test;

namespace {

// What only the CUDA backend does (cudaMalloc's out-of-memory report, index
// checks in kernels, graph capture) is not emulated: those tests skip there.
#define REQUIRE_CUDA_BACKEND()                                                                   \
  do {                                                                                           \
    REQUIRE_GPU();                                                                               \
    if (kEmulated) GTEST_SKIP() << "the host-emulated device does not emulate this (CUDA only)"; \
  } while (0)

// The small pools, with room for the op table's largest shapes (dims up to 70).
TapeOptions cuda_options() {
  TapeOptions o = small_device_pools();
  o.segment_budget = o.device_persistent = size_t(64) << 20;
  o.device_workspace = size_t(16) << 20;
  return o;
}


// ---- values on any device, through the host
void set(const Tensor& t, const std::vector<double>& v) {
  if (t.dtype == DType::F64) return t.from_host(std::span<const double>(v));
  const std::vector<float> f(v.begin(), v.end());
  t.from_host(std::span<const float>(f));
}
std::vector<double> get(const Tensor& t) {
  if (t.dtype == DType::F64) return t.to_host<double>();
  const std::vector<float> f = t.to_host<float>();
  return {f.begin(), f.end()};
}
Tensor param(Tape& tape, const Shape& s, DType d, const std::vector<double>& v) {
  Tensor p = tape.parameter(s, d);
  set(p, v);
  return p;
}
Tensor constant(Tape& tape, const Shape& s, DType d, const std::vector<double>& v) {
  if (d == DType::F64) return tape.from(std::span<const double>(v), s);
  const std::vector<float> f(v.begin(), v.end());
  return tape.from(std::span<const float>(f), s);
}
std::vector<double> uniform(std::mt19937& rng, int64_t n, double lo = -1, double hi = 1) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = std::uniform_real_distribution<double>(lo, hi)(rng);
  return v;
}

// ------------------------------------------------------------------ every op

using Case = OpCase;
const std::vector<Case>& cases() {
  static const std::vector<Case> c = op_cases();
  return c;
}

struct Result {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
};

// f(inputs) and the gradients of sum(f(inputs) * w), on one tape.
Result evaluate(const Case& c, Tape& tape, DType dt, const int64_t* d, const std::vector<Shape>& shapes,
                const std::vector<std::vector<double>>& values, std::vector<double>& w, std::mt19937& rng) {
  std::vector<Tensor> in;
  for (size_t k = 0; k < shapes.size(); ++k) in.push_back(param(tape, shapes[k], dt, values[k]));
  Result r;
  {
    Segment seg = tape.segment();
    Tensor out = c.f(tape, in, d);
    if (w.empty()) w = uniform(rng, out.numel());
    r.out = get(out);
    seg.backward(sum(mul(out, constant(tape, out.shape, dt, w))));
  }
  for (const Tensor& p : in) r.grads.push_back(get(p.grad_tensor()));
  return r;
}

// ---- conditioning: what a float32 tolerance may allow
//
// A float32 result differs from the float64 one by each operation's rounding
// (unit roundoff u32 = 2^-24, u64 = 2^-53) times what the computation makes
// of it: about u for an elementwise op, 1e5 u and more for a chaotic
// recurrence (60 GRU steps at H = 70 with every weight in +-1). A tolerance
// must cover that amplification, or a correct device fails; and it must stay
// far below the error of a mapping bug (a wrong gate, block, stride or
// transpose: 1e-2 to 1), or the comparison proves nothing. So every output (the values, each
// input's gradient) is first measured on the CPU: its conditioning figure is
// gap = rel_error(CPU float32, CPU float64) on the same inputs. The rule:
//  - gap <= kIllConditioned, or the case fails as ill-conditioned (fix its
//    inputs, not the tolerance): 1e-4 is an amplification below ~1700 u,
//    which keeps every tolerance below 1e-3 in float32 and 2e-12 in float64;
//  - the device may differ from the CPU's float64 by
//    max(floor, kRoundingSpread * gap * u_dtype / u32), the floor being the
//    case's tol32 in float32 and 1e-12 in float64: the device rounds
//    differently (other summation orders in GEMMs and reductions, its own
//    exp and tanh), by about as much, amplified by the same computation. On
//    the H200, on the chaotic gru_sequence draw, CUDA's float32 was off by a
//    quarter to a third of the CPU's own float32 gap; 10 leaves room.
constexpr double kIllConditioned = 1e-4;
constexpr double kRoundingSpread = 10;

double tolerance(DType dt, double tol32, double gap32) {
  return dt == DType::F32 ? std::max(tol32, kRoundingSpread * gap32)
                          : std::max(1e-12, kRoundingSpread * gap32 * std::ldexp(1.0, -53) / std::ldexp(1.0, -24));
}

// One trial of an op case: its dims and inputs, the weights w of the loss
// sum(f(x) * w), the CPU float64 reference and the conditioning figure of
// each output (gap[0]: values; gap[1 + k]: input k's gradient).
struct Trial {
  int64_t d[4];
  std::vector<Shape> shapes;
  std::vector<std::vector<double>> values;
  std::vector<double> w;
  std::mt19937 rng;
  Result ref;
  std::vector<double> gap;
  std::string what;
};

// Two small trials (edge shapes of 1..4), one large (20..70: multi-block
// reductions, chunked partial sums, tiled transposes, long rows, 60-step
// recurrences); on the CPU alone.
Trial make_trial(const Case& cs, int index, int trial) {
  Trial t;
  t.rng.seed(4321 + 31 * unsigned(index) + unsigned(trial));
  const int64_t lo = trial < 2 ? 1 : 20, hi = trial < 2 ? 4 : 70;
  for (auto& v : t.d) v = std::uniform_int_distribution<int64_t>(lo, hi)(t.rng);
  t.shapes = cs.shapes(t.d);
  for (size_t k = 0; k < t.shapes.size(); ++k) {
    const auto [vlo, vhi] = cs.range(k, t.d);
    t.values.push_back(uniform(t.rng, t.shapes[k].numel(), vlo, vhi));
  }
  Tape cpu, cpu32;
  t.ref = evaluate(cs, cpu, DType::F64, t.d, t.shapes, t.values, t.w, t.rng);
  const Result r32 = evaluate(cs, cpu32, DType::F32, t.d, t.shapes, t.values, t.w, t.rng);
  t.gap.push_back(rel_error(r32.out, t.ref.out));
  for (size_t k = 0; k < t.shapes.size(); ++k) t.gap.push_back(rel_error(r32.grads[k], t.ref.grads[k]));
  t.what = cs.name + " trial " + std::to_string(trial) + " dims " + std::to_string(t.d[0]) + "," + std::to_string(t.d[1]) +
           "," + std::to_string(t.d[2]) + "," + std::to_string(t.d[3]);
  return t;
}

std::string output_name(const Trial& t, size_t j) {
  return j == 0 ? std::string("values") : "gradient of input " + std::to_string(j - 1) + " " + t.shapes[j - 1].str();
}

class CudaOps : public ::testing::TestWithParam<int> {};

// The conditioning part runs without a GPU (and in emulated_cuda_test, in CI).
TEST_P(CudaOps, MatchCpuFloat64InValuesAndGradients) {
  const Case cs = cases()[size_t(GetParam())];
  std::vector<Trial> trials;
  for (int trial = 0; trial < 3; ++trial) {
    trials.push_back(make_trial(cs, GetParam(), trial));
    const Trial& t = trials.back();
    size_t worst = 0;
    for (size_t j = 0; j < t.gap.size(); ++j) {
      if (t.gap[j] > t.gap[worst]) worst = j;
      EXPECT_LE(t.gap[j], kIllConditioned)
          << t.what << ": " << output_name(t, j) << " is ill-conditioned: the CPU's own float32 is " << t.gap[j]
          << " (relative) from its float64 on these inputs, so no float32 device result can be checked; draw inputs "
             "that keep rounding from growing (e.g. weights at PyTorch's initialisation scale)";
    }
    std::printf("conditioning: %s: CPU float32 vs float64 at most %.3g (%s); float32 tolerance %.3g\n", t.what.c_str(),
                t.gap[worst], output_name(t, worst).c_str(), tolerance(DType::F32, cs.tol32, t.gap[worst]));
  }
  REQUIRE_GPU();
  for (Trial& t : trials) {
    for (DType dt : {DType::F32, DType::F64}) {
      Tape gpu(Device::cuda(), cuda_options());
      const Result r = evaluate(cs, gpu, dt, t.d, t.shapes, t.values, t.w, t.rng);
      for (size_t j = 0; j < t.gap.size(); ++j) {
        const double tol = tolerance(dt, cs.tol32, t.gap[j]);
        EXPECT_LE(rel_error(j ? r.grads[j - 1] : r.out, j ? t.ref.grads[j - 1] : t.ref.out), tol)
            << t.what << " " << dtype_name(dt) << ": " << output_name(t, j) << " (CPU float32 gap " << t.gap[j] << ")";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaOps, ::testing::Range(0, int(cases().size())),
                         [](const ::testing::TestParamInfo<int>& i) { return cases()[size_t(i.param)].name; });

// ------------------------------------------------------------------ GRU over K steps

struct GruRun {
  std::vector<double> out, h_last;
  std::vector<std::vector<double>> grads;  // x, h0, w_ih, w_hh, b_ih, b_hh
};

// sequence: one gru_sequence op; else K gru_cell steps (recompute: in-step checkpointing).
GruRun run_gru(Tape& tape, DType dt, int64_t K, int64_t B, int64_t I, int64_t H, bool sequence, bool recompute, bool grad,
               uint32_t seed) {
  std::mt19937 rng(seed);
  const double bound = 1 / std::sqrt(double(H));
  const std::vector<Shape> shapes = {{K, B, I}, {B, H}, {3 * H, I}, {3 * H, H}, {3 * H}, {3 * H}};
  std::vector<Tensor> p;
  for (size_t k = 0; k < shapes.size(); ++k)
    p.push_back(param(tape, shapes[k], dt, uniform(rng, shapes[k].numel(), k < 2 ? -1 : -bound, k < 2 ? 1 : bound)));
  const std::vector<double> w = uniform(rng, K * B * H);
  GruRun r;
  Segment seg = tape.segment();
  Tensor out;
  std::optional<NoGradGuard> inference;  // nothing recorded (cuDNN: inference mode, no reserve space)
  if (!grad) inference.emplace(tape);
  if (sequence) {
    out = gru_sequence(p[0], p[1], p[2], p[3], p[4], p[5]);
  } else {
    std::vector<Tensor> steps;
    Tensor h = p[1];
    for (int64_t t = 0; t < K; ++t) {
      h = gru_cell(reshape(slice(p[0], 0, t, 1), {B, I}), h, p[2], p[3], p[4], p[5], recompute);
      steps.push_back(reshape(h, {1, B, H}));
    }
    out = steps[0];
    for (size_t t = 1; t < steps.size(); ++t) out = concat({out, steps[t]}, 0);
  }
  r.out = get(out);
  r.h_last = get(slice(out, 0, K - 1, 1));
  if (grad) {
    seg.backward(sum(mul(out, constant(tape, out.shape, dt, w))));
    for (const Tensor& t : p) r.grads.push_back(get(t.grad_tensor()));
  }
  return r;
}

void expect_gru_close(const GruRun& a, const GruRun& ref, double tol, const std::string& what) {
  EXPECT_LE(rel_error(a.out, ref.out), tol) << what << ": outputs";
  EXPECT_LE(rel_error(a.h_last, ref.h_last), tol) << what << ": last state";
  const char* names[] = {"x", "h0", "w_ih", "w_hh", "b_ih", "b_hh"};
  for (size_t k = 0; k < a.grads.size() && k < ref.grads.size(); ++k)
    EXPECT_LE(rel_error(a.grads[k], ref.grads[k]), tol) << what << ": gradient of " << names[k];
}

// Inputs in +-1, weights at PyTorch's scale: well-conditioned (the CPU's own
// float32 is within 4.3e-7 of its float64 at K = 32, H = 128 and 2.2e-7 at
// K = 12, H = 64), so 5e-5 is room for other rounding, not for chaos.
// gru_sequence takes the fused kernels where their plan fits (both sizes
// here on an sm_90 GPU: engine/cuda/fused_gru.h) and cuDNN otherwise, or
// with kernels::Options::fused_gru off: both paths are checked against the CPU.
bool fused_fits(int64_t B, int64_t H, DType dt) {
  return !kEmulated && cuda::fused::device_plan(B, H, dtype_size(dt)).use;
}

TEST(CudaGru, SequenceMatchesCpuGruOverKStepsFusedAndCudnn) {
  REQUIRE_GPU();
  struct Size {
    int64_t K, B, I, H;
  };
  for (const bool fused : {true, false}) {
    kernels::Options k = kernels::options();
    k.fused_gru = fused;
    const kernels::Scope scope(k);
    for (const Size s : {Size{5, 3, 4, 6}, Size{32, 16, 32, 128}, Size{16, 1, 32, 128}, Size{16, 32, 32, 128}}) {
      Tape cpu;
      const GruRun ref = run_gru(cpu, DType::F64, s.K, s.B, s.I, s.H, false, false, true, 77);
      for (DType dt : {DType::F32, DType::F64}) {
        Tape gpu(Device::cuda(), cuda_options());
        const bool fits = fused && fused_fits(s.B, s.H, dt);
        if (fused && !kEmulated) {  // the emulated device computes with the CPU's code
          EXPECT_TRUE(fits || dt == DType::F64) << "the fused plan should fit (B " << s.B << ", H " << s.H << ") in float32";
        }
        const std::string what = std::string(fits ? "fused" : "cuDNN") + " GRU " + dtype_name(dt) + " K=" + std::to_string(s.K) +
                                 " B=" + std::to_string(s.B) + " H=" + std::to_string(s.H);
        expect_gru_close(run_gru(gpu, dt, s.K, s.B, s.I, s.H, true, false, true, 77), ref, dt == DType::F32 ? 5e-5 : 1e-11, what);
        // Inference mode (no reserve space, no saved gates) gives the same values.
        const GruRun inf = run_gru(gpu, dt, s.K, s.B, s.I, s.H, true, false, false, 77);
        EXPECT_LE(rel_error(inf.out, ref.out), dt == DType::F32 ? 5e-5 : 1e-11) << what << " (inference)";
      }
    }
  }
}

TEST(CudaGru, FusedCellSteppedMatchesCpu) {
  REQUIRE_GPU();
  for (bool recompute : {false, true}) {
    Tape cpu;
    const GruRun ref = run_gru(cpu, DType::F64, 12, 8, 16, 64, false, false, true, 5);
    for (DType dt : {DType::F32, DType::F64}) {
      Tape gpu(Device::cuda(), cuda_options());
      expect_gru_close(run_gru(gpu, dt, 12, 8, 16, 64, false, recompute, true, 5), ref, dt == DType::F32 ? 5e-5 : 1e-11,
                       std::string("fused cell ") + dtype_name(dt) + (recompute ? " recompute" : ""));
    }
  }
}

// gru_sequence with per-stream resets (keep) on the device against the CPU in
// float64: the fused kernels where their plan fits (an sm_90 GPU), else (the
// emulated device, kernels::Options::fused_gru off) masked cells. Values and every
// gradient; inference mode; keep overwritten between the forward and the
// backward (the forward's copy, or its expansion, is what backward reads:
// the gradients stay those of the keep the forward used); and graph replay
// with keep's values changed at the same address before each segment (the
// replayed copy must read them).
// The grid plan (fused_gru.h's grid_plan: W_hh over the blocks of one
// cooperative launch) at sizes no cluster holds, on a GPU that has
// cooperative launches: chosen in float32, and against the CPU in float32
// and float64 (float64 takes whichever plan fits, or cuDNN), values and every
// gradient, training and inference; and in CUDA-graph segments (a cooperative
// kernel node), each replayed segment's y against the CPU's, at (32, 512).
TEST(CudaGru, GridPlanSequenceMatchesTheCpuAndReplays) {
  REQUIRE_GPU();
  kernels::Options k = kernels::options();
  k.fused_gru_grid = true;  // (off by default until this test has passed on a GPU)
  const kernels::Scope scope(k);
  TapeOptions big = cuda_options();  // W_hh of H = 1024 in float64 is 24 MiB
  big.segment_budget = big.device_persistent = size_t(256) << 20;
  if (!kEmulated) {  // the switch decides (a gru_sequence with keep: fused, else composed cells)
    Tape t(Device::cuda(), big);
    EXPECT_TRUE(gru_sequence_fused(t, 64, 1024, DType::F32));
    kernels::Options off = kernels::options();
    off.fused_gru_grid = false;
    const kernels::Scope by_default(off);
    EXPECT_FALSE(gru_sequence_fused(t, 64, 1024, DType::F32)) << "fused_gru_grid off: cuDNN's GRU";
    EXPECT_TRUE(gru_sequence_fused(t, 32, 128, DType::F32)) << "a cluster plan, whatever fused_gru_grid says";
  }
  struct Size {
    int64_t K, B, I, H;
  };
  for (const Size s : {Size{6, 32, 16, 512}, Size{4, 64, 16, 1024}}) {
    Tape cpu;
    const GruRun ref = run_gru(cpu, DType::F64, s.K, s.B, s.I, s.H, true, false, true, 91);
    for (DType dt : {DType::F32, DType::F64}) {
      const cuda::fused::Plan plan = kEmulated ? cuda::fused::Plan{} : cuda::fused::device_plan(s.B, s.H, dtype_size(dt));
      if (!kEmulated && dt == DType::F32) {
        EXPECT_TRUE(plan.use && plan.grid) << "B " << s.B << ", H " << s.H << ": " << plan.why_not;
      }
      const std::string what = std::string(plan.use ? (plan.grid ? "fused grid" : "fused") : "cuDNN") + " GRU " + dtype_name(dt) +
                               " B=" + std::to_string(s.B) + " H=" + std::to_string(s.H);
      Tape gpu(Device::cuda(), big);
      const double tol = dt == DType::F32 ? 5e-5 : 1e-11;
      expect_gru_close(run_gru(gpu, dt, s.K, s.B, s.I, s.H, true, false, true, 91), ref, tol, what);
      EXPECT_LE(rel_error(run_gru(gpu, dt, s.K, s.B, s.I, s.H, true, false, false, 91).out, ref.out), tol) << what << " (inference)";
    }
    if (s.H != 512) continue;  // (the same kernels: one size in graphs is enough)
    // graph segments: 1 eager, 2 and 3 captured, then replayed; x new before each
    TapeOptions o = big;
    o.graph_replay = true;
    Tape g(Device::cuda(), o);
    std::mt19937 rng(5);
    const double bound = 1 / std::sqrt(double(s.H));
    const std::vector<Shape> shapes = {{s.K, s.B, s.I}, {s.B, s.H}, {3 * s.H, s.I}, {3 * s.H, s.H}, {3 * s.H}, {3 * s.H}};
    std::vector<std::vector<double>> vals;
    for (size_t k = 0; k < shapes.size(); ++k) vals.push_back(uniform(rng, shapes[k].numel(), k < 2 ? -1 : -bound, k < 2 ? 1 : bound));
    std::vector<Tensor> p;
    for (size_t k = 0; k < shapes.size(); ++k) p.push_back(param(g, shapes[k], DType::F32, vals[k]));
    Tensor out = g.persistent({s.K, s.B, s.H}, DType::F32);
    for (int seg_no = 0; seg_no < 5; ++seg_no) {
      std::vector<double> x = uniform(rng, shapes[0].numel(), -1, 1);
      set(p[0], x);
      {
        Segment seg = g.segment();
        NoGradGuard ng(g);
        copy_into(out, gru_sequence(p[0], p[1], p[2], p[3], p[4], p[5]));
      }
      Tape c;
      std::vector<Tensor> q;
      for (size_t k = 0; k < shapes.size(); ++k) q.push_back(param(c, shapes[k], DType::F64, k == 0 ? x : vals[k]));
      Segment cs = c.segment();
      EXPECT_LE(rel_error(get(out), get(gru_sequence(q[0], q[1], q[2], q[3], q[4], q[5]))), 5e-5)
          << "graph segment " << seg_no << ", B " << s.B << ", H " << s.H;
    }
  }
}

TEST(CudaGru, SequenceWithResetsMatchesTheCpuFusedComposedInferenceAndReplayed) {
  REQUIRE_GPU();
  const int64_t K = 12, B = 4, I = 8, H = 32;
  std::mt19937 rng(11);
  const double bound = 1 / std::sqrt(double(H));
  const std::vector<Shape> shapes = {{K, B, I}, {B, H}, {3 * H, I}, {3 * H, H}, {3 * H}, {3 * H}};
  std::vector<std::vector<double>> vals;
  for (size_t k = 0; k < shapes.size(); ++k) vals.push_back(uniform(rng, shapes[k].numel(), k < 2 ? -1 : -bound, k < 2 ? 1 : bound));
  const std::vector<double> w = uniform(rng, K * B * H);
  const auto keep_of = [&](size_t s) {  // a fifth of the entries 0, in a pattern that moves with s
    std::vector<double> k(static_cast<size_t>(K * B));
    for (size_t i = 0; i < k.size(); ++i) k[i] = (i * 7 + s) % 5 == 0 ? 0.0 : 1.0;
    return k;
  };
  // y and (grad) the gradients of sum(y * w); `later`: keep's values written after the forward.
  const auto run = [&](Tape& tape, DType dt, const std::vector<double>& kv, bool grad, const std::vector<double>* later) {
    std::vector<Tensor> p;
    for (size_t k = 0; k < shapes.size(); ++k) p.push_back(param(tape, shapes[k], dt, vals[k]));
    Tensor keep = tape.persistent({K, B}, dt);
    set(keep, kv);
    GruRun r;
    Segment seg = tape.segment();
    std::optional<NoGradGuard> inference;
    if (!grad) inference.emplace(tape);
    const Tensor y = gru_sequence(p[0], p[1], p[2], p[3], p[4], p[5], keep);
    r.out = get(y);
    r.h_last = get(slice(y, 0, K - 1, 1));
    if (later) set(keep, *later);
    if (grad) {
      seg.backward(sum(mul(y, constant(tape, y.shape, dt, w))));
      for (const Tensor& t : p) r.grads.push_back(get(t.grad_tensor()));
    }
    return r;
  };
  Tape cpu;
  const std::vector<double> k0 = keep_of(0), k1 = keep_of(1);
  const GruRun ref = run(cpu, DType::F64, k0, true, nullptr);
  Tape cpu_other;
  EXPECT_GT(rel_error(run(cpu_other, DType::F64, k1, true, nullptr).out, ref.out), 1e-3);  // the keeps differ in effect
  for (const bool fused : {true, false}) {
    kernels::Options k = kernels::options();
    k.fused_gru = fused;
    const kernels::Scope scope(k);
    for (DType dt : {DType::F32, DType::F64}) {
      const bool fits = fused && fused_fits(B, H, dt);
      const std::string what = std::string(fits ? "fused" : "composed") + " GRU with resets " + dtype_name(dt);
      const double tol = dt == DType::F32 ? 5e-5 : 1e-11;
      Tape a(Device::cuda(), cuda_options()), b(Device::cuda(), cuda_options()), c(Device::cuda(), cuda_options());
      expect_gru_close(run(a, dt, k0, true, nullptr), ref, tol, what);
      expect_gru_close(run(b, dt, k0, true, &k1), ref, tol, what + ", keep overwritten after the forward");
      EXPECT_LE(rel_error(run(c, dt, k0, false, nullptr).out, ref.out), tol) << what << " (inference)";
    }
  }
  // Graph replay (float64): segment 1 eager, 2 and 3 captured, then replayed,
  // keep's values new before each; each segment's y against the CPU's.
  TapeOptions o = cuda_options();
  o.graph_replay = true;
  Tape g(Device::cuda(), o);
  std::vector<Tensor> p;
  for (size_t k = 0; k < shapes.size(); ++k) p.push_back(param(g, shapes[k], DType::F64, vals[k]));
  Tensor keep = g.persistent({K, B}, DType::F64), out = g.persistent({K, B, H}, DType::F64);
  for (size_t s = 0; s < 6; ++s) {
    const std::vector<double> ks = keep_of(s);
    set(keep, ks);
    {
      Segment seg = g.segment();
      NoGradGuard ng(g);
      copy_into(out, gru_sequence(p[0], p[1], p[2], p[3], p[4], p[5], keep));
    }
    Tape cs;
    EXPECT_LE(rel_error(get(out), run(cs, DType::F64, ks, false, nullptr).out), 1e-11) << "graph segment " << s;
  }
}

// ------------------------------------------------------------------ embedding

// Embedding's backward with repeated indices: up to 256 indices the device
// sums each row's gradients in index order, the CPU's order, so dW is the
// CPU's bit for bit, run after run; beyond 256 (atomicAdd, any order) it is
// within float32 rounding of it.
TEST(CudaEmbedding, BackwardWithRepeatedIndicesIsTheCpusInItsOrder) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  constexpr int64_t N = 4, D = 6;
  for (const int64_t count : {8, 200, 256, 300}) {
    SCOPED_TRACE(std::to_string(count) + " indices");
    std::vector<int64_t> ix(static_cast<size_t>(count));
    for (int64_t& v : ix) v = int64_t(rng() % N);
    const std::vector<double> w0 = uniform(rng, N * D), g = uniform(rng, count * D);
    const auto grad = [&](Tape& tape) {
      Tensor w = param(tape, {N, D}, DType::F32, w0);
      Segment seg = tape.segment();
      const Tensor e = embedding(w, tape.from(std::span<const int64_t>(ix), {count}));
      seg.backward(sum(mul(e, constant(tape, {count, D}, DType::F32, g))));  // dL/de = g, exactly
      return w.grad_tensor().to_host<float>();
    };
    Tape cpu, gpu_a(Device::cuda(), cuda_options()), gpu_b(Device::cuda(), cuda_options());
    const std::vector<float> want = grad(cpu), a = grad(gpu_a), b = grad(gpu_b);
    if (count <= 256) {
      EXPECT_EQ(a, want) << "the CPU's sums, bit for bit";
      EXPECT_EQ(b, a);
    } else {
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(a[i], want[i], 1e-5 * std::max(1.0f, std::fabs(want[i])));
    }
  }
}

// ------------------------------------------------------------------ TBPTT training

constexpr int64_t kB = 8, kI = 12, kH = 32, kC = 5, kK = 8;
constexpr int kSegments = 20;
constexpr double kLearningRate = 0.2;

struct Curve {
  std::vector<double> loss;        // per segment
  std::vector<double> norm;        // gradient norm per segment (Adam with the host's clip_grad_norm)
  std::vector<size_t> peak;        // arena high-water per segment
  uint64_t device_allocs_setup = 0, device_allocs_end = 0;
};

// x -> GRUCell -> Linear -> cross-entropy, K steps per segment, state carried,
// SGD written with engine ops (so it runs inside the segment, on any device,
// and is captured with it under graph replay). The class of a row is the
// index of the largest of its input's first kC features: a function of the
// inputs, so the loss (a sum over the K steps, 8 ln 5 = 12.88 at chance)
// falls, on fresh inputs in every segment.
// Optimizer: the SGD above, or nn::Adam (lr 1e-2) stepped inside the
// segment, with its step count on the device (capturable) or passed from the
// host; with clip, nn::clip_grad_norm(max_norm 0.5) before it, with the norm
// kept on the device (capturable) or returned to the host.
enum class Optim { OpsSgd, AdamCapturable, AdamHostCount };
constexpr double kMaxNorm = 0.5;
Curve train(Device dev, bool graph_replay, Optim optim = Optim::OpsSgd, bool clip = false) {
  TapeOptions o = cuda_options();
  o.segment_budget = size_t(8) << 20;
  o.graph_replay = graph_replay;
  Tape tape(dev, o);
  std::mt19937 rng(2024);
  const double bound = 1 / std::sqrt(double(kH));
  const std::vector<Shape> shapes = {{3 * kH, kI}, {3 * kH, kH}, {3 * kH}, {3 * kH}, {kC, kH}, {kC}};
  std::vector<Tensor> p;
  for (const Shape& s : shapes) p.push_back(param(tape, s, DType::F32, uniform(rng, s.numel(), -bound, bound)));
  Tensor h = tape.persistent({kB, kH});
  Tensor loss_value = tape.persistent({1});
  std::unique_ptr<nn::Adam> adam;
  if (optim != Optim::OpsSgd)
    adam = std::make_unique<nn::Adam>(nn::numbered(p), nn::AdamOptions{.lr = 1e-2, .capturable = optim == Optim::AdamCapturable});
  Tensor norm_sq = tape.persistent({1}, DType::F64);  // the capturable clip's
  std::vector<float> xs(size_t(kSegments * kK * kB * kI));
  std::vector<int64_t> ys(size_t(kSegments * kK * kB));
  for (float& v : xs) v = float(std::uniform_real_distribution<double>(-1, 1)(rng));
  for (size_t i = 0; i < ys.size(); ++i) {
    const auto row = std::span<const float>(xs).subspan(i * kI, kC);
    ys[i] = std::max_element(row.begin(), row.end()) - row.begin();
  }
  Curve c;
  c.device_allocs_setup = memory::device_allocations();
  for (int s = 0; s < kSegments; ++s) {
    {
      Segment seg = tape.segment();
      Tensor loss;
      for (int64_t t = 0; t < kK; ++t, tape.next_step()) {
        const size_t at = size_t(s * kK + t);
        Tensor x = tape.from(std::span<const float>(xs).subspan(at * kB * kI, kB * kI), {kB, kI});
        Tensor y = tape.from(std::span<const int64_t>(ys).subspan(at * kB, kB), {kB});
        h = gru_cell(x, h, p[0], p[1], p[2], p[3]);
        Tensor l = cross_entropy(add(matmul(h, p[4], false, true), p[5]), y);
        loss = t ? add(loss, l) : l;
      }
      seg.backward(loss);
      {
        NoGradGuard ng(tape);
        if (clip && optim == Optim::AdamCapturable) nn::clip_grad_norm(p, kMaxNorm, norm_sq);
        if (clip && optim == Optim::AdamHostCount) c.norm.push_back(nn::clip_grad_norm(p, kMaxNorm));
        if (adam) adam->step();
        else
          for (const Tensor& w : p) copy_into(w, sub(w, scale(w.grad_tensor(), kLearningRate)));
        copy_into(loss_value, reshape(loss, {1}));
      }
      tape.zero_grad();
      h = seg.carry(h);
    }
    c.loss.push_back(loss_value.item());  // after the segment: its graph (if any) has run
    c.peak.push_back(tape.stats().last_segment_peak);
  }
  c.device_allocs_end = memory::device_allocations();
  return c;
}

// Mean loss of the first and of the last five segments: each segment's loss is
// on fresh inputs, so one segment's is noisy (it rises 3 times in 19 here).
double early_loss(const Curve& c) { return std::accumulate(c.loss.begin(), c.loss.begin() + 5, 0.0) / 5; }
double late_loss(const Curve& c) { return std::accumulate(c.loss.end() - 5, c.loss.end(), 0.0) / 5; }

// It learns: the last five segments' loss at most 3/4 of the first five's
// (measured on the CPU: 12.58 -> 7.79, 0.62; seeds 1-5 gave 0.58-0.64).
constexpr double kLearnedRatio = 0.75;

// The CPU part (the problem learns) runs without a GPU, and in
// emulated_cuda_test (CI), where the emulated device's eager run must equal
// the CPU's and keep its memory fixed; graph replay needs the CUDA backend.
TEST(CudaTraining, TbpttTwentySegmentsMatchesCpuWithFixedMemoryAndReplayEqualsEager) {
  const Curve cpu = train(Device::cpu(), false);
  ASSERT_EQ(cpu.loss.size(), size_t(kSegments));
  EXPECT_LE(late_loss(cpu), kLearnedRatio * early_loss(cpu)) << "the CPU's loss does not fall: the problem does not learn";
  std::printf("loss on the CPU: %.6f -> %.6f, five-segment means %.4f -> %.4f (%.3f)\n", cpu.loss.front(),
              cpu.loss.back(), early_loss(cpu), late_loss(cpu), late_loss(cpu) / early_loss(cpu));
  REQUIRE_GPU();
  const Curve eager = train(Device::cuda(), false);
  ASSERT_EQ(eager.loss.size(), size_t(kSegments));
  for (int s = 0; s < kSegments; ++s) {
    // The CPU's float32 and float64 curves of this run agree to 1.0e-7 relative.
    EXPECT_NEAR(eager.loss[size_t(s)], cpu.loss[size_t(s)], 1e-4 * std::max(1.0, std::fabs(cpu.loss[size_t(s)])))
        << "segment " << s;
    EXPECT_EQ(eager.peak[size_t(s)], eager.peak[0]) << "segment " << s;
  }
  EXPECT_LE(late_loss(eager), kLearnedRatio * early_loss(eager)) << "it learns";
  EXPECT_EQ(eager.device_allocs_end, eager.device_allocs_setup) << "cudaMalloc after setup";
  // (On the emulated device every call runs eagerly; the schedule's
  // captures and signature checks are the CUDA backend's.)
  const Curve replay = train(Device::cuda(), true);
  ASSERT_EQ(replay.loss.size(), size_t(kSegments));
  for (int s = 0; s < kSegments; ++s) {
    // Captured (segments 2, 3) and replayed (4..20) segments run the eager kernels on the same data.
    EXPECT_EQ(replay.loss[size_t(s)], eager.loss[size_t(s)]) << "segment " << s;
    EXPECT_EQ(replay.peak[size_t(s)], eager.peak[0]) << "segment " << s;
  }
  EXPECT_EQ(replay.device_allocs_end, replay.device_allocs_setup) << "cudaMalloc after setup";
  std::printf("loss: CPU %.6f -> %.6f, CUDA %.6f -> %.6f, replayed %.6f -> %.6f; arena high-water %zu bytes\n",
              cpu.loss.front(), cpu.loss.back(), eager.loss.front(), eager.loss.back(), replay.loss.front(),
              replay.loss.back(), eager.peak[0]);
}

// Adam and clip_grad_norm inside a graph segment (issue 19 item 3): with
// the step count and the norm on the device (capturable) the update repeats
// its device calls, so the captured segment replays and equals eager bit for
// bit; with the count passed from the host, the replay's signature check
// refuses the first replayed step, and the host's clip its host read.
// The CPU part (capturable equals the host count, bit for bit) runs anywhere;
// the emulated device runs the rest with the CUDA backend's graph schedule
// and signature checks (its calls run eagerly).
TEST(CudaTraining, CapturableAdamInsideAGraphSegmentReplays) {
  const Curve host = train(Device::cpu(), false, Optim::AdamHostCount, true);
  const Curve counted = train(Device::cpu(), false, Optim::AdamCapturable, true);
  EXPECT_EQ(counted.loss, host.loss) << "the capturable clip and Adam equal the host's, bit for bit";
  EXPECT_LT(late_loss(host), early_loss(host)) << "Adam trains the problem";
  EXPECT_GT(*std::max_element(host.norm.begin(), host.norm.end()), kMaxNorm) << "the clip clips";
  EXPECT_EQ(train(Device::cpu(), false, Optim::AdamCapturable).loss, train(Device::cpu(), false, Optim::AdamHostCount).loss);
  REQUIRE_GPU();
  const Curve eager = train(Device::cuda(), false, Optim::AdamCapturable, true);
  // On the device too: the kernel's scalars from the count on the device are
  // the host's (update_math.h computes both with the same roundings, no pow).
  EXPECT_EQ(eager.loss, train(Device::cuda(), false, Optim::AdamHostCount, true).loss)
      << "the capturable clip and Adam equal the host count's on the device, bit for bit";
  for (int s = 0; s < kSegments; ++s)
    EXPECT_NEAR(eager.loss[size_t(s)], host.loss[size_t(s)], 1e-4 * std::max(1.0, std::fabs(host.loss[size_t(s)])))
        << "segment " << s;
  const Curve replay = train(Device::cuda(), true, Optim::AdamCapturable, true);
  EXPECT_EQ(replay.loss, eager.loss) << "captured and replayed segments, clip and Adam included, equal eager";
  EXPECT_EQ(replay.device_allocs_end, replay.device_allocs_setup) << "cudaMalloc after setup";
  try {
    (void)train(Device::cuda(), true, Optim::AdamHostCount);
    ADD_FAILURE() << "Adam with a host step count was replayed";
  } catch (const TapeError& e) {
    EXPECT_NE(std::string(e.what()).find("'adam_step'"), std::string::npos) << e.what();
  }
  try {
    (void)train(Device::cuda(), true, Optim::AdamHostCount, true);
    ADD_FAILURE() << "clip_grad_norm returning its norm to the host ran in a graph segment";
  } catch (const TapeError& e) {
    EXPECT_NE(std::string(e.what()).find("grad_squared_norm (clip_grad_norm) inside a CUDA-graph segment"), std::string::npos)
        << e.what();
  }
  std::printf("Adam in the segment: CPU %.6f -> %.6f, CUDA eager %.6f -> %.6f, replayed %.6f -> %.6f\n",
              host.loss.front(), host.loss.back(), eager.loss.front(), eager.loss.back(), replay.loss.front(),
              replay.loss.back());
}

// ------------------------------------------------------------------ errors

TEST(CudaErrors, WithoutAGpuTheTapeSaysWhy) {
  if (gpu_missing().empty()) GTEST_SKIP() << (kEmulated ? "the host-emulated device is on" : "a GPU is present");
  EXPECT_NE(gpu_missing().find("no CUDA GPU found (cudaGetDeviceCount: "), std::string::npos) << gpu_missing();
  EXPECT_THROW(Tape(Device::cuda()), DeviceError);
}

// TapeOptions::precision bf16 on the device: cuBLAS's bfloat16 GEMM
// (CudaBackend::gemm_bf16; the host-emulated device runs the CPU's code, to
// the bit). A matmul's value and gradients, in every transposition and as a
// one-row product, are bfloat16 values within a bfloat16 rounding of the
// CPU's bf16 tape (the same rounded operands; the GEMM adds its exact
// products in another order). gru_sequence under bf16 runs the fused
// kernels with bfloat16 products where their plan fits (an sm_90 GPU),
// else composes cells (never cuDNN's GRU, whose bfloat16 RNN keeps its
// state in bfloat16); a GRU over 12 steps, its output and weight
// gradients, stays within 1 % of the CPU's bf16 run either way (the fused
// kernels and, with kernels::Options::fused_gru off, the cells).
TEST(CudaBf16, ProductsAreTheCpusBf16Products) {
  REQUIRE_GPU();
  TapeOptions o = cuda_options();
  o.precision = Precision::Bf16;
  TapeOptions host;
  host.precision = Precision::Bf16;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  auto values = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = u(rng);
    return v;
  };
  auto near = [](const std::vector<double>& got, const std::vector<double>& want, double rel) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    for (size_t i = 0; i < got.size(); ++i) {
      if (kEmulated) {
        ASSERT_EQ(got[i], want[i]) << i;
      }
      ASSERT_EQ(double(bf16_round(float(got[i]))), got[i]) << i << ": not a bfloat16 value";
      // (an element near 0 after cancellation: the two GEMMs' float32 sums differ by up to K float32 roundings of the largest)
      ASSERT_NEAR(got[i], want[i], std::abs(want[i]) * rel + scale * std::ldexp(1.0, -14)) << i;
    }
  };
  struct Case {
    int64_t M, N, K;
    bool ta, tb;
  };
  for (const Case cs : {Case{5, 7, 9, false, false}, Case{5, 7, 9, true, false}, Case{6, 4, 33, true, true}, Case{1, 16, 24, false, false},
                        Case{64, 96, 128, false, true}}) {
    SCOPED_TRACE(testing::Message() << cs.M << "x" << cs.N << "x" << cs.K << " ta " << cs.ta << " tb " << cs.tb);
    const Shape sa = cs.ta ? Shape{cs.K, cs.M} : Shape{cs.M, cs.K}, sb = cs.tb ? Shape{cs.N, cs.K} : Shape{cs.K, cs.N};
    const std::vector<double> a = values(cs.M * cs.K), b = values(cs.K * cs.N), g = values(cs.M * cs.N);
    std::vector<double> out[2], da[2], db[2];
    for (const bool gpu : {false, true}) {
      Tape tape(gpu ? Device::cuda() : Device::cpu(), gpu ? o : host);
      Tensor pa = tape.parameter(sa), pb = tape.parameter(sb);
      set(pa, a), set(pb, b);
      {
        Segment seg = tape.segment();
        Tensor c = matmul(pa, pb, cs.ta, cs.tb);
        out[gpu] = get(c);
        Tensor gt = tape.zeros({cs.M, cs.N});
        set(gt, g);
        seg.backward(c, gt);
      }
      da[gpu] = get(pa.grad_tensor()), db[gpu] = get(pb.grad_tensor());
    }
    near(out[1], out[0], std::ldexp(1.0, -7));
    near(da[1], da[0], std::ldexp(1.0, -7));
    near(db[1], db[0], std::ldexp(1.0, -7));
  }
  constexpr int64_t T = 12, B = 16, I = 24, H = 64;
  const std::vector<double> x = values(T * B * I), h0 = values(B * H), w_ih = values(3 * H * I), w_hh = values(3 * H * H);
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "the fused kernels where they fit" : "fused_gru off: composed cells");
    kernels::Options ko = kernels::options();
    ko.fused_gru = fused;
    const kernels::Scope scope(ko);
    std::vector<double> run[2];
    for (const bool gpu : {false, true}) {
      Tape tape(gpu ? Device::cuda() : Device::cpu(), gpu ? o : host);
      EXPECT_EQ(gru_sequence_fused(tape, B, H, DType::F32), gpu && fused && !kEmulated && cuda::fused::device_plan(B, H, 4).use);
      Tensor wi = tape.parameter({3 * H, I}), wh = tape.parameter({3 * H, H}), bi = tape.parameter({3 * H}), bh = tape.parameter({3 * H});
      set(wi, w_ih), set(wh, w_hh);
      {
        Segment seg = tape.segment();
        Tensor xs = tape.zeros({T, B, I}), h = tape.zeros({B, H});
        set(xs, x), set(h, h0);
        Tensor y = gru_sequence(xs, h, wi, wh, bi, bh);
        run[gpu] = get(y);
        seg.backward(mean(mul(y, y)));
      }
      for (const Tensor* w : {&wi, &wh}) {
        const std::vector<double> gw = get(w->grad_tensor());
        run[gpu].insert(run[gpu].end(), gw.begin(), gw.end());
      }
    }
    double scale = 0, worst = 0;
    for (size_t i = 0; i < run[0].size(); ++i)
      scale = std::max(scale, std::abs(run[0][i])), worst = std::max(worst, std::abs(run[1][i] - run[0][i]));
    if (kEmulated) {
      EXPECT_EQ(run[1], run[0]);
    }
    EXPECT_LT(worst, 0.01 * scale) << "the GPU's bf16 GRU against the CPU's, the largest value " << scale;
  }
}

TEST(CudaErrors, HostAccessToDeviceMemorySaysUseToHost) {
  REQUIRE_GPU();
  Tape tape(Device::cuda(), cuda_options());
  Tensor p = tape.persistent({2, 3});
  try {
    (void)p.data<float>();
    FAIL() << "data<float>() on device memory did not raise";
  } catch (const TapeError& e) {
    EXPECT_NE(std::string(e.what()).find("to_host"), std::string::npos) << e.what();
  }
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  p.from_host(std::span<const float>(v));
  EXPECT_EQ(p.to_host<float>(), v);
  Segment seg = tape.segment();
  EXPECT_EQ(sum(tape.from(std::span<const float>(v), {6})).item(), 21.0);
}

TEST(CudaErrors, OutOfMemoryAtSetupNamesThePoolAndTheSize) {
  REQUIRE_CUDA_BACKEND();
  TapeOptions o = cuda_options();
  o.segment_budget = size_t(1) << 50;  // 1 PiB
  try {
    Tape tape(Device::cuda(), o);
    FAIL() << "a 1 PiB arena was reserved";
  } catch (const OutOfMemoryError& e) {
    EXPECT_STREQ(e.pool, kSegmentArenaPool);
    const std::string m = e.what();
    EXPECT_NE(m.find("out of device memory"), std::string::npos) << m;
    EXPECT_NE(m.find("segment arena (TapeOptions::segment_budget)"), std::string::npos) << m;
    EXPECT_NE(m.find("1125899906842624 bytes"), std::string::npos) << m;
  }
}

TEST(CudaErrors, IndexOutOfRangeFoundOnTheDeviceIsReportedAtTheNextSync) {
  REQUIRE_CUDA_BACKEND();
  Tape tape(Device::cuda(), cuda_options());
  Tensor w = tape.parameter({4, 3});
  Segment seg = tape.segment();
  const std::vector<int64_t> ix = {0, 99};
  (void)embedding(w, tape.from(std::span<const int64_t>(ix), {2}));
  try {
    tape.synchronize();
    FAIL() << "index 99 of 4 rows was not reported";
  } catch (const IndexError& err) {
    EXPECT_NE(std::string(err.what()).find("index 99 at position 1"), std::string::npos) << err.what();
  }
  const std::vector<int64_t> y = {7};
  Tensor l = cross_entropy(tape.from(std::span<const float>(std::vector<float>{0, 1, 2}), {1, 3}), tape.from(std::span<const int64_t>(y), {1}));
  EXPECT_THROW((void)l.item(), IndexError);
  tape.synchronize();  // reported once
}

TEST(CudaErrors, AnomalyModeFindsTheFirstNonFiniteValue) {
  REQUIRE_GPU();
  TapeOptions o = cuda_options();
  o.anomaly = true;
  Tape tape(Device::cuda(), o);
  Segment seg = tape.segment();
  const std::vector<float> v = {1, -1, 2};
  try {
    (void)log(tape.from(std::span<const float>(v), {3}));
    FAIL() << "log(-1) passed anomaly mode";
  } catch (const AnomalyError& e) {
    EXPECT_NE(std::string(e.what()).find("NaN at element 1"), std::string::npos) << e.what();
  }
}

TEST(CudaErrors, GraphReplayOfADifferentSegmentIsRefused) {
  REQUIRE_GPU();  // the emulated device keeps the same schedule and checks
  TapeOptions o = cuda_options();
  o.graph_replay = true;
  Tape tape(Device::cuda(), o);
  Tensor a = tape.parameter({4});
  Tensor out = tape.persistent({4});
  auto run = [&](double factor) {
    Segment seg = tape.segment();
    copy_into(out, scale(a, factor));
  };
  for (int s = 0; s < 4; ++s) run(2.0);  // eager, captured x2, replayed
  try {
    run(3.0);  // another scalar attribute: not the captured kernel
    FAIL() << "a different segment was replayed";
  } catch (const TapeError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA graph replay"), std::string::npos) << e.what();
  }
  tape.discard_graph();
  run(3.0);  // eager again
  tape.synchronize();
}

// tape.eager_segment() between graph segments: it runs eagerly (host reads
// allowed, other ops and shapes), the captured graphs stay and the next
// segment() replays them; it does not count as the warm-up after a discard.
// TapeStats counts the captures and replays.
TEST(CudaGraphs, AnEagerSegmentBetweenGraphSegmentsLeavesTheGraphsAlone) {
  REQUIRE_GPU();
  TapeOptions o = cuda_options();
  o.graph_replay = true;
  Tape tape(Device::cuda(), o);
  Tensor a = tape.parameter({4});
  a.from_host(std::span<const float>(std::vector<float>{1, 2, 3, 4}));
  Tensor out = tape.persistent({4});
  auto run = [&] {
    Segment seg = tape.segment();
    copy_into(out, scale(a, 2.0));
  };
  auto counts = [&] { return std::pair(tape.stats().graph_captures, tape.stats().graph_replays); };
  for (int s = 0; s < 4; ++s) run();  // eager, captured x2, replayed
  EXPECT_EQ(counts(), std::pair(uint64_t(2), uint64_t(1)));
  {
    Segment seg = tape.eager_segment();  // another op, another shape, a host read: all eager
    const Tensor y = scale(tape.from(std::span<const float>(std::vector<float>{5, 6}), {2}), 3.0);
    EXPECT_EQ(y.to_host<float>(), (std::vector<float>{15, 18}));
  }
  EXPECT_EQ(counts(), std::pair(uint64_t(2), uint64_t(1)));
  out.from_host(std::span<const float>(std::vector<float>(4, 0.0f)));
  run();  // replays the graph of its parity
  run();
  EXPECT_EQ(counts(), std::pair(uint64_t(2), uint64_t(3)));
  EXPECT_EQ(out.to_host<float>(), (std::vector<float>{2, 4, 6, 8}));
  tape.discard_graph();
  { Segment seg = tape.eager_segment(); }
  run();  // the warm-up (the eager segment was not)
  EXPECT_EQ(counts(), std::pair(uint64_t(2), uint64_t(3)));
  run();  // captured
  EXPECT_EQ(counts(), std::pair(uint64_t(3), uint64_t(3)));
  // Without graph replay eager_segment() is segment(), and nothing is counted.
  Tape plain(Device::cuda(), cuda_options());
  { Segment seg = plain.eager_segment(); }
  { Segment seg = plain.segment(); }
  EXPECT_EQ(plain.stats().segment_index, 2u);
  EXPECT_EQ(plain.stats().graph_captures + plain.stats().graph_replays, 0u);
}

// Two patterns of graph segments in their own slots (tape.graph_segment(0)
// and (1), as PPO's rollout and update windows): each slot captures its two
// graphs and replays them, the two patterns interleaved, with the right
// values; the same two patterns in one slot are refused at the first replay
// that differs; a slot past 1 is refused.
TEST(CudaGraphs, TwoSlotsKeepTheirOwnGraphs) {
  REQUIRE_GPU();
  TapeOptions o = cuda_options();
  o.graph_replay = true, o.graph_explicit = true;
  Tape tape(Device::cuda(), o);
  Tensor a = tape.parameter({4}), b = tape.parameter({8});
  a.from_host(std::span<const float>(std::vector<float>{1, 2, 3, 4}));
  b.from_host(std::span<const float>(std::vector<float>(8, 1.0f)));
  Tensor out_a = tape.persistent({4}), out_b = tape.persistent({8});
  auto run_a = [&](unsigned slot) {
    Segment seg = tape.graph_segment(slot);
    copy_into(out_a, scale(a, 2.0));
  };
  auto run_b = [&](unsigned slot) {
    Segment seg = tape.graph_segment(slot);
    copy_into(out_b, add(b, b));
  };
  for (int i = 0; i < 6; ++i) {  // A A B B, each pattern's segments at both parities
    run_a(0), run_a(0), run_b(1), run_b(1);
  }
  // the first segment the warm-up (eager), then A at parity 1, B at both, A at parity 0 captured; the 19 others replayed
  EXPECT_EQ(tape.stats().graph_captures, 4u);
  EXPECT_EQ(tape.stats().graph_replays, 19u);
  EXPECT_EQ(out_a.to_host<float>(), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(out_b.to_host<float>(), std::vector<float>(8, 2.0f));
  EXPECT_THROW(tape.graph_segment(2), Error);
  tape.discard_graph();
  run_a(0), run_a(0), run_a(0);  // the warm-up, then both of slot 0's graphs captured
  EXPECT_THROW(run_b(0), TapeError) << "another pattern in the same slot replays a graph it does not match";
  tape.discard_graph();
}

// What a graph segment cannot do, refused with its reason, on a GPU and on the
// emulated device (which keeps the CUDA backend's schedule and checks): host
// reads, synchronize, clip_grad_norm's norm, a replay that issues fewer calls
// than its capture (reported at the next segment: its graph did not run),
// tape.from() past graph_staging, discard_graph() inside a graph segment, and
// anomaly mode at setup.
TEST(CudaErrors, GraphSegmentsRefuseWhatAGraphCannotDo) {
  REQUIRE_GPU();
  const auto refused = [](const std::function<void()>& f, const std::string& fragment) {
    try {
      f();
      ADD_FAILURE() << "not refused: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  TapeOptions o = cuda_options();
  o.graph_replay = true;
  o.graph_staging = 4096;
  Tape tape(Device::cuda(), o);
  Tensor a = tape.parameter({4});
  Tensor out = tape.persistent({4});
  const std::vector<float> big(2048, 1.0f);
  auto run = [&](bool extra) {
    Segment seg = tape.segment();
    copy_into(out, scale(a, 2.0));
    if (extra) copy_into(out, scale(a, 2.0));
  };
  run(false);  // segment 1: eager
  {
    Segment seg = tape.segment();  // segment 2: captured
    Tensor y = scale(a, 2.0);
    refused([&] { (void)y.to_host<float>(); }, "reading a value on the host (item(), to_host()) inside a CUDA-graph segment");
    refused([&] { tape.synchronize(); }, "tape.synchronize() inside a CUDA-graph segment");
    refused([&] { (void)grad_squared_norm(a); }, "grad_squared_norm (clip_grad_norm) inside a CUDA-graph segment");
    refused([&] { tape.discard_graph(); }, "tape.discard_graph() inside a CUDA-graph segment");
    refused([&] { (void)tape.from(std::span<const float>(big), {2048}); }, "exceed TapeOptions::graph_staging");
  }
  tape.discard_graph();  // forget that capture: later segments repeat another one
  for (int s = 0; s < 3; ++s) run(true);  // eager, then captured x2
  run(false);                             // replayed with one call fewer: its graph does not run
  refused([&] { (void)out.to_host<float>(); }, " device calls where the captured segment ");
  run(true);  // the schedule goes on: a matching replay
  EXPECT_EQ(out.to_host<float>(), std::vector<float>(4, 0.0f));
  TapeOptions anomaly = o;
  anomaly.anomaly = true;
  refused([&] { Tape t(Device::cuda(), anomaly); }, "anomaly mode reads every op's output on the host");
}


}  // namespace
