// The fused GRU sequence's kernels (engine/cuda/fused_gru.h) run as a host
// simulation of their cluster: every block's shared memory, the lanes of each
// output and their butterfly sums, the cluster barriers between the phases,
// through the same per-thread functions the CUDA kernels call. Forward and
// backward must give the CPU's gru_sequence in float64 (values and every
// gradient), for cluster sizes 1 to 8, full and partial lane groups, with and
// without per-stream resets (keep). And the
// plan: which shapes run fused, and why the others do not. In every build
// (label `emulated`); the kernels themselves run only on a GPU (cuda_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "cuda/fused_gru.h"
#include "segtape/ops.h"
#include "segtape/tape.h"

using namespace segtape;
namespace fz = segtape::cuda::fused;

namespace {

// An H200's limits: 227 KiB of opt-in shared memory per block, clusters of
// 8, 132 multiprocessors.
const fz::Limits kH200{232448, 8, true, 132};

// Lane 0's value after the kernels' butterfly (lane l adds lane l ^ o's value).
template <class T>
T butterfly(std::vector<T> v, int S) {
  for (int o = S / 2; o > 0; o >>= 1) {
    std::vector<T> w = v;
    for (int l = 0; l < S; ++l) w[size_t(l)] = v[size_t(l)] + v[size_t(l ^ o)];
    v = w;
  }
  return v[0];
}

struct Problem {
  int64_t T, B, I, H;
  std::vector<double> x, h0, w_ih, w_hh, b_ih, b_hh, gout;
  std::vector<double> keep;  // [T, B] per-stream resets, or empty
};

Problem draw(int64_t T, int64_t B, int64_t I, int64_t H, unsigned seed) {
  std::mt19937 g(seed);
  const double k = 1 / std::sqrt(double(H));  // PyTorch's GRU scale: well-conditioned
  auto fill = [&](int64_t n, double r) {
    std::uniform_real_distribution<double> u(-r, r);
    std::vector<double> v(static_cast<size_t>(n));
    for (double& e : v) e = u(g);
    return v;
  };
  return {T, B, I, H, fill(T * B * I, 1), fill(B * H, 1), fill(3 * H * I, k), fill(3 * H * H, k),
          fill(3 * H, k), fill(3 * H, k), fill(T * B * H, 1), {}};
}

struct Result {
  std::vector<double> y, dx, dh0, dw_ih, dw_hh, db_ih, db_hh;
};

template <class T>
std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// The CPU's gru_sequence, float64 (or float32 at a precision): y, and the
// gradients of sum(y * gout).
template <class T = double>
Result cpu_reference(const Problem& p, Precision precision = Precision::F32) {
  constexpr DType kD = std::is_same_v<T, double> ? DType::F64 : DType::F32;
  Tape tape(Device::cpu(), TapeOptions{.precision = precision});
  auto param = [&](const Shape& s, const std::vector<double>& v) {
    Tensor t = tape.parameter(s, kD);
    t.from_host(std::span<const T>(as<T>(v)));
    return t;
  };
  Tensor x = param({p.T, p.B, p.I}, p.x), h0 = param({p.B, p.H}, p.h0), wi = param({3 * p.H, p.I}, p.w_ih),
         wh = param({3 * p.H, p.H}, p.w_hh), bi = param({3 * p.H}, p.b_ih), bh = param({3 * p.H}, p.b_hh);
  Tensor go = tape.persistent({p.T, p.B, p.H}, kD);
  go.from_host(std::span<const T>(as<T>(p.gout)));
  Tensor keep;
  if (!p.keep.empty()) {
    keep = tape.persistent({p.T, p.B}, kD);
    keep.from_host(std::span<const T>(as<T>(p.keep)));
  }
  Segment seg = tape.segment();
  Tensor y = gru_sequence(x, h0, wi, wh, bi, bh, keep);
  const auto host = [](const Tensor& t) {
    const std::vector<T> v = t.to_host<T>();
    return std::vector<double>(v.begin(), v.end());
  };
  Result r;
  r.y = host(y);
  seg.backward(sum(mul(y, go)));
  r.dx = host(x.grad_tensor()), r.dh0 = host(h0.grad_tensor());
  r.dw_ih = host(wi.grad_tensor()), r.dw_hh = host(wh.grad_tensor());
  r.db_ih = host(bi.grad_tensor()), r.db_hh = host(bh.grad_tensor());
  return r;
}

template <class T>
void run_clusters(const fz::Args<T>& all, const fz::Plan& plan);
template <class T>
void run_grid(const fz::Args<T>& all, const fz::Plan& plan);

// The fused path as the CUDA backend runs it (gru_sequence.cpp), with the
// kernels simulated block by block and the GEMMs around them written out;
// in float64, or in float32 with bfloat16 products (Args::bf16: the GEMMs'
// operands and results rounded as gemm_bf16's).
template <class T = double>
Result simulate(const Problem& p, const fz::Plan& plan, bool bf16 = false) {
  const int64_t T_ = p.T, B = p.B, I = p.I, H = p.H, R = 3 * H;
  const auto rd = [&](T v) { return bf16 ? T(fz::bf16_value(v)) : v; };
  const std::vector<T> x = as<T>(p.x), h0 = as<T>(p.h0), w_ih = as<T>(p.w_ih), w_hh = as<T>(p.w_hh), b_ih = as<T>(p.b_ih),
                       b_hh = as<T>(p.b_hh), gout = as<T>(p.gout), keep = as<T>(p.keep);
  EXPECT_EQ(plan.G * plan.Bg, B) << "the clusters' rows are the batch";
  std::vector<T> gi(size_t(T_ * B * R), 0), y(size_t(T_ * B * H)), saved(size_t(T_ * B * 4 * H));
  for (int64_t row = 0; row < T_ * B; ++row)  // gi = x W_ih^T over all steps (one GEMM)
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t i = 0; i < I; ++i) gi[size_t(row * R + r)] += rd(x[size_t(row * I + i)]) * rd(w_ih[size_t(r * I + i)]);
      gi[size_t(row * R + r)] = rd(gi[size_t(row * R + r)]);
    }
  std::vector<T> dgi(size_t(T_ * B * R), NAN), dgh(size_t(T_ * B * R), NAN), dh0(size_t(B * H), NAN), hk(size_t(T_ * B * H), NAN);
  std::fill(y.begin(), y.end(), NAN);
  fz::Args<T> all{};  // the whole batch's, as gru_sequence.cpp passes them
  all.steps = T_, all.B = plan.Bg, all.ld = B, all.H = H, all.Hs = plan.Hs, all.S = plan.S, all.bf16 = bf16;
  all.gi = gi.data(), all.w_hh = w_hh.data(), all.b_ih = b_ih.data(), all.b_hh = b_hh.data(), all.h0 = h0.data();
  all.y = y.data(), all.saved = saved.data();
  all.keep = keep.empty() ? nullptr : keep.data();
  all.gout = gout.data(), all.dgi = dgi.data(), all.dgh = dgh.data(), all.dh0 = dh0.data();
  all.hk = all.keep ? hk.data() : nullptr;
  if (plan.grid) {
    run_grid(all, plan);
  } else {
    run_clusters(all, plan);
  }
  const fz::Args<T>& a = all;

  // the GEMMs and column sums after the backward launch
  std::vector<T> dx(size_t(T_ * B * I), 0), dw_ih(size_t(R * I), 0), dw_hh(size_t(R * H), 0), db_ih(size_t(R), 0), db_hh(size_t(R), 0);
  std::vector<T> dw_hh_y(size_t(R * H), 0);  // without keep, dW_hh is two GEMMs (h0's rows, then y's), each rounded
  for (int64_t row = 0; row < T_ * B; ++row) {  // with keep, dW_hh's rows are the masked states the kernel wrote
    const T* hp = a.hk ? &hk[size_t(row * H)] : row < B ? &h0[size_t(row * H)] : &y[size_t((row - B) * H)];
    for (int64_t q = 0; q < R; ++q) {
      const T di = dgi[size_t(row * R + q)], dh = dgh[size_t(row * R + q)];
      for (int64_t i = 0; i < I; ++i) {
        dx[size_t(row * I + i)] += rd(di) * rd(w_ih[size_t(q * I + i)]);
        dw_ih[size_t(q * I + i)] += rd(di) * rd(x[size_t(row * I + i)]);
      }
      for (int64_t k = 0; k < H; ++k) (a.hk || row < B ? dw_hh : dw_hh_y)[size_t(q * H + k)] += rd(dh) * rd(hp[k]);
      db_ih[size_t(q)] += di, db_hh[size_t(q)] += dh;
    }
  }
  const auto out = [&](const std::vector<T>& v, bool product) {
    std::vector<double> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = double(product ? rd(v[i]) : v[i]);
    return o;
  };
  for (size_t i = 0; i < dw_hh.size(); ++i) dw_hh[i] = rd(dw_hh[i]) + rd(dw_hh_y[i]);
  Result r;
  r.y = out(y, false), r.dh0 = out(dh0, false);
  r.dx = out(dx, true), r.dw_ih = out(dw_ih, true), r.dw_hh = out(dw_hh, false);
  r.db_ih = out(db_ih, false), r.db_hh = out(db_hh, false);
  return r;
}

// The cluster plan's launches: its clusters one after the other (they share
// nothing: any order is theirs), each block's shared memory, the cluster
// barriers between the phases.
template <class T>
void run_clusters(const fz::Args<T>& all, const fz::Plan& plan) {
  const int64_t steps = all.steps, H = all.H;
  const int C = plan.C, S = plan.S;
  const int64_t outs = plan.Bg * plan.Hs;  // outputs per block
  for (int g = plan.G - 1; g >= 0; --g) {
    fz::Args<T> a = fz::group_args(all, g);
    std::vector<std::vector<T>> sm(static_cast<size_t>(C));
    auto remote = [&](int rank) -> const T* { return sm[size_t(rank)].data(); };
    auto who = [&](int c, int64_t o, int lane) { return fz::who(a, c, int(o * S + lane)); };

    // forward
    for (int c = 0; c < C; ++c) {
      sm[size_t(c)].assign(size_t(std::max(fz::FwdSmem(a.B, H, plan.Hs, S).total, fz::BwdSmem(a.B, H, plan.Hs, S).total)), NAN);
      fz::fwd_load(a, sm[size_t(c)].data(), c, 0, 1);
    }
    // Block c's work of step t before the step's barrier (publishes into slot `buf`).
    auto fwd_compute = [&](int c, int64_t t, int buf) {
      for (int64_t o = 0; o < outs; ++o) {
        std::vector<T> part[3];
        for (int lane = 0; lane < S; ++lane) {
          T acc[3];
          fz::fwd_partial(a, sm[size_t(c)].data(), who(c, o, lane), acc);
          for (int k = 0; k < 3; ++k) part[k].push_back(acc[k]);
        }
        const T gh[3] = {butterfly(part[0], S), butterfly(part[1], S), butterfly(part[2], S)};
        const fz::Who w = who(c, o, 0);
        fz::fwd_finish(a, sm[size_t(c)].data(), w, t, gh, buf, fz::fwd_inputs(a, w, t), fz::fwd_bias(a, w));
      }
      fz::fwd_stage_keep(a, sm[size_t(c)].data(), t, 0, 1);
    };
    // The barriers allow a block to run ahead: after step t's barrier, block 0
    // gathers and computes step t + 1 (up to its next barrier) before any other
    // block gathers step t; a slot or a barrier too few would show here.
    for (int c = 0; c < C; ++c) fwd_compute(c, 0, 0);
    for (int64_t t = 0; t < steps; ++t) {
      const int buf = int(t % 2);
      fz::fwd_gather(a, sm[0].data(), 0, 1, buf, remote);
      if (t + 1 < steps) fwd_compute(0, t + 1, buf ^ 1);
      for (int c = 1; c < C; ++c) fz::fwd_gather(a, sm[size_t(c)].data(), 0, 1, buf, remote);
      for (int c = 1; c < C; ++c)
        if (t + 1 < steps) fwd_compute(c, t + 1, buf ^ 1);
    }

    // backward
    for (int c = 0; c < C; ++c) {  // NaN first: a read before backward's own write shows
      std::fill(sm[size_t(c)].begin(), sm[size_t(c)].end(), NAN);
      fz::bwd_load(a, sm[size_t(c)].data(), c, 0, 1);
    }
    std::vector<T> carry(size_t(C * outs), 0), direct(size_t(C * outs)), factor(size_t(C * outs));
    auto bwd_before = [&](int c, int64_t t, int buf) {  // before step t's barrier
      for (int64_t o = 0; o < outs; ++o) {
        const fz::BwdIn<T> in = fz::bwd_inputs(a, who(c, o, 0), t);
        direct[size_t(c * outs + o)] = fz::bwd_gates(a, sm[size_t(c)].data(), who(c, o, 0), t, carry[size_t(c * outs + o)], buf, in);
        factor[size_t(c * outs + o)] = in.k;
      }
    };
    auto bwd_after = [&](int c, int buf) {  // after it: gather, then the carried dh
      fz::bwd_gather(a, sm[size_t(c)].data(), 0, 1, buf, remote);
      for (int64_t o = 0; o < outs; ++o) {
        std::vector<T> part(static_cast<size_t>(S));
        for (int lane = 0; lane < S; ++lane) part[size_t(lane)] = fz::bwd_partial(a, sm[size_t(c)].data(), who(c, o, lane));
        carry[size_t(c * outs + o)] = fz::bwd_carry(a, direct[size_t(c * outs + o)], butterfly(part, S), factor[size_t(c * outs + o)]);
      }
    };
    for (int c = 0; c < C; ++c) bwd_before(c, steps - 1, 0);
    for (int64_t t = steps - 1, k = 0; t >= 0; --t, ++k) {  // block 0 runs ahead again
      const int buf = int(k % 2);
      bwd_after(0, buf);
      if (t > 0) bwd_before(0, t - 1, buf ^ 1);
      for (int c = 1; c < C; ++c) bwd_after(c, buf);
      for (int c = 1; c < C; ++c)
        if (t > 0) bwd_before(c, t - 1, buf ^ 1);
    }
    for (int c = 0; c < C; ++c)  // as the kernel writes dh0: through the cluster's pointer
      for (int64_t o = 0; o < outs; ++o) {
        const fz::Who w = who(c, o, 0);
        a.dh0[w.b * H + w.j] = carry[size_t(c * outs + o)];
      }
  }
}

// The grid plan's launches: G C blocks, each with its shared memory, the
// grid barrier of each step between the phases, the step's vector read from
// the arrays other blocks wrote (y, dgh), a tile at a time. A barrier
// allows a block to run ahead: after step t's barrier, block 0 does all of
// step t + 1 (up to its barrier) before any other block starts it, and the
// other blocks run in reverse order; a read of an array before its step's
// barrier would show (the arrays start as NaN).
template <class T>
void run_grid(const fz::Args<T>& all, const fz::Plan& plan) {
  const int64_t steps = all.steps, H = all.H, kt = plan.kt;
  const int C = plan.C, S = plan.S, nb = plan.G * plan.C;
  const int64_t outs = plan.Bg * plan.Hs;
  auto args = [&](int blk) { return fz::group_args(all, blk / C); };
  auto who = [&](int blk, int64_t o, int lane) { return fz::who(args(blk), blk % C, int(o * S + lane)); };
  std::vector<std::vector<T>> sm(static_cast<size_t>(nb));
  const int64_t words = std::max(fz::GridSmem(false, plan.Bg, H, plan.Hs, S, kt).total, fz::GridSmem(true, plan.Bg, H, plan.Hs, S, kt).total);
  EXPECT_EQ(size_t(words) * sizeof(T), std::max(plan.fwd_smem, plan.bwd_smem)) << "the plan's shared memory (planned in float64)";
  // forward
  for (int blk = 0; blk < nb; ++blk) {
    sm[size_t(blk)].assign(size_t(words), NAN);
    fz::fwd_load_w(args(blk), sm[size_t(blk)].data(), blk % C, 0, 1);
  }
  auto fwd_step = [&](int blk, int64_t t) {
    const fz::Args<T> a = args(blk);
    T* m = sm[size_t(blk)].data();
    std::vector<T> acc(size_t(outs * S * 3), 0.0);
    for (int64_t k0 = 0; k0 < H; k0 += kt) {
      fz::grid_fwd_tile(a, m, kt, t, k0, 0, 1);
      for (int64_t o = 0; o < outs; ++o)
        for (int lane = 0; lane < S; ++lane) fz::grid_fwd_partial(a, m, kt, who(blk, o, lane), k0, &acc[size_t((o * S + lane) * 3)]);
    }
    for (int64_t o = 0; o < outs; ++o) {
      T gh[3];
      for (int k = 0; k < 3; ++k) {
        std::vector<T> part(static_cast<size_t>(S));
        for (int lane = 0; lane < S; ++lane) part[size_t(lane)] = acc[size_t((o * S + lane) * 3 + k)];
        gh[k] = butterfly(part, S);
      }
      const fz::Who w = who(blk, o, 0);
      fz::grid_fwd_finish(a, w, t, gh, fz::fwd_inputs(a, w, t), fz::fwd_bias(a, w));
    }
  };
  for (int blk = nb - 1; blk >= 0; --blk) fwd_step(blk, 0);
  for (int64_t t = 0; t + 1 < steps; ++t) {  // after step t's barrier
    fwd_step(0, t + 1);
    for (int blk = nb - 1; blk >= 1; --blk) fwd_step(blk, t + 1);
  }
  // backward
  for (int blk = 0; blk < nb; ++blk) {
    std::fill(sm[size_t(blk)].begin(), sm[size_t(blk)].end(), NAN);
    fz::bwd_load(args(blk), sm[size_t(blk)].data(), blk % C, 0, 1);
  }
  std::vector<T> carry(size_t(nb * outs), 0), direct(size_t(nb * outs)), factor(size_t(nb * outs));
  auto bwd_before = [&](int blk, int64_t t) {  // before step t's barrier: the gate gradients, dgh[t]
    const fz::Args<T> a = args(blk);
    for (int64_t o = 0; o < outs; ++o) {
      const fz::BwdIn<T> in = fz::bwd_inputs(a, who(blk, o, 0), t);
      direct[size_t(blk * outs + o)] = fz::grid_bwd_gates(a, who(blk, o, 0), t, carry[size_t(blk * outs + o)], in);
      factor[size_t(blk * outs + o)] = in.k;
    }
  };
  auto bwd_after = [&](int blk, int64_t t) {  // after it: dgh[t] W_hh in tiles, the carried dh
    const fz::Args<T> a = args(blk);
    T* m = sm[size_t(blk)].data();
    std::vector<T> acc(size_t(outs * S), 0.0);
    for (int64_t r0 = 0; r0 < 3 * H; r0 += kt) {
      fz::grid_bwd_tile(a, m, kt, t, r0, 0, 1);
      for (int64_t o = 0; o < outs; ++o)
        for (int lane = 0; lane < S; ++lane)
          acc[size_t(o * S + lane)] = fz::grid_bwd_partial(a, m, kt, who(blk, o, lane), r0, acc[size_t(o * S + lane)]);
    }
    for (int64_t o = 0; o < outs; ++o) {
      const std::vector<T> part(acc.begin() + o * S, acc.begin() + (o + 1) * S);
      carry[size_t(blk * outs + o)] = fz::bwd_carry(a, direct[size_t(blk * outs + o)], butterfly(part, S), factor[size_t(blk * outs + o)]);
    }
  };
  for (int blk = nb - 1; blk >= 0; --blk) bwd_before(blk, steps - 1);
  for (int64_t t = steps - 1; t >= 0; --t) {  // block 0 runs ahead again
    bwd_after(0, t);
    if (t > 0) bwd_before(0, t - 1);
    for (int blk = nb - 1; blk >= 1; --blk) bwd_after(blk, t);
    for (int blk = nb - 1; blk >= 1; --blk)
      if (t > 0) bwd_before(blk, t - 1);
  }
  for (int blk = 0; blk < nb; ++blk)
    for (int64_t o = 0; o < outs; ++o) {
      const fz::Who w = who(blk, o, 0);
      args(blk).dh0[w.b * H + w.j] = carry[size_t(blk * outs + o)];
    }
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / std::max(den, 1e-300);
}

// The largest differences allowed, relative to the largest value of each.
struct Bounds {
  double y, dh0, dx, dw, db;
};
void expect_within(const Result& got, const Result& want, const Bounds& b) {
  EXPECT_LE(rel_diff(got.y, want.y), b.y) << "y";
  EXPECT_LE(rel_diff(got.dx, want.dx), b.dx) << "dx";
  EXPECT_LE(rel_diff(got.dh0, want.dh0), b.dh0) << "dh0";
  EXPECT_LE(rel_diff(got.dw_ih, want.dw_ih), b.dw) << "dW_ih";
  EXPECT_LE(rel_diff(got.dw_hh, want.dw_hh), b.dw) << "dW_hh";
  EXPECT_LE(rel_diff(got.db_ih, want.db_ih), b.db) << "db_ih";
  EXPECT_LE(rel_diff(got.db_hh, want.db_hh), b.db) << "db_hh";
}
// The simulation against the CPU in float64: values to 1e-12, every gradient to 1e-10.
void expect_same(const Result& got, const Result& want) { expect_within(got, want, {1e-12, 1e-10, 1e-10, 1e-10, 1e-10}); }

// The clusters of an H200's plans (one per row where the multiprocessors
// allow), and the same shapes as one cluster (a device of one multiprocessor:
// every row in each block) and on 8 multiprocessors (rows and units split).
TEST(FusedGru, SimulatedClusterEqualsTheCpuInFloat64) {
  struct Case {
    int64_t T, B, I, H;
    int C, S, G;  // the plan expected for an H200
  };
  const Case cases[] = {
      {1, 1, 3, 8, 1, 32, 1},      // one step, one block
      {9, 1, 5, 128, 4, 32, 1},    // the agent's (1, 128): 4 blocks of 32 units, a warp per output
      {6, 32, 7, 128, 4, 32, 32},  // (32, 128): a cluster of 4 blocks per row
      {5, 11, 4, 3, 1, 32, 11},    // 3 outputs of 32 lanes per cluster
      {5, 11, 4, 6, 1, 32, 11},
      {7, 3, 6, 40, 1, 16, 3},     // 40 outputs of 16 lanes: 640 threads
      {4, 6, 5, 64, 1, 16, 6},
      {4, 6, 5, 128, 4, 32, 6},
  };
  const fz::Limits one_cluster{kH200.smem, 8, true, 1}, eight{kH200.smem, 8, true, 8};
  int split_both = 0;  // plans with several clusters of several blocks, each of several rows
  for (const Case& k : cases)
    for (const fz::Limits& lim : {kH200, one_cluster, eight}) {
      SCOPED_TRACE("T " + std::to_string(k.T) + ", B " + std::to_string(k.B) + ", I " + std::to_string(k.I) + ", H " +
                   std::to_string(k.H) + ", " + std::to_string(lim.sms) + " multiprocessors");
      const fz::Plan plan = fz::plan(k.B, k.H, sizeof(double), lim);
      ASSERT_TRUE(plan.use) << plan.why_not;
      if (&lim == &kH200) {
        EXPECT_EQ(plan.C, k.C);
        EXPECT_EQ(plan.S, k.S);
        EXPECT_EQ(plan.G, k.G);
      }
      if (lim.sms == 1) {
        EXPECT_EQ(plan.G, 1);
      }
      EXPECT_LE(plan.G * plan.C, std::max(lim.sms, plan.C));
      split_both += plan.G > 1 && plan.C > 1 && plan.Bg > 1;
      const Problem p = draw(k.T, k.B, k.I, k.H, unsigned(k.T * 1000 + k.H));
      const Result want = cpu_reference(p), got = simulate(p, plan);
      expect_same(got, want);
    }
  EXPECT_GE(split_both, 1);
}

// Per-stream resets inside the launch (gru_sequence's keep): the simulated
// cluster against the CPU's gru_sequence with the same keep (gru_cell steps
// with the state masked), in float64. keep holds zeros (episode ends, also
// at step 0 and in the last step), ones, and factors in between (the op
// takes any factor); a reset must cut the gradient too, which a dh0 of zero
// for streams reset at step 0 shows.
TEST(FusedGru, SimulatedClusterWithResetsEqualsTheCpuInFloat64) {
  struct Case {
    int64_t T, B, I, H;
  };
  const Case cases[] = {{9, 1, 5, 128}, {6, 32, 7, 128}, {5, 11, 4, 6}, {7, 3, 6, 40}, {1, 4, 3, 8}};
  for (const Case& k : cases) {
    SCOPED_TRACE("T " + std::to_string(k.T) + ", B " + std::to_string(k.B) + ", I " + std::to_string(k.I) + ", H " +
                 std::to_string(k.H));
    for (const int sms : {kH200.sms, 1}) {
      SCOPED_TRACE(std::to_string(sms) + " multiprocessors");
      const fz::Plan plan = fz::plan(k.B, k.H, sizeof(double), {kH200.smem, 8, true, sms});
      ASSERT_TRUE(plan.use) << plan.why_not;
      Problem p = draw(k.T, k.B, k.I, k.H, unsigned(k.T * 77 + k.B));
      std::mt19937 g(unsigned(k.H));
      p.keep.resize(size_t(k.T * k.B));
      for (int64_t t = 0; t < k.T; ++t)
        for (int64_t b = 0; b < k.B; ++b) {
          const unsigned u = g() % 8;
          p.keep[size_t(t * k.B + b)] = u < 2 ? 0.0 : u == 2 ? 0.5 : 1.0;
        }
      p.keep[0] = 0;                                 // stream 0 starts from zero: h0 reaches nothing of it
      p.keep[size_t((k.T - 1) * k.B + k.B - 1)] = 0;  // a reset in the last step
      const Result want = cpu_reference(p), got = simulate(p, plan);
      expect_same(got, want);
      for (int64_t j = 0; j < k.H; ++j) EXPECT_EQ(got.dh0[size_t(j)], 0.0) << "dh0 of the stream reset at step 0, unit " << j;
      // and the resets matter: without them the same problem gives other values
      Problem plain = p;
      plain.keep.clear();
      EXPECT_GT(rel_diff(simulate(plain, plan).y, want.y), 1e-3);
    }
  }
}

TEST(FusedGru, PlanRunsFusedWhereTheWeightsFitAndSaysWhyNotElsewhere) {
  // issue 19's sizes in float32 on an H200
  const fz::Plan a = fz::plan(1, 128, 4, kH200), b = fz::plan(32, 128, 4, kH200);
  ASSERT_TRUE(a.use && b.use);
  EXPECT_EQ(std::tuple(a.G, a.C, a.threads), std::tuple(1, 4, 1024));
  EXPECT_EQ(std::tuple(b.G, b.Bg, b.C, b.threads), std::tuple(32, int64_t(1), 4, 1024));  // 128 of 132 multiprocessors
  EXPECT_LE(b.bwd_smem, kH200.smem);
  const fz::Plan one = fz::plan(32, 128, 4, {kH200.smem, 8, true, 1});  // one cluster: every row in each block
  EXPECT_EQ(std::tuple(one.G, one.Bg, one.C, one.S), std::tuple(1, int64_t(32), 8, 2));
  EXPECT_FALSE(fz::plan(64, 1024, 4, kH200).use);  // cuDNN's path
  EXPECT_FALSE(fz::plan(32, 512, 4, kH200).use);
  const fz::Plan big = fz::plan(1, 512, 4, kH200);  // W_hh 3 MiB: 384 KiB a block at 8
  EXPECT_FALSE(big.use);
  EXPECT_NE(big.why_not.find("W_hh (3145728 bytes)"), std::string::npos) << big.why_not;
  const fz::Plan wide = fz::plan(1024, 64, 4, {kH200.smem, 8, true, 1});  // one cluster: 1024 rows x 8 units per block > 1024 threads
  EXPECT_FALSE(wide.use);
  EXPECT_NE(wide.why_not.find("1024 threads"), std::string::npos) << wide.why_not;
  const fz::Plan rows = fz::plan(1024, 64, 4, kH200);  // 128 clusters of 8 rows
  EXPECT_EQ(std::tuple(rows.use, rows.G, rows.Bg, rows.C), std::tuple(true, 128, int64_t(8), 1));
  const fz::Plan old = fz::plan(1, 128, 4, {232448, 8, false});
  EXPECT_FALSE(old.use);
  EXPECT_NE(old.why_not.find("compute capability 9.0"), std::string::npos) << old.why_not;
  const fz::Plan small = fz::plan(1, 128, 4, {232448, 2, true});  // a cluster of 2 at most
  ASSERT_TRUE(small.use);
  EXPECT_LE(small.C, 2);
  // every plan's cluster divides H and its lanes are a power of two
  for (int64_t H : {1, 3, 6, 40, 70, 96, 128, 192, 256})
    for (int64_t B : {1, 2, 5, 16, 32, 64})
      for (size_t e : {size_t(4), size_t(8)}) {
        const fz::Plan p = fz::plan(B, H, e, kH200);
        if (!p.use) continue;
        EXPECT_EQ(H % p.C, 0);
        EXPECT_EQ(p.G * p.Bg, B);
        EXPECT_LE(p.G * p.C, std::max(kH200.sms, p.C));
        EXPECT_EQ(p.S & (p.S - 1), 0);
        EXPECT_LE(p.threads, 1024);
        EXPECT_LE(std::max(p.fwd_smem, p.bwd_smem), kH200.smem);
      }
}

// The grid plan (W_hh over the blocks of a cooperative grid, the step's
// vector streamed in tiles), simulated block by block against the CPU in
// float64: one tile and several (the last one partial), lane groups of 32
// down to 1, one group of rows and several, with and without resets. Each
// of these mutations of fused_gru.h's grid functions fails it (tried by
// hand when it was written): the state read from y[t] instead of y[t - 1];
// a tile without its keep factor; the last term of each tile dropped; the
// backward tile's offset r0 ignored; the offset into W^T ignored; h_{t-1}
// in the gates without its keep factor; every block loading block 0's rows
// of W_hh; one gate's dgh written twice.
TEST(FusedGru, SimulatedGridEqualsTheCpuInFloat64) {
  struct Case {
    int64_t T, B, I, H;
    int sms;
    bool tight;  // shared memory for tiles of 32 only
  };
  const Case cases[] = {
      {5, 3, 4, 40, 8, false},  // one tile (kt 256 > H)
      {4, 2, 3, 96, 6, true},   // 3 tiles forward, 9 backward
      {3, 4, 5, 70, 7, true},   // the last tile partial (70 = 2 x 32 + 6; 210 = 6 x 32 + 18)
      {6, 8, 3, 24, 16, false}, // rows in groups (G > 1)
      {4, 5, 2, 64, 2, true},   // few blocks: many outputs a block, lanes below 32
      {2, 1, 3, 8, 3, false},
      {2, 20, 3, 40, 1, false},  // one block of 800 outputs: one lane each
  };
  int multi_tile = 0, groups = 0, lanes_below_32 = 0, one_lane = 0;
  for (const Case& k : cases)
    for (const bool resets : {false, true}) {
      SCOPED_TRACE("T " + std::to_string(k.T) + ", B " + std::to_string(k.B) + ", I " + std::to_string(k.I) + ", H " +
                   std::to_string(k.H) + ", " + std::to_string(k.sms) + " multiprocessors" + (resets ? ", resets" : ""));
      fz::Limits lim{kH200.smem, 8, false, k.sms, true};  // no clusters: the grid plan
      fz::Plan plan = fz::best_plan(k.B, k.H, sizeof(double), lim);
      ASSERT_TRUE(plan.use && plan.grid) << plan.why_not;
      if (k.tight) {  // as little shared memory as tiles of 32 need
        lim.smem = size_t(std::max(fz::GridSmem(false, plan.Bg, k.H, plan.Hs, plan.S, 32).total,
                                   fz::GridSmem(true, plan.Bg, k.H, plan.Hs, plan.S, 32).total)) * sizeof(double);
        plan = fz::best_plan(k.B, k.H, sizeof(double), lim);
        ASSERT_TRUE(plan.use && plan.grid) << plan.why_not;
        EXPECT_EQ(plan.kt, 32);
      }
      EXPECT_EQ(plan.G * plan.Bg, k.B);
      EXPECT_LE(plan.G * plan.C, k.sms);
      multi_tile += plan.kt < k.H;
      groups += plan.G > 1;
      lanes_below_32 += plan.S < 32;
      one_lane += plan.S == 1;
      Problem p = draw(k.T, k.B, k.I, k.H, unsigned(k.T * 31 + k.H));
      if (resets) {
        std::mt19937 g(unsigned(k.B));
        p.keep.resize(size_t(k.T * k.B));
        for (double& v : p.keep) {
          const unsigned u = g() % 8;
          v = u < 2 ? 0.0 : u == 2 ? 0.5 : 1.0;
        }
        p.keep[0] = 0;  // stream 0 starts from zero
      }
      const Result want = cpu_reference(p), got = simulate(p, plan);
      expect_same(got, want);
      if (resets) {
        for (int64_t j = 0; j < k.H; ++j) EXPECT_EQ(got.dh0[size_t(j)], 0.0) << "dh0 of the stream reset at step 0, unit " << j;
      }
    }
  EXPECT_GE(multi_tile, 4);
  EXPECT_GE(groups, 2);
  EXPECT_GE(lanes_below_32, 2);
  EXPECT_GE(one_lane, 1);
}

TEST(FusedGru, GridPlanTakesWhatNoClusterHoldsAndSaysWhyNot) {
  const fz::Limits h200{kH200.smem, 8, true, 132, true};
  // issue 51's larger sizes in float32: W_hh 3 and 12 MiB, over 32 and 128 blocks
  const fz::Plan a = fz::best_plan(64, 1024, 4, h200), b = fz::best_plan(32, 512, 4, h200);
  ASSERT_TRUE(a.use && a.grid) << a.why_not;
  ASSERT_TRUE(b.use && b.grid) << b.why_not;
  // 2 groups of 32 rows x 64 blocks of 16 units (as few terms a block as 1 x 128 of 8, half the reads from L2)
  EXPECT_EQ(std::tuple(a.G, a.Bg, a.C, a.Hs, a.S), std::tuple(2, int64_t(32), 64, int64_t(16), 2));
  EXPECT_LE(a.G * a.C, 132);
  EXPECT_LE(std::max(a.fwd_smem, a.bwd_smem), h200.smem);
  EXPECT_EQ(a.threads, 1024);
  EXPECT_EQ(std::tuple(b.G, b.Bg, b.C, b.Hs, b.S, b.kt), std::tuple(8, int64_t(4), 16, int64_t(32), 8, int64_t(256)));
  EXPECT_EQ(a.kt, 256);
  EXPECT_LE(std::max(b.fwd_smem, b.bwd_smem), h200.smem);
  // where a cluster holds it, the cluster plan
  const fz::Plan small = fz::best_plan(32, 128, 4, h200);
  EXPECT_TRUE(small.use && !small.grid);
  // without cooperative launches, cuDNN's path, with both reasons
  const fz::Plan none = fz::best_plan(64, 1024, 4, kH200);
  EXPECT_FALSE(none.use);
  EXPECT_NE(none.why_not.find("W_hh (12582912 bytes)"), std::string::npos) << none.why_not;
  EXPECT_NE(none.why_not.find("cooperative launch"), std::string::npos) << none.why_not;
  // (512, 1024): 512 rows x 8 units a block of 128 is over 1024 threads
  const fz::Plan big = fz::best_plan(512, 1024, 4, h200);
  EXPECT_FALSE(big.use);
  EXPECT_NE(big.why_not.find("1024 threads a block"), std::string::npos) << big.why_not;
  // every grid plan: its blocks divide H, fit the device, its lanes a power of two, its tile a multiple of them
  for (int64_t H : {40, 96, 256, 384, 512, 768, 1024})
    for (int64_t B : {1, 2, 5, 16, 32, 64})
      for (size_t e : {size_t(4), size_t(8)}) {
        const fz::Plan p = fz::grid_plan(B, H, e, h200);
        if (!p.use) continue;
        EXPECT_TRUE(p.grid);
        EXPECT_EQ(H % p.C, 0);
        EXPECT_EQ(p.G * p.Bg, B);
        EXPECT_LE(p.G * p.C, h200.sms);
        EXPECT_EQ(p.S & (p.S - 1), 0);
        EXPECT_EQ(p.kt % p.S, 0);
        EXPECT_LE(p.threads, 1024);
        EXPECT_EQ(std::max(p.fwd_smem, p.bwd_smem),
                  size_t(std::max(fz::GridSmem(false, p.Bg, H, p.Hs, p.S, p.kt).total, fz::GridSmem(true, p.Bg, H, p.Hs, p.S, p.kt).total)) * e);
        EXPECT_LE(std::max(p.fwd_smem, p.bwd_smem), h200.smem);
      }
}

}  // namespace

namespace {
// Precision::Bf16 (Args::bf16): the kernels' products rounded as
// gemm_bf16's, simulated in float32 against the CPU's bf16 tape (gru_cell
// steps with bfloat16 GEMMs), on cluster and grid plans, with and without
// resets. The values and dL/dh0 agree to 1e-5 of their largest in most
// elements (the sums' order differs, which can move a product's rounding by
// one bfloat16 step, and the recurrence carries it on: where, depends on the
// compiler's float sums), where the same kernels with float32 products
// agree in few; every value and gradient within two bfloat16 steps of the
// largest. The weight gradients differ by up to a few bfloat16 steps: the
// CPU rounds each step's product, the fused path one GEMM over the sequence.
// The fraction of a's elements within 1e-5 of b's largest of b's.
double same(const std::vector<double>& a, const std::vector<double>& b) {
  double top = 0;
  for (double v : b) top = std::max(top, std::fabs(v));
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::fabs(a[i] - b[i]) <= 1e-5 * top;
  return double(n) / double(a.size());
}

TEST(FusedGru, SimulatedBf16IsTheCpusBf16Cells) {
  struct Case {
    int64_t T, B, I, H;
    bool grid;
  };
  const Case cases[] = {{6, 4, 5, 32, false}, {5, 3, 4, 64, false}, {6, 4, 3, 96, true}, {4, 8, 3, 40, true}};
  double plain_y = 0;  // the kernels with float32 products: the largest fraction of y they agree on
  for (const Case& k : cases)
    for (const bool resets : {false, true}) {
      SCOPED_TRACE("T " + std::to_string(k.T) + ", B " + std::to_string(k.B) + ", H " + std::to_string(k.H) + (k.grid ? ", grid" : ", cluster") +
                   (resets ? ", resets" : ""));
      const fz::Limits lim = k.grid ? fz::Limits{kH200.smem, 8, false, 12, true} : kH200;
      const fz::Plan plan = fz::best_plan(k.B, k.H, sizeof(float), lim);
      ASSERT_TRUE(plan.use && plan.grid == k.grid) << plan.why_not;
      Problem p = draw(k.T, k.B, k.I, k.H, unsigned(k.T * 17 + k.H));
      if (resets) {
        p.keep.assign(size_t(k.T * k.B), 1.0);
        p.keep[1] = 0, p.keep[size_t(2 * k.B)] = 0;
      }
      const Result want = cpu_reference<float>(p, Precision::Bf16);
      const Result got = simulate<float>(p, plan, true), plain = simulate<float>(p, plan, false);
      EXPECT_GE(same(got.y, want.y), 0.9) << "y";
      EXPECT_GE(same(got.dh0, want.dh0), 0.7) << "dh0";
      expect_within(got, want, {.y = 8e-3, .dh0 = 8e-3, .dx = 8e-3, .dw = 1e-2, .db = 8e-3});
      plain_y = std::max(plain_y, same(plain.y, want.y));
    }
  EXPECT_LE(plain_y, 0.2) << "float32 products in the kernels are as close: the test cannot tell";
}
}  // namespace
