// Exact BPTT by segment replay (segtape/replay.h): gradients carried back
// across segment boundaries (Segment::input / grad, seeded backward), the
// replay driver's uniform and binomial schedules against one-segment full
// BPTT, its memory (identical replayed segments, stored states exactly, no
// heap allocation after the first window) and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "alloc_hook.h"
#include "segtape/nn/layers.h"
#include "segtape/ops.h"
#include "segtape/replay.h"
#include "util.h"

using namespace segtape;
namespace rp = segtape::replay;

namespace {

// GRUCell + Linear + cross-entropy on a stream of random inputs, a loss at
// every step but every third (steps without a loss exercise the unseeded path).
struct Model {
  static constexpr int64_t B = 3, I = 4, H = 5, C = 3;
  Tape tape;
  nn::Rng rng{7};
  DType dtype;
  nn::GRUCell gru;
  nn::Linear head;
  Tensor h0;  // persistent start state
  explicit Model(DType d, size_t budget = size_t(64) << 20)
      : tape(Device::cpu(), {.segment_budget = budget}), dtype(d), gru(tape, rng, I, H, true, d), head(tape, rng, H, C, true, d) {
    h0 = tape.persistent({B, H}, d);
    std::mt19937 g(3);
    std::uniform_real_distribution<double> u(-0.5, 0.5);
    std::vector<double> v(size_t(B * H));
    for (double& x : v) x = u(g);
    set(h0, v);
  }
  void set(const Tensor& t, const std::vector<double>& v) {
    if (t.dtype == DType::F64) t.from_host(std::span<const double>(v));
    else {
      std::vector<float> f(v.begin(), v.end());
      t.from_host(std::span<const float>(f));
    }
  }
  std::vector<Tensor> params() const {
    return {gru.weight_ih, gru.weight_hh, gru.bias_ih, gru.bias_hh, head.weight, head.bias};
  }
  std::vector<double> grads() const {
    std::vector<double> out;
    for (const Tensor& p : params()) {
      const Tensor g = p.grad_tensor();
      if (g.dtype == DType::F64) for (double x : g.to_host<double>()) out.push_back(x);
      else for (float x : g.to_host<float>()) out.push_back(double(x));
    }
    return out;
  }
  void zero_grad() { tape.zero_grad(); }

  // The inputs of step t come from a generator that advances on every draw:
  // the driver must record them the first time and replay them after.
  struct Source {
    std::mt19937 g{11};
    int64_t draws = 0;
    void fill(std::span<double> v) {
      std::uniform_real_distribution<double> u(-1, 1);
      for (double& x : v) x = u(g);
      ++draws;
    }
  };
  std::vector<float> xf = std::vector<float>(size_t(B * I));  // float32 inputs, converted without allocating
  Tensor x_of(std::span<const double> v) {
    if (dtype == DType::F64) return tape.from(v, {B, I});
    std::copy(v.begin(), v.end(), xf.begin());
    return tape.from(std::span<const float>(xf), {B, I});
  }
  rp::StepResult step(int64_t t, const Tensor& h, std::span<const double> x, std::span<const int64_t> y) {
    Tensor h1 = gru(x_of(x), h);
    Tensor loss;
    if (t % 3 != 2) loss = cross_entropy(head(h1), tape.from(y, {B}));
    return {h1, loss};
  }
  static void targets(int64_t t, std::span<int64_t> y) {
    for (size_t b = 0; b < y.size(); ++b) y[b] = (t * 7 + int64_t(b) * 5) % C;
  }
  rp::StepFn step_fn(Source& src) {
    return [this, &src](Tape&, int64_t t, const Tensor& h, rp::Inputs& in) {
      // Each span lives until the next take(): x becomes a tensor before y is taken.
      auto x = in.take<double>(size_t(B * I), [&](std::span<double> v) { src.fill(v); });
      Tensor h1 = gru(x_of(x), h);
      auto y = in.take<int64_t>(size_t(B), [&](std::span<int64_t> v) { targets(t, v); });
      Tensor loss;
      if (t % 3 != 2) loss = cross_entropy(head(h1), tape.from(y, {B}));
      return rp::StepResult{h1, loss};
    };
  }
  // Full BPTT: the whole window in one segment, the same draws in step order.
  double full_bptt(int64_t T) {
    Source src;
    Segment seg = tape.segment();
    Tensor h = h0, loss;
    std::vector<double> x(size_t(B * I));
    std::vector<int64_t> y(static_cast<size_t>(B));
    for (int64_t t = 0; t < T; ++t, tape.next_step()) {
      src.fill(x);
      targets(t, y);
      rp::StepResult s = step(t, h, x, y);
      h = s.state;
      if (s.loss.defined()) loss = loss.defined() ? add(loss, s.loss) : s.loss;
    }
    seg.backward(loss);
    return loss.item();
  }
};

double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]), n += b[i] * b[i];
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-300);
}

}  // namespace

// ---- the engine: gradients across a boundary

TEST(ExactBoundary, SeededSegmentsChainToFullBptt) {
  // Two segments by hand: the second seeded only by its loss, the first by
  // the dL/dh the second reported for the state entering it.
  Model m(DType::F64);
  const double full_loss = m.full_bptt(6);
  const std::vector<double> want = m.grads();
  m.zero_grad();
  Model::Source src;
  std::vector<double> x(size_t(Model::B * Model::I));
  std::vector<int64_t> y(size_t(Model::B));
  std::vector<std::vector<double>> xs;
  for (int t = 0; t < 6; ++t) src.fill(x), xs.push_back(x);
  Tensor mid = m.tape.persistent({Model::B, Model::H}, DType::F64);
  {  // forward of the first half, no graph: the state at the boundary
    Segment seg = m.tape.segment();
    NoGradGuard ng(m.tape);
    Tensor h = m.h0;
    for (int t = 0; t < 3; ++t) Model::targets(t, y), h = m.step(t, h, xs[size_t(t)], y).state;
    copy_into(mid, h);
  }
  Tensor dh_home = m.tape.persistent({Model::B, Model::H}, DType::F64);
  double loss_sum = 0;
  {
    Segment seg = m.tape.segment();
    Tensor h_in = seg.input(mid), h = h_in, loss;
    for (int t = 3; t < 6; ++t) {
      Model::targets(t, y);
      rp::StepResult s = m.step(t, h, xs[size_t(t)], y);
      h = s.state;
      if (s.loss.defined()) loss = loss.defined() ? add(loss, s.loss) : s.loss;
    }
    seg.backward(loss);
    loss_sum += loss.item();
    copy_into(dh_home, seg.grad(h_in));
  }
  {
    Segment seg = m.tape.segment();
    Tensor h_in = seg.input(m.h0), h = h_in, loss;
    for (int t = 0; t < 3; ++t) {
      Model::targets(t, y);
      rp::StepResult s = m.step(t, h, xs[size_t(t)], y);
      h = s.state;
      if (s.loss.defined()) loss = loss.defined() ? add(loss, s.loss) : s.loss;
    }
    seg.backward(loss, {{h, dh_home}});
    loss_sum += loss.item();
    EXPECT_EQ(seg.grad(h_in).shape, m.h0.shape);
  }
  EXPECT_NEAR(loss_sum, full_loss, 1e-12);
  EXPECT_LE(rel_err(m.grads(), want), 1e-12);
}

TEST(ExactBoundary, InputLeavesAndSeedsAreChecked) {
  Model m(DType::F32);
  Tensor w = m.gru.weight_hh;
  Segment seg = m.tape.segment();
  Tensor h = seg.input(m.h0);
  EXPECT_EQ(h.space, Space::Segment);
  // Nothing reached it yet: its gradient is zero.
  for (float g : seg.grad(h).to_host<float>()) EXPECT_EQ(g, 0.0f);
  Tensor y = tanh(h);
  EXPECT_THROW(seg.backward({{h, m.h0}}), TapeError);                   // a leaf seeded directly
  EXPECT_THROW(seg.backward({{y, m.tape.zeros({1, 1})}}), ShapeError);  // seed of another shape
  EXPECT_THROW(seg.backward(sum(y), {{y, y}, {y, y}}), TapeError);       // a tensor seeded twice
  EXPECT_THROW((void)seg.grad(y), TapeError);                           // not an input() leaf
  {
    NoGradGuard ng(m.tape);
    EXPECT_THROW((void)seg.input(m.h0), TapeError);  // nothing would be recorded
  }
  // Two backward passes accumulate into the leaf's gradient.
  seg.backward(sum(y), {.retain_graph = true});
  const std::vector<float> once = seg.grad(h).to_host<float>();
  seg.backward(sum(y));
  const std::vector<float> twice = seg.grad(h).to_host<float>();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]);
  // A new loss from the leaf after a non-retained backward: the leaf has no
  // rule to release, so its gradient keeps accumulating.
  seg.backward(sum(exp(h)));
  const std::vector<float> hv = m.h0.to_host<float>(), thrice = seg.grad(h).to_host<float>();
  for (size_t i = 0; i < hv.size(); ++i) EXPECT_NEAR(thrice[i], twice[i] + std::exp(hv[i]), 1e-5);
  (void)w;
}

// ---- the driver against one-segment full BPTT

struct Grid {
  int64_t T, K;
  rp::Schedule schedule;
  int64_t snapshots;
};

class ExactDriver : public ::testing::TestWithParam<Grid> {};

TEST_P(ExactDriver, GradientsEqualFullBptt) {
  const Grid g = GetParam();
  for (DType d : {DType::F64, DType::F32}) {
    SCOPED_TRACE(d == DType::F64 ? "f64" : "f32");
    Model m(d);
    const double full_loss = m.full_bptt(g.T);
    const std::vector<double> want = m.grads();
    m.zero_grad();
    Model::Source src;
    rp::Driver drv(m.tape, m.h0, {.horizon = g.T, .k = g.K, .schedule = g.schedule, .snapshots = g.snapshots});
    const rp::Report r = drv.run(m.step_fn(src), m.h0);
    EXPECT_EQ(src.draws, g.T) << "each step's inputs are drawn once and replayed after";
    const double tol = d == DType::F64 ? 1e-10 : 1e-5;
    EXPECT_LE(rel_err(m.grads(), want), tol);
    EXPECT_NEAR(r.loss, full_loss, std::abs(full_loss) * (d == DType::F64 ? 1e-12 : 1e-5));
    EXPECT_EQ(r.steps_run, drv.planned_steps());
    EXPECT_EQ(r.segments, (g.T + g.K - 1) / g.K);
    if (g.schedule == rp::Schedule::Uniform) {
      EXPECT_EQ(r.steps_run, 2 * g.T);  // one forward pass, one replay
      EXPECT_DOUBLE_EQ(r.recompute_factor, 2.0);
    } else {
      EXPECT_GE(r.recompute_factor, 1.0);
      EXPECT_EQ(r.stored_states, std::min(g.snapshots, r.segments - 1) + 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, ExactDriver,
    ::testing::Values(Grid{7, 1, rp::Schedule::Uniform, 0}, Grid{7, 8, rp::Schedule::Uniform, 0},
                      Grid{7, 32, rp::Schedule::Uniform, 0}, Grid{64, 1, rp::Schedule::Uniform, 0},
                      Grid{64, 8, rp::Schedule::Uniform, 0}, Grid{64, 32, rp::Schedule::Uniform, 0},
                      Grid{1000, 1, rp::Schedule::Uniform, 0}, Grid{1000, 8, rp::Schedule::Uniform, 0},
                      Grid{1000, 32, rp::Schedule::Uniform, 0}, Grid{7, 1, rp::Schedule::Binomial, 2},
                      Grid{7, 8, rp::Schedule::Binomial, 1}, Grid{64, 1, rp::Schedule::Binomial, 3},
                      Grid{64, 8, rp::Schedule::Binomial, 2}, Grid{64, 32, rp::Schedule::Binomial, 1},
                      Grid{1000, 1, rp::Schedule::Binomial, 10}, Grid{1000, 8, rp::Schedule::Binomial, 4},
                      Grid{1000, 32, rp::Schedule::Binomial, 2}),
    [](const ::testing::TestParamInfo<Grid>& i) {
      return std::string(i.param.schedule == rp::Schedule::Uniform ? "uniform" : "binomial") + "_T" +
             std::to_string(i.param.T) + "_K" + std::to_string(i.param.K) +
             (i.param.schedule == rp::Schedule::Binomial ? "_s" + std::to_string(i.param.snapshots) : "");
    });

// A run's last, shorter window runs on the driver of the full ones: its
// first ceil(n / K) segments, on the same stored states (no new persistent
// bytes), with the gradients, loss, steps and final state of a driver made
// for n steps, bit for bit, and those of full BPTT over n steps. n outside
// [1, T] is refused before anything runs; a full window after short ones is
// still exact.
TEST(ExactDriver, AShorterWindowRunsOnTheSameStatesAndEqualsItsOwnDriver) {
  for (const rp::Schedule sch : {rp::Schedule::Uniform, rp::Schedule::Binomial}) {
    SCOPED_TRACE(sch == rp::Schedule::Uniform ? "uniform" : "binomial");
    const rp::Options o{.horizon = 64, .k = 8, .schedule = sch, .snapshots = sch == rp::Schedule::Binomial ? 3 : 0};
    Model m(DType::F64);
    rp::Driver big(m.tape, m.h0, o);
    for (const int64_t n : {1, 7, 8, 9, 37, 63, 64}) {
      SCOPED_TRACE("n = " + std::to_string(n));
      m.zero_grad();
      Model::Source s1;
      const size_t persistent = m.tape.stats().persistent_bytes;
      const rp::Report r = big.run(m.step_fn(s1), m.h0, n);
      const std::vector<double> got = m.grads();
      const std::vector<double> end = big.final_state().to_host<double>();
      EXPECT_EQ(m.tape.stats().persistent_bytes, persistent) << "a shorter window made new states";
      EXPECT_EQ(s1.draws, n);
      EXPECT_EQ(r.segments, (n + 7) / 8);
      EXPECT_EQ(r.steps_run, big.planned_steps(n));

      m.zero_grad();
      rp::Options own_o = o;
      own_o.horizon = n;
      rp::Driver own(m.tape, m.h0, own_o);
      Model::Source s2;
      const rp::Report ro = own.run(m.step_fn(s2), m.h0);
      EXPECT_EQ(got, m.grads()) << "not the gradients of a driver made for " << n << " steps";
      EXPECT_EQ(end, own.final_state().to_host<double>());
      EXPECT_EQ(r.loss, ro.loss);
      EXPECT_EQ(r.steps_run, ro.steps_run);
      EXPECT_EQ(r.input_bytes, ro.input_bytes) << "the inputs of this window only";
      EXPECT_EQ(r.state_bytes, big.run(m.step_fn(s2), m.h0).state_bytes) << "the driver's states, all held";

      m.zero_grad();
      m.full_bptt(n);
      EXPECT_LE(rel_err(got, m.grads()), 1e-10);
    }
    m.zero_grad();
    Model::Source src;
    for (const int64_t bad : {int64_t(0), int64_t(-1), int64_t(65)}) {
      const std::string e = segtape::test::message_of<Error>([&] { big.run(m.step_fn(src), m.h0, bad); });
      EXPECT_NE(e.find("a window of " + std::to_string(bad) + " steps on a driver of horizon 64"), std::string::npos) << e;
    }
    EXPECT_EQ(src.draws, 0);
    EXPECT_EQ(m.grads(), std::vector<double>(m.grads().size(), 0.0));
    big.run(m.step_fn(src), m.h0);  // the full window again, after the short ones
    const std::vector<double> full_window = m.grads();
    m.zero_grad();
    m.full_bptt(64);
    EXPECT_LE(rel_err(full_window, m.grads()), 1e-10);
  }
}

// Options::on_forward: losses that need the whole window (actor-critic
// returns need later rewards and the value of the state the window ends in).
// Here step t's loss is weighted by w_t = (t + 1) * mean(state after T), known
// only after the forward pass: the hook runs once, after all T steps and
// before any backward, and the gradients equal full BPTT with those weights.
TEST(ExactDriver, ALossThatNeedsTheWholeWindowComesFromTheForwardHook) {
  constexpr int64_t T = 13;
  for (const rp::Options& shape : {rp::Options{.horizon = T, .k = 4},
                                   rp::Options{.horizon = T, .k = 2, .schedule = rp::Schedule::Binomial, .snapshots = 2}}) {
    SCOPED_TRACE(shape.schedule == rp::Schedule::Uniform ? "uniform" : "binomial");
    Model m(DType::F64);
    // The reference: a forward pass for the final state, then one segment.
    double mean_final = 0;
    {
      Model::Source src;
      Segment seg = m.tape.segment();
      NoGradGuard ng(m.tape);
      Tensor h = m.h0;
      std::vector<double> x(size_t(Model::B * Model::I));
      std::vector<int64_t> y(size_t(Model::B));
      for (int64_t t = 0; t < T; ++t) src.fill(x), Model::targets(t, y), h = m.step(t, h, x, y).state;
      for (double v : h.to_host<double>()) mean_final += v / double(h.numel());
    }
    {
      Model::Source src;
      Segment seg = m.tape.segment();
      Tensor h = m.h0, loss;
      std::vector<double> x(size_t(Model::B * Model::I));
      std::vector<int64_t> y(size_t(Model::B));
      for (int64_t t = 0; t < T; ++t, m.tape.next_step()) {
        src.fill(x), Model::targets(t, y);
        rp::StepResult s = m.step(t, h, x, y);
        h = s.state;
        if (!s.loss.defined()) continue;
        const Tensor l = scale(s.loss, double(t + 1) * mean_final);
        loss = loss.defined() ? add(loss, l) : l;
      }
      seg.backward(loss);
    }
    const std::vector<double> want = m.grads();
    m.zero_grad();

    Model::Source src;
    double weight = 0;  // mean(state after T), set by the hook
    int hooks = 0, replays_before_hook = 0, replays = 0, steps_seen = 0, steps_at_hook = 0;
    rp::Options o = shape;
    o.on_segment = [&](int64_t, bool replay, const TapeStats&) { replays += replay; };
    o.on_forward = [&](const Tensor& final_state) {
      ++hooks;
      replays_before_hook = replays;
      steps_at_hook = steps_seen;
      EXPECT_FALSE(m.tape.segment_open());
      weight = 0;
      for (double v : final_state.to_host<double>()) weight += v / double(final_state.numel());
    };
    rp::Driver drv(m.tape, m.h0, o);
    const rp::StepFn inner = m.step_fn(src);
    std::vector<uint8_t> seen(size_t(T), 0);
    const rp::Report r = drv.run(
        [&](Tape& tp, int64_t t, const Tensor& h, rp::Inputs& in) {
          if (!seen[size_t(t)]) seen[size_t(t)] = 1, ++steps_seen;
          rp::StepResult s = inner(tp, t, h, in);
          if (!in.replaying()) s.loss = {};  // the forward pass does not know the weights yet
          else if (s.loss.defined()) s.loss = scale(s.loss, double(t + 1) * weight);
          return s;
        },
        m.h0);
    EXPECT_EQ(hooks, 1);
    EXPECT_EQ(steps_at_hook, T) << "the hook runs after every step has run once";
    EXPECT_EQ(replays_before_hook, 0) << "and before any backward";
    EXPECT_GT(r.steps_run, T);
    EXPECT_LE(rel_err(m.grads(), want), 1e-10);
  }
}

TEST(ExactSchedule, BinomialTradesStoredStatesForRecompute) {
  // Fewer stored states, more recompute; with enough it is the uniform schedule.
  Model m(DType::F32);
  auto steps = [&](rp::Schedule s, int64_t snaps) {
    rp::Driver d(m.tape, m.h0, {.horizon = 1000, .k = 8, .schedule = s, .snapshots = snaps});
    return d.planned_steps();
  };
  const int64_t uniform = steps(rp::Schedule::Uniform, 0);
  EXPECT_EQ(uniform, 2 * 1000);
  int64_t last = 0;
  for (int64_t c : {124, 16, 8, 4, 2, 1}) {
    const int64_t s = steps(rp::Schedule::Binomial, c);
    EXPECT_GE(s, last) << c << " snapshots";
    last = s;
  }
  EXPECT_EQ(steps(rp::Schedule::Binomial, 124), uniform);  // 125 segments, a state at every boundary
  EXPECT_GT(steps(rp::Schedule::Binomial, 1), 5 * uniform);
}

TEST(ExactSchedule, BinomialIsRevolvesOptimum) {
  // Griewank's binomial checkpointing reverses n steps with s checkpoints
  // (the start's included) in t = r n - beta(s + 1, r - 1) forward steps, r the
  // least with beta(s, r) = C(s + r, s) >= n. With K = 1 the driver runs those,
  // plus one replay of every step and the last step's first run.
  auto choose = [](int64_t a, int64_t b) {
    double c = 1;
    for (int64_t i = 1; i <= b; ++i) c = c * double(a - b + i) / double(i);
    return int64_t(std::llround(c));
  };
  auto beta = [&](int64_t s, int64_t r) { return choose(s + r, s); };
  Model m(DType::F32);
  constexpr int64_t T = 1000;
  for (int64_t snapshots : {1, 2, 4, 10}) {
    const int64_t s = snapshots + 1;
    int64_t r = 0;
    while (beta(s, r) < T) ++r;
    const int64_t revolve = r * T - beta(s + 1, r - 1);
    rp::Driver d(m.tape, m.h0, {.horizon = T, .k = 1, .schedule = rp::Schedule::Binomial, .snapshots = snapshots});
    EXPECT_EQ(d.planned_steps(), revolve + T + 1) << snapshots << " snapshots";
  }
}

// ---- overlapping windows (Options::stride, Driver::slide)

namespace {
// One segment of full BPTT over steps [w0, e) from the state `start` with
// the steps' inputs xs (targets by step), the loss of steps [q, e) only;
// states[t + 1] gets the state after step t (the next windows start there).
void full_bptt_window(Model& m, const std::vector<std::vector<double>>& xs, const Tensor& start, int64_t w0, int64_t q, int64_t e,
                      std::vector<std::vector<double>>& states) {
  std::vector<int64_t> y(size_t(Model::B));
  Segment seg = m.tape.segment();
  Tensor h = start, loss;
  for (int64_t t = w0; t < e; ++t, m.tape.next_step()) {
    Model::targets(t, y);
    const rp::StepResult s = m.step(t, h, xs[size_t(t)], y);
    h = s.state;
    states[size_t(t + 1)] = segtape::test::values(h);
    if (t >= q && s.loss.defined()) loss = loss.defined() ? add(loss, s.loss) : s.loss;
  }
  if (loss.defined()) seg.backward(loss);
}

// p -= lr * dL/dp for every parameter, and the gradients zeroed.
void sgd(Model& m, double lr) {
  for (const Tensor& p : m.params()) {
    std::vector<double> v = segtape::test::values(p);
    const std::vector<double> g = segtape::test::values(p.grad_tensor());
    for (size_t i = 0; i < v.size(); ++i) v[i] -= lr * g[i];
    m.set(p, v);
  }
  m.zero_grad();
}
}  // namespace

// Every stride of S steps gets the gradient of its steps' losses through the
// window of the last T steps ending with them (fewer at the start): that of
// one segment of full BPTT over the window, from the state the stride before
// computed at its start, with the weights as they are now (an SGD step
// between strides changes them), in float64 to 1e-10 and float32 to 1e-5;
// each step's inputs drawn once; the state the driver hands on is the
// window's forward pass's. S a multiple of K up to T; the run's last stride
// shorter; after reset() a new history starts.
TEST(ExactOverlap, EachStrideEqualsFullBpttOverItsWindowWithTheWeightsOfNow) {
  struct G {
    int64_t T, K, S, N;
  };
  for (const G g : {G{24, 4, 8, 58}, G{24, 4, 4, 30}, G{24, 4, 24, 50}, G{24, 8, 16, 61}, G{12, 1, 3, 20}}) {
    for (const DType d : {DType::F64, DType::F32}) {
      SCOPED_TRACE("T " + std::to_string(g.T) + " K " + std::to_string(g.K) + " S " + std::to_string(g.S) +
                   (d == DType::F64 ? " f64" : " f32"));
      Model m(d), ref(d);
      rp::Driver drv(m.tape, m.h0, {.horizon = g.T, .k = g.K, .stride = g.S});
      Model::Source src, same;
      std::vector<std::vector<double>> xs(size_t(g.N), std::vector<double>(size_t(Model::B * Model::I)));
      for (auto& x : xs) same.fill(x);
      std::vector<std::vector<double>> states(size_t(g.N + 1));
      states[0] = segtape::test::values(ref.h0);
      const Tensor start = ref.tape.persistent({Model::B, Model::H}, d);
      const rp::StepFn step = m.step_fn(src);
      Tensor h = m.h0;
      for (int64_t q = 0; q < g.N; q += g.S) {
        const int64_t n = std::min(g.S, g.N - q), e = q + n;
        ASSERT_EQ(drv.position(), q);
        const rp::Report r = drv.slide(step, h, n);
        h = drv.final_state();
        const int64_t w0 = std::max<int64_t>(0, e - g.T + g.K - 1) / g.K * g.K;
        EXPECT_EQ(r.segments, (e + g.K - 1) / g.K - w0 / g.K);
        EXPECT_EQ(r.steps_run, 2 * (e - w0)) << "the window forward, then replayed";
        ref.set(start, states[size_t(w0)]);
        full_bptt_window(ref, xs, start, w0, q, e, states);
        EXPECT_LE(rel_err(m.grads(), ref.grads()), d == DType::F64 ? 1e-10 : 1e-5) << "stride ending at " << e;
        EXPECT_LE(rel_err(segtape::test::values(h), states[size_t(e)]), d == DType::F64 ? 1e-12 : 1e-6);
        sgd(m, 0.05), sgd(ref, 0.05);
      }
      EXPECT_EQ(src.draws, g.N) << "each step's inputs drawn once";
    }
  }
  // reset(): the next stride's window starts at its own first step.
  Model m(DType::F64), ref(DType::F64);
  rp::Driver drv(m.tape, m.h0, {.horizon = 16, .k = 4, .stride = 8});
  Model::Source src;
  drv.slide(m.step_fn(src), m.h0, 8);
  drv.reset();
  EXPECT_EQ(drv.position(), 0);
  m.zero_grad();
  Model::Source again, same;
  drv.slide(m.step_fn(again), m.h0, 8);
  std::vector<std::vector<double>> xs(8, std::vector<double>(size_t(Model::B * Model::I))), states(9);
  for (auto& x : xs) same.fill(x);
  full_bptt_window(ref, xs, ref.h0, 0, 0, 8, states);
  EXPECT_LE(rel_err(m.grads(), ref.grads()), 1e-10);
}

TEST(ExactOverlap, BadStridesAreRefusedAndARunLossFromSkipsEarlierLosses) {
  Model m(DType::F64);
  auto made = [&](const rp::Options& o) { return segtape::test::message_of<Error>([&] { rp::Driver d(m.tape, m.h0, o); }); };
  for (const rp::Options& o : {rp::Options{.horizon = 24, .k = 4, .stride = 6}, rp::Options{.horizon = 24, .k = 4, .stride = 28},
                               rp::Options{.horizon = 22, .k = 4, .stride = 8}, rp::Options{.horizon = 24, .k = 4, .stride = -4}})
    EXPECT_NE(made(o).find("overlapping windows need a stride S in [K, T] and S and T multiples of K"), std::string::npos);
  EXPECT_NE(made({.horizon = 24, .k = 4, .schedule = rp::Schedule::Binomial, .snapshots = 2, .stride = 8}).find("uniform schedule"),
            std::string::npos);
  rp::Driver plain(m.tape, m.h0, {.horizon = 24, .k = 4});
  Model::Source src;
  EXPECT_NE(segtape::test::message_of<Error>([&] { plain.slide(m.step_fn(src), m.h0, 4); }).find("Options::stride"), std::string::npos);
  rp::Driver drv(m.tape, m.h0, {.horizon = 24, .k = 4, .stride = 8});
  EXPECT_NE(segtape::test::message_of<Error>([&] { drv.slide(m.step_fn(src), m.h0, 9); }).find("1 to S = 8 steps"), std::string::npos);
  EXPECT_EQ(src.draws, 0);
  // run() with losses_from: the window's gradient of the later steps' losses only.
  Model ref(DType::F64);
  m.zero_grad();
  Model::Source same;
  std::vector<std::vector<double>> xs(20, std::vector<double>(size_t(Model::B * Model::I))), states(21);
  for (auto& x : xs) same.fill(x);
  plain.run(m.step_fn(src), m.h0, 20, 12);
  full_bptt_window(ref, xs, ref.h0, 0, 12, 20, states);
  EXPECT_LE(rel_err(m.grads(), ref.grads()), 1e-10);
}

// ---- memory

TEST(ExactMemory, ReplayedSegmentsAreIdenticalStoredStatesExactNoHeapAfterTheFirstWindow) {
  constexpr int64_t T = 96, K = 6;  // K a multiple of the loss pattern's period: every segment runs the same ops
  Model m(DType::F32);
  const size_t before = m.tape.stats().persistent_bytes;
  std::vector<size_t> peaks;
  std::vector<int64_t> replayed;
  peaks.reserve(64), replayed.reserve(64);
  rp::Options o{.horizon = T, .k = K};
  o.on_segment = [&](int64_t u, bool replay, const TapeStats& s) {
    if (replay) peaks.push_back(s.last_segment_peak), replayed.push_back(u);
  };
  rp::Driver drv(m.tape, m.h0, o);
  const size_t state = align_up(size_t(Model::B * Model::H) * sizeof(float));
  // Stored states: one per segment (the window's start included), the final state and dL/dh.
  EXPECT_EQ(m.tape.stats().persistent_bytes - before, (T / K + 2) * state);
  Model::Source src;
  const rp::StepFn step = m.step_fn(src);
  rp::Report first = drv.run(step, m.h0);
  EXPECT_EQ(first.state_bytes, (T / K + 2) * state);
  ASSERT_EQ(peaks.size(), size_t(T / K));
  // Every replay after the last segment's is seeded with dL/dh: the same ops, the same bytes.
  for (size_t i = 1; i < peaks.size(); ++i) EXPECT_EQ(peaks[i], peaks[1]) << "replay of segment " << replayed[i];
  EXPECT_EQ(first.segment_peak, *std::max_element(peaks.begin(), peaks.end()));
  // Later windows: the same peaks, and not one heap allocation.
  peaks.clear(), replayed.clear();
  const size_t persistent = m.tape.stats().persistent_bytes;
  const uint64_t chunks = memory::system_allocations();
  const uint64_t heap_before = alloc_hook::count();
  alloc_hook::enable(true);
  rp::Report second = drv.run(step, drv.final_state());
  alloc_hook::enable(false);
  const uint64_t allocations = alloc_hook::count() - heap_before;
  EXPECT_EQ(allocations, 0u) << "heap allocations in the second window";
  EXPECT_EQ(memory::system_allocations(), chunks);
  EXPECT_EQ(m.tape.stats().persistent_bytes, persistent);
  EXPECT_EQ(second.segment_peak, first.segment_peak);
  for (size_t i = 1; i < peaks.size(); ++i) EXPECT_EQ(peaks[i], peaks[1]);
}

// Overlapping windows in fixed memory: the ring is the T / K states of a
// window (and the final state and dL/dh), made with the driver; every stride
// of a full window replays its segments to the same high-waters, to the
// byte (the new steps' segments, with their losses, one; the older ones,
// run for their states, another); after the first stride, not one heap
// allocation (the ring's input records are sized once the first stride has
// shown a step's bytes).
TEST(ExactMemory, OverlappingWindowsKeepTheirRingAndAllocateNothingAfterTheFirstStride) {
  constexpr int64_t T = 48, K = 6, S = 12;
  Model m(DType::F32);
  const size_t before = m.tape.stats().persistent_bytes;
  std::vector<size_t> peaks;
  peaks.reserve(256);
  rp::Options o{.horizon = T, .k = K, .stride = S};
  o.on_segment = [&](int64_t, bool replay, const TapeStats& s) {
    if (replay) peaks.push_back(s.last_segment_peak);
  };
  rp::Driver drv(m.tape, m.h0, o);
  const size_t state = align_up(size_t(Model::B * Model::H) * sizeof(float));
  EXPECT_EQ(m.tape.stats().persistent_bytes - before, (T / K + 2) * state);
  Model::Source src;
  const rp::StepFn step = m.step_fn(src);
  (void)drv.slide(step, m.h0, S);
  const size_t persistent = m.tape.stats().persistent_bytes;
  const uint64_t heap_before = alloc_hook::count();
  alloc_hook::enable(true);
  for (int i = 0; i < 8; ++i) (void)drv.slide(step, drv.final_state(), S);
  alloc_hook::enable(false);
  EXPECT_EQ(alloc_hook::count() - heap_before, 0u) << "heap allocations after the first stride";
  EXPECT_EQ(m.tape.stats().persistent_bytes, persistent);
  peaks.clear();
  (void)drv.slide(step, drv.final_state(), S);
  const std::vector<size_t> one = peaks;
  peaks.clear();
  const rp::Report r = drv.slide(step, drv.final_state(), S);
  ASSERT_EQ(peaks.size(), size_t(T / K));
  EXPECT_EQ(peaks, one) << "another stride's replays reached other high-waters";
  // (in reverse: the last segment unseeded, the rest of the new steps' seeded, then the older ones without losses)
  for (size_t i = 2; i < size_t(S / K); ++i) EXPECT_EQ(peaks[i], peaks[1]) << "replay " << i;
  for (size_t i = size_t(S / K) + 1; i < peaks.size(); ++i) EXPECT_EQ(peaks[i], peaks[size_t(S / K)]) << "replay " << i;
  EXPECT_LT(peaks[size_t(S / K)], peaks[1]) << "an older segment's replay records no loss";
  EXPECT_EQ(r.segment_peak, *std::max_element(peaks.begin(), peaks.end()));
  EXPECT_EQ(r.state_bytes, (T / K + 2) * state);
}

// ---- errors, each before any parameter changes

TEST(ExactErrors, BadOptionsAndANonReproducibleStepAreRefused) {
  Model m(DType::F32);
  const std::vector<double> grads = m.grads();
  auto message = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // The message a driver made with these options raises ("" when it is made).
  auto made = [&](const rp::Options& o) { return message([&] { rp::Driver d(m.tape, m.h0, o); }); };
  EXPECT_NE(made({.horizon = 10, .k = 0}).find("segment length K must be >= 1"), std::string::npos);
  EXPECT_NE(made({.horizon = 0, .k = 4}).find("horizon T must be in [1, 100000000]"), std::string::npos);
  // Sizes a review found unchecked: a horizon of 2^40 steps (allocated until
  // memory ran out), a K near 2^63 (its segment count overflowed to 0: a
  // read of an empty vector), a binomial plan of minutes, a take() whose byte
  // count wraps (a heap overflow), and a run() from the driver's own hook.
  EXPECT_NE(made({.horizon = int64_t(1) << 40, .k = 1}).find("horizon T must be in"), std::string::npos);
  {
    rp::Driver huge_k(m.tape, m.h0, {.horizon = 10, .k = INT64_MAX});
    Model::Source src0;
    EXPECT_EQ(huge_k.planned_steps(), 20);  // one segment of the 10 steps, run twice
    EXPECT_EQ(huge_k.run(m.step_fn(src0), m.h0).segments, 1);
    m.zero_grad();
  }
  EXPECT_NE(made({.horizon = 4096, .k = 1, .schedule = rp::Schedule::Binomial, .snapshots = 4095}).find("too large to compute"),
            std::string::npos);
  {
    rp::Driver d(m.tape, m.h0, {.horizon = 1, .k = 1});
    const std::string wrapped = message([&] {
      d.run([&](Tape&, int64_t, const Tensor& h, rp::Inputs& in) {
        (void)in.take<float>(SIZE_MAX / sizeof(float) + 2, [](std::span<float> v) { v[0] = 0; });
        return rp::StepResult{h, {}};
      }, m.h0);
    });
    EXPECT_NE(wrapped.find("asked take() for"), std::string::npos) << wrapped;
    rp::Options o{.horizon = 8, .k = 2};
    rp::Driver* self = nullptr;
    Model::Source src1;
    const rp::StepFn step1 = m.step_fn(src1);
    o.on_segment = [&](int64_t, bool, const TapeStats&) { self->run(step1, m.h0); };
    rp::Driver nested(m.tape, m.h0, o);
    self = &nested;
    EXPECT_NE(message([&] { nested.run(step1, m.h0); }).find("run() called while this driver runs"), std::string::npos);
    m.zero_grad();
  }
  EXPECT_NE(made({.horizon = 10, .k = 2, .schedule = rp::Schedule::Binomial, .snapshots = 0}).find("needs >= 1 stored states"),
            std::string::npos);
  // A step that reads something outside its state and inputs (a counter).
  rp::Driver drv(m.tape, m.h0, {.horizon = 16, .k = 4});
  int calls = 0;
  Model::Source src;
  const rp::StepFn good = m.step_fn(src);
  const rp::StepFn drifting = [&](Tape& t, int64_t s, const Tensor& h, rp::Inputs& in) {
    rp::StepResult r = good(t, s, h, in);
    r.state = scale(r.state, 1.0 + 1e-3 * double(++calls));
    return r;
  };
  const std::string m1 = message([&] { drv.run(drifting, m.h0); });
  // Found on the first replay (the last segment), before any backward.
  EXPECT_NE(m1.find("the step function is not reproducible: replaying segment 3 (steps 12..15)"), std::string::npos) << m1;
  const rp::StepFn greedy = [&](Tape& t, int64_t s, const Tensor& h, rp::Inputs& in) {
    if (in.replaying()) (void)in.take<float>(1, [](std::span<float>) {});  // an input the first pass did not take
    return good(t, s, h, in);
  };
  const std::string m2 = message([&] { drv.run(greedy, m.h0); });
  EXPECT_NE(m2.find("not reproducible: on a replay, step"), std::string::npos) << m2;
  EXPECT_EQ(m.grads(), grads) << "a refused window changed the gradients";
  // Step results the driver cannot use, each named with the step: no state, a
  // state of another shape, a loss of more than one element.
  const auto returning = [&](std::function<rp::StepResult(rp::StepResult)> change) {
    return message([&] {
      drv.run([&](Tape& t, int64_t s, const Tensor& h, rp::Inputs& in) { return change(good(t, s, h, in)); }, m.h0);
    });
  };
  const std::string m3 = returning([](rp::StepResult r) { return r.state = Tensor{}, r; });
  EXPECT_NE(m3.find("exact BPTT: step 0 returned no state"), std::string::npos) << m3;
  const std::string m4 = returning([](rp::StepResult r) { return r.state = concat({r.state, r.state}, 1), r; });
  EXPECT_NE(m4.find("exact BPTT: step 0 returned the state"), std::string::npos) << m4;
  EXPECT_NE(m4.find("not shaped like the driver's"), std::string::npos) << m4;
  const std::string m5 = returning([](rp::StepResult r) { return r.loss = r.state, r; });
  EXPECT_NE(m5.find("a step's loss has one element"), std::string::npos) << m5;
  EXPECT_EQ(m.grads(), grads) << "a refused window changed the gradients";
  // A budget too small for one segment's replay: the engine's report, before any gradient.
  Model tiny(DType::F32, size_t(8) << 10);
  rp::Driver small(tiny.tape, tiny.h0, {.horizon = 64, .k = 32});
  Model::Source s2;
  const std::vector<double> g0 = tiny.grads();
  EXPECT_THROW(small.run(tiny.step_fn(s2), tiny.h0), BudgetError);
  EXPECT_EQ(tiny.grads(), g0);
  // And a segment left open.
  Segment open = m.tape.segment();
  EXPECT_NE(message([&] { drv.run(good, m.h0); }).find("a segment is open"), std::string::npos);
}

// Options::verify_on_device: the boundary check runs where the state lives
// (here the CPU's host form of its device functions) and, with read_loss
// off, a window reads nothing back; check_replays() then reads the checks
// once and raises what run() raises, naming the same segment, for run()
// (float32 and float64) and for slide(); windows of a step that reproduces
// raise nothing, and the gradients are the host check's.
TEST(ExactErrors, ChecksOnTheDeviceFindTheSameStepAfterTheWindows) {
  for (const DType d : {DType::F32, DType::F64})
    for (const bool sliding : {false, true}) {
      SCOPED_TRACE(std::string(d == DType::F64 ? "f64" : "f32") + (sliding ? ", slide()" : ", run()"));
      Model m(d), host(d);
      rp::Options o{.horizon = 16, .k = 4, .stride = sliding ? 8 : 0};
      rp::Driver ref(host.tape, host.h0, o);
      o.verify_on_device = true, o.read_loss = false;
      rp::Driver drv(m.tape, m.h0, o);
      Model::Source src, src_host;
      const rp::StepFn good = m.step_fn(src), good_host = host.step_fn(src_host);
      const auto window = [&](rp::Driver& dr, const rp::StepFn& f, Model& mm) { return sliding ? dr.slide(f, mm.h0, 8) : dr.run(f, mm.h0); };
      const uint64_t reads = m.tape.stats().host_reads;
      for (int w = 0; w < 3; ++w) {
        const rp::Report r = window(drv, good, m);
        EXPECT_EQ(r.loss, 0.0) << "read_loss off";
        EXPECT_NE(window(ref, good_host, host).loss, 0.0);
      }
      EXPECT_EQ(m.tape.stats().host_reads, reads) << "a window read something back";
      drv.check_replays();  // (reproducible: nothing raised)
      EXPECT_EQ(m.tape.stats().host_reads, reads + 1);
      EXPECT_EQ(m.grads(), host.grads());
      int calls = 0;
      const rp::StepFn drifting = [&](Tape& t, int64_t s, const Tensor& h, rp::Inputs& in) {
        rp::StepResult r = good(t, s, h, in);
        r.state = scale(r.state, 1.0 + 1e-3 * double(++calls));
        return r;
      };
      (void)window(drv, drifting, m);  // (found on the device: run() raises nothing)
      (void)window(drv, good, m);
      std::string msg;
      try {
        drv.check_replays();
      } catch (const Error& e) {
        msg = e.what();
      }
      // the first replay: the window's last segment (slide(): the fourth stride's, steps 24 to 31 counted from the first)
      const std::string where = sliding ? "replaying segment 7 (steps 28..31)" : "replaying segment 3 (steps 12..15)";
      EXPECT_NE(msg.find("the step function is not reproducible: " + where), std::string::npos) << msg;
      EXPECT_NE(msg.find("found on the tape's device by check_replays()"), std::string::npos) << msg;
      drv.check_replays();  // (reported once)
    }
}
