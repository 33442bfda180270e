// Segment semantics: one segment == full BPTT; K-step segments == the sum of
// per-segment gradients with the state carried as a constant; carry cuts the
// history; no-grad records nothing; retain_graph allows a second backward.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "util.h"

using namespace segtape;
using namespace segtape::test;

namespace {

struct GruProblem {
  static constexpr int64_t B = 2, I = 3, H = 4, C = 3, T = 6;
  Tape tape;
  Tensor w_ih, w_hh, b_ih, b_hh, w_out;
  std::vector<double> xs;        // [T, B, I]
  std::vector<int64_t> ys;       // [T, B]
  std::vector<double> h0;        // [B, H]
  GruProblem() {
    std::mt19937 rng(42);
    w_ih = tape.parameter({3 * H, I}, DType::F64);
    w_hh = tape.parameter({3 * H, H}, DType::F64);
    b_ih = tape.parameter({3 * H}, DType::F64);
    b_hh = tape.parameter({3 * H}, DType::F64);
    w_out = tape.parameter({C, H}, DType::F64);
    for (Tensor* p : {&w_ih, &w_hh, &b_ih, &b_hh, &w_out}) fill_uniform(*p, rng);
    std::uniform_real_distribution<double> u(-1, 1);
    xs.resize(size_t(T * B * I));
    for (double& v : xs) v = u(rng);
    h0.resize(size_t(B * H));
    for (double& v : h0) v = u(rng);
    ys.resize(size_t(T * B));
    for (size_t i = 0; i < ys.size(); ++i) ys[i] = int64_t(i % C);
  }
  std::vector<Tensor*> params() { return {&w_ih, &w_hh, &b_ih, &b_hh, &w_out}; }
  // One step's loss; h is updated.
  Tensor step(int64_t t, Tensor& h) {
    Tensor x = tape.from(std::span<const double>(xs).subspan(size_t(t * B * I), size_t(B * I)), {B, I});
    Tensor y = tape.from(std::span<const int64_t>(ys).subspan(size_t(t * B), size_t(B)), {B});
    h = gru_cell(x, h, w_ih, w_hh, b_ih, b_hh);
    return cross_entropy(matmul(h, w_out, false, true), y);
  }
  // Loss of steps [t0, t1) starting from state hs (a value), no grad.
  double loss_from(int64_t t0, int64_t t1, const std::vector<double>& hs) {
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    Tensor h = tape.from(std::span<const double>(hs), {B, H});
    double total = 0;
    for (int64_t t = t0; t < t1; ++t) total += step(t, h).item();
    return total;
  }
  // Runs all T steps in segments of K, backward per segment, grads accumulate.
  // Returns the state value at each segment start.
  std::vector<std::vector<double>> train_segments(int64_t K) {
    tape.zero_grad();
    std::vector<std::vector<double>> starts;
    Tensor h;
    for (int64_t t0 = 0; t0 < T; t0 += K) {
      Segment seg = tape.segment();
      if (t0 == 0) h = tape.from(std::span<const double>(h0), {B, H});
      starts.push_back(values(h));
      Tensor loss;
      for (int64_t t = t0; t < std::min(T, t0 + K); ++t) {
        Tensor l = step(t, h);
        loss = t == t0 ? l : add(loss, l);
      }
      seg.backward(loss);
      h = seg.carry(h);
    }
    return starts;
  }
};

TEST(Segment, OneSegmentIsFullBptt) {
  GruProblem p;
  p.train_segments(GruProblem::T);
  for (Tensor* w : p.params()) {
    auto numeric = numeric_grad(*w, [&] { return p.loss_from(0, GruProblem::T, p.h0); });
    EXPECT_LE(rel_error(values(w->grad_tensor()), numeric), 1e-7);
  }
}

TEST(Segment, KStepSegmentsSumPerSegmentGradients) {
  for (int64_t K : {1, 2, 4}) {
    GruProblem p;
    auto starts = p.train_segments(K);
    ASSERT_EQ(starts.size(), size_t((GruProblem::T + K - 1) / K));
    for (Tensor* w : p.params()) {
      // Truncated objective: each segment's loss with its start state held constant.
      std::vector<double> expect(size_t(w->numel()), 0.0);
      for (size_t s = 0; s < starts.size(); ++s) {
        const int64_t t0 = int64_t(s) * K, t1 = std::min(GruProblem::T, t0 + K);
        auto g = numeric_grad(*w, [&] { return p.loss_from(t0, t1, starts[s]); });
        for (size_t i = 0; i < g.size(); ++i) expect[i] += g[i];
      }
      EXPECT_LE(rel_error(values(w->grad_tensor()), expect), 1e-7) << "K=" << K;
    }
    if (K < GruProblem::T) {
      // Truncation really changed the gradient of the recurrent weights.
      auto full = numeric_grad(p.w_hh, [&] { return p.loss_from(0, GruProblem::T, p.h0); });
      EXPECT_GT(rel_error(values(p.w_hh.grad_tensor()), full), 1e-4) << "K=" << K;
    }
  }
}

TEST(Segment, CarryCutsHistory) {
  Tape tape;
  Tensor w = tape.parameter({2, 2});
  Tensor v = tape.parameter({2, 2});
  for (float& x : w.span<float>()) x = 0.5f;
  for (float& x : v.span<float>()) x = 2.0f;
  Tensor c;
  {
    Segment seg = tape.segment();
    Tensor h = scale(w, 3.0);
    ASSERT_TRUE(h.requires_grad);
    c = seg.carry(h);
    EXPECT_FALSE(c.requires_grad);
    EXPECT_EQ(c.node, -1);
  }
  {
    Segment seg = tape.segment();
    EXPECT_EQ(values(c), std::vector<double>(4, 1.5));
    seg.backward(sum(mul(c, v)));
    EXPECT_EQ(values(v.grad_tensor()), std::vector<double>(4, 1.5));
    EXPECT_EQ(values(w.grad_tensor()), std::vector<double>(4, 0.0));  // history was cut
  }
}

TEST(Segment, NoGradRecordsNothingAndDetachCutsHistory) {
  Tape tape;
  Tensor w = tape.parameter({3, 3});
  Segment seg = tape.segment();
  {
    NoGradGuard ng(tape);
    Tensor y = tanh(matmul(w, w));
    EXPECT_FALSE(y.requires_grad);
    EXPECT_EQ(tape.stats().node_count, 0u);
  }
  Tensor y = tanh(matmul(w, w));
  EXPECT_EQ(tape.stats().node_count, 2u);
  Tensor d = detach(y);
  EXPECT_FALSE(d.requires_grad);
  EXPECT_EQ(d.ptr, y.ptr);  // a view, no copy
  EXPECT_THROW(seg.backward(sum(d)), TapeError);
}

TEST(Segment, RetainGraphAllowsSecondBackwardAndAccumulates) {
  Tape tape;
  Tensor w = tape.parameter({2});
  for (float& x : w.span<float>()) x = 3.0f;
  Segment seg = tape.segment();
  Tensor loss = sum(mul(w, w));  // d/dw = 2w = 6
  seg.backward(loss, {.retain_graph = true});
  seg.backward(loss);
  EXPECT_EQ(values(w.grad_tensor()), std::vector<double>(2, 12.0));
  tape.zero_grad();
  EXPECT_EQ(values(w.grad_tensor()), std::vector<double>(2, 0.0));
}

TEST(Segment, ParametersGradientsPersistAcrossSegments) {
  Tape tape;
  Tensor w = tape.parameter({1});
  w.data<float>()[0] = 2.0f;
  for (int s = 0; s < 3; ++s) {
    Segment seg = tape.segment();
    seg.backward(sum(scale(w, 1.5)));
  }
  EXPECT_FLOAT_EQ(w.grad_tensor().data<float>()[0], 4.5f);
  EXPECT_EQ(tape.stats().segment_index, 3u);
}

}  // namespace

namespace {
// Backward batches the GRU weight gradients of many steps into one GEMM per
// chunk of max(128, H) rows; it must give the per-step result (float64, to rounding).
TEST(Segment, BatchedGruWeightGradientsEqualPerStepOnes) {
  for (int64_t B : {1, 3, 50}) {  // 50 rows per step: chunks of 2 steps, so 4 flushes over 7 steps
    std::vector<std::vector<double>> grads[2];
    for (int batched = 0; batched < 2; ++batched) {
      Tape tape(Device::cpu(), {.batch_weight_grads = batched == 1});
      std::mt19937 rng(5);
      const int64_t I = 3, H = 4;
      std::vector<Tensor> w = {tape.parameter({3 * H, I}, DType::F64), tape.parameter({3 * H, H}, DType::F64),
                               tape.parameter({3 * H}, DType::F64), tape.parameter({3 * H}, DType::F64)};
      Tensor x = tape.parameter({B, I}, DType::F64);
      for (auto& t : w) fill_uniform(t, rng);
      fill_uniform(x, rng);
      Segment seg = tape.segment();
      Tensor h = tape.zeros({B, H}, DType::F64), loss;
      for (int t = 0; t < 7; ++t) {
        h = gru_cell(scale(x, 1.0 + 0.1 * t), h, w[0], w[1], w[2], w[3]);
        loss = t ? add(loss, mean(mul(h, h))) : mean(mul(h, h));
      }
      seg.backward(loss);
      for (auto& t : w) grads[batched].push_back(values(t.grad_tensor()));
      grads[batched].push_back(values(x.grad_tensor()));
      if (batched) {
        EXPECT_GT(tape.stats().workspace_bytes, 0u);
      }
    }
    for (size_t k = 0; k < grads[0].size(); ++k)
      EXPECT_LE(rel_error(grads[0][k], grads[1][k]), 1e-13) << "B=" << B << " tensor " << k;
  }
}

// The LSTM's weight gradients go through the same batch (one buffer of gate
// gradients for both weights); a GRU stepped between its steps, on weights of
// its own, starts groups of its own kind. Per-step and batched agree.
TEST(Segment, BatchedLstmWeightGradientsEqualPerStepOnesBesideAGru) {
  for (int64_t B : {1, 3, 50}) {
    std::vector<std::vector<double>> grads[2];
    for (int batched = 0; batched < 2; ++batched) {
      Tape tape(Device::cpu(), {.batch_weight_grads = batched == 1});
      std::mt19937 rng(6);
      const int64_t I = 3, H = 4;
      std::vector<Tensor> w = {tape.parameter({4 * H, I}, DType::F64), tape.parameter({4 * H, H}, DType::F64),
                               tape.parameter({4 * H}, DType::F64),    tape.parameter({4 * H}, DType::F64),
                               tape.parameter({3 * H, H}, DType::F64), tape.parameter({3 * H, H}, DType::F64),
                               tape.parameter({3 * H}, DType::F64),    tape.parameter({3 * H}, DType::F64)};
      Tensor x = tape.parameter({B, I}, DType::F64);
      for (auto& t : w) fill_uniform(t, rng);
      fill_uniform(x, rng);
      Segment seg = tape.segment();
      Tensor s = tape.zeros({2, B, H}, DType::F64), g = tape.zeros({B, H}, DType::F64), loss;
      for (int t = 0; t < 7; ++t) {
        s = lstm_cell(scale(x, 1.0 + 0.1 * t), s, w[0], w[1], w[2], w[3]);
        g = gru_cell(lstm_h(s), g, w[4], w[5], w[6], w[7]);
        Tensor l = add(mean(mul(s, s)), mean(g));
        loss = t ? add(loss, l) : l;
      }
      seg.backward(loss);
      for (auto& t : w) grads[batched].push_back(values(t.grad_tensor()));
      grads[batched].push_back(values(x.grad_tensor()));
    }
    for (size_t k = 0; k < grads[0].size(); ++k)
      EXPECT_LE(rel_error(grads[0][k], grads[1][k]), 1e-13) << "B=" << B << " tensor " << k;
  }
}
}  // namespace

// More parts than a node's 6 inputs: a balanced tree of concat nodes. 36 rows
// of 16 floats (64 B each): 6 runs of 6 rows, then the 6 runs: every row is
// copied twice (4,608 B), where a chain of groups copied the growing head
// again for every group (6 + 11 + ... + 36 = 147 rows, 9,408 B). Values and
// gradients are checked too (each part gets its own row's gradient back).
TEST(Segment, ConcatOfManyPartsIsABalancedTree) {
  Tape tape;
  constexpr int64_t kParts = 36, kD = 16;
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < kParts; ++i) {
    parts.push_back(tape.parameter({1, kD}));
    std::vector<float> v(kD);
    for (int64_t j = 0; j < kD; ++j) v[size_t(j)] = float(i * 100 + j);
    parts.back().from_host(std::span<const float>(v));
  }
  Segment seg = tape.segment();
  const Tensor all = concat(std::span<const Tensor>(parts), 0);
  ASSERT_EQ(all.shape, (Shape{kParts, kD}));
  const std::vector<float> got = all.to_host<float>();
  for (int64_t i = 0; i < kParts; ++i)
    for (int64_t j = 0; j < kD; ++j) ASSERT_EQ(got[size_t(i * kD + j)], float(i * 100 + j));
  EXPECT_EQ(tape.stats().bytes_by_op[size_t(OpKind::Concat)], size_t(2 * kParts * kD * sizeof(float)));
  // d(sum(all * all)) / d(part i) = 2 part i
  seg.backward(sum(mul(all, all)));
  for (int64_t i = 0; i < kParts; ++i) {
    const std::vector<float> g = parts[size_t(i)].grad_tensor().to_host<float>();
    for (int64_t j = 0; j < kD; ++j) ASSERT_EQ(g[size_t(j)], 2.0f * float(i * 100 + j));
  }
  // Along axis 1 too (window:N's compress layer): 13 parts of [2, 3].
  std::vector<Tensor> cols;
  for (int i = 0; i < 13; ++i) cols.push_back(tape.zeros({2, 3}));
  EXPECT_EQ(concat(std::span<const Tensor>(cols), 1).shape, (Shape{2, 39}));
}

// ---- views of any tensor: valid wherever they are used, or the expired error

namespace {
// d/dW of sum(x @ reshape(W)ᵀ): every row of W's gradient is the column sums of x.
std::vector<float> matmul_sum_weight_grad(const std::vector<float>& x, int64_t B, int64_t I, int64_t O) {
  std::vector<float> g(size_t(O * I), 0.0f);
  for (int64_t o = 0; o < O; ++o)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < I; ++i) g[size_t(o * I + i)] += x[size_t(b * I + i)];
  return g;
}
template <class F>
std::string expired_message(F f) {
  return message_of<ExpiredTensorError>(f);
}
}  // namespace

TEST(SegmentViews, ViewOfAParameterMadeInOneSegmentExpiresInTheNext) {
  // A view that records a node belongs to the segment that recorded it.
  constexpr int64_t B = 4, I = 8, O = 8;
  Tape tape;
  Tensor w = tape.parameter({O * I});  // flat, viewed as [O, I]
  Tensor view;
  {
    Segment seg = tape.segment();
    view = reshape(w, {O, I});
    EXPECT_EQ(view.space, Space::Segment);
  }
  Segment seg = tape.segment();
  std::vector<float> xv(size_t(B * I), 0.5f);
  Tensor x = tape.from(std::span<const float>(xv), {B, I});
  const std::string m = expired_message([&] { (void)matmul(x, view, false, true); });
  EXPECT_NE(m.find("made in segment 1"), std::string::npos) << m;
  for (const char* op : {"transpose", "slice", "detach", "concat"}) {
    const std::string m2 = expired_message([&] {
      if (std::string(op) == "transpose") (void)transpose(view);
      else if (std::string(op) == "slice") (void)slice(view, 0, 0, 1);
      else if (std::string(op) == "detach") (void)detach(view);
      else (void)concat({view}, 0);
    });
    EXPECT_NE(m2.find("has expired"), std::string::npos) << op << ": " << m2;
  }
}

TEST(SegmentViews, ViewsOfParametersGiveTheRightGradientInEverySegment) {
  // Each segment makes its own view; the gradient lands in the parameter's
  // buffer with the right values, segment after segment.
  constexpr int64_t B = 4, I = 8, O = 8;
  Tape tape;
  Tensor w = tape.parameter({O * I});
  std::vector<float> xv(size_t(B * I));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(i % 7) - 3.0f;
  const std::vector<float> want = matmul_sum_weight_grad(xv, B, I, O);
  for (int s = 0; s < 3; ++s) {
    tape.zero_grad();
    Segment seg = tape.segment();
    Tensor x = tape.from(std::span<const float>(xv), {B, I});
    Tensor wt = transpose(reshape(w, {O, I}));  // [I, O], a copy of a view
    seg.backward(sum(matmul(x, wt)));
    const std::vector<float> got = w.grad_tensor().to_host<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << "segment " << s << " element " << i;
  }
}

TEST(SegmentViews, UnrecordedViewsOfPersistentTensorsStayValid) {
  // No node (no gradient wanted): the view is the persistent bytes, valid in any segment.
  Tape tape;
  Tensor p = tape.persistent({2, 3});
  p.from_host(std::span<const float>(std::vector<float>{1, 2, 3, 4, 5, 6}));
  Tensor w = tape.parameter({6});
  Tensor flat, frozen;
  {
    Segment seg = tape.segment();
    flat = reshape(p, {6});
    frozen = detach(w);
    EXPECT_EQ(flat.space, Space::Persistent);
    EXPECT_EQ(frozen.space, Space::Persistent);
    EXPECT_FALSE(frozen.requires_grad);
  }
  Segment seg = tape.segment();
  EXPECT_DOUBLE_EQ(sum(flat).item(), 21.0);
  EXPECT_DOUBLE_EQ(sum(frozen).item(), 0.0);
}

TEST(SegmentViews, EveryOpRaisesWithNoSegmentOpen) {
  Tape tape;
  Tensor w = tape.parameter({2, 3});
  Tensor v = tape.persistent({2, 3});
  auto raises = [&](const char* op, auto f) {
    try {
      f();
      ADD_FAILURE() << op << " ran with no segment open";
    } catch (const TapeError& e) {
      EXPECT_NE(std::string(e.what()).find("no segment is open"), std::string::npos) << op << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).rfind(op, 0), 0u) << e.what();
    }
  };
  raises("reshape", [&] { (void)reshape(w, {3, 2}); });
  raises("reshape", [&] { (void)reshape(v, {6}); });
  raises("transpose", [&] { (void)transpose(w); });
  raises("slice", [&] { (void)slice(w, 0, 0, 1); });
  raises("concat", [&] { (void)concat({w}, 0); });
  raises("concat", [&] { (void)concat({w, w}, 0); });
  raises("detach", [&] { (void)detach(w); });
  raises("add", [&] { (void)add(w, w); });
  EXPECT_EQ(tape.stats().node_count, 0u);
}

// ---- node memory is segment memory

TEST(SegmentNodes, NodesCountInTheBudgetAndTheArrayStaysWithinIt) {
  // 200,000 zero-byte views under a 1 MiB budget: refused once the nodes
  // fill the budget, with node memory named in the report.
  const size_t budget = size_t(1) << 20;
  Tape tape(Device::cpu(), {.segment_budget = budget});
  Tensor w = tape.parameter({4, 4});
  std::string m;
  size_t nodes_when_refused = 0;
  {
    Segment seg = tape.segment();
    try {
      for (int i = 0; i < 200000; ++i) (void)reshape(w, {16});
    } catch (const BudgetError& e) {
      m = e.what();
    }
    nodes_when_refused = tape.stats().node_count;
    EXPECT_LE(tape.stats().node_bytes + tape.stats().live_bytes, budget);
    EXPECT_LE(tape.nodes().capacity() * sizeof(Node), budget + sizeof(Node));  // the array never outgrew the budget
  }
  ASSERT_FALSE(m.empty()) << "200,000 views ran without error under a 1 MiB budget";
  EXPECT_EQ(nodes_when_refused, budget / sizeof(Node));
  EXPECT_NE(m.find("the largest share is tape nodes"), std::string::npos) << m;
  EXPECT_NE(m.find("Tape nodes: " + std::to_string(nodes_when_refused)), std::string::npos) << m;
  EXPECT_EQ(tape.stats().node_peak_bytes, nodes_when_refused * sizeof(Node));
  // The next segment starts empty and the same work fails at the same count.
  Segment seg = tape.segment();
  EXPECT_EQ(tape.stats().node_bytes, 0u);
  EXPECT_THROW(
      {
        for (int i = 0; i < 200000; ++i) (void)reshape(w, {16});
      },
      BudgetError);
  EXPECT_EQ(tape.stats().node_count, nodes_when_refused);
}

TEST(SegmentNodes, NodeAndArenaBytesShareTheBudget) {
  // With nodes recorded, an arena request that fits alone is refused when
  // arena + nodes would pass the budget.
  const size_t budget = size_t(64) << 10;
  Tape tape(Device::cpu(), {.segment_budget = budget});
  Tensor w = tape.parameter({4});
  Segment seg = tape.segment();
  for (int i = 0; i < 100; ++i) (void)reshape(w, {2, 2});  // 100 nodes, 0 arena bytes
  const size_t nodes = 100 * sizeof(Node);
  const size_t fits_alone = budget - 4096;  // fits an empty arena, not beside the nodes
  ASSERT_GT(nodes, 4096u);
  EXPECT_THROW((void)tape.empty({int64_t(fits_alone / sizeof(float))}), BudgetError);
  EXPECT_NO_THROW((void)tape.empty({int64_t((budget - nodes - 64) / sizeof(float))}));
}

// ---- the budget report's advice fits the case

namespace {
std::string budget_message(const std::function<void()>& f) { return message_of<BudgetError>(f); }
}  // namespace

TEST(SegmentBudgetAdvice, OneStepLargerThanTheBudgetIsToldSo) {
  Tape tape(Device::cpu(), {.segment_budget = 64 << 10});
  Tensor w = tape.parameter({256, 256});
  for (int i = 0; i < 5; ++i) tape.next_step();  // steps are counted; the segment opens at step 5
  Segment seg = tape.segment();
  const std::string m = budget_message([&] {
    Tensor x = tape.zeros({64, 256});
    (void)matmul(x, w);  // 64 KiB output beside a 64 KiB input: step 0 alone is too big
  });
  ASSERT_FALSE(m.empty());
  EXPECT_NE(m.find("One step needs more than the budget"), std::string::npos) << m;
  EXPECT_EQ(m.find("retaining history"), std::string::npos) << m;
  EXPECT_NE(m.find("raise TapeOptions::segment_budget"), std::string::npos) << m;
}

TEST(SegmentBudgetAdvice, OneStepIsToldByTheNodesNotByTheCounter) {
  // The step counter moved on before backward (as a loop that counts steps
  // does), but every recorded node is of one step: still one step too large.
  Tape tape(Device::cpu(), {.segment_budget = 26 << 10});
  Tensor w = tape.parameter({64, 64});
  tape.next_step();
  Segment seg = tape.segment();
  Tensor x = tape.zeros({32, 64});
  Tensor loss = sum(tanh(matmul(x, w)));  // 3 x 8 KiB and 3 nodes: backward's gradients do not fit
  tape.next_step();
  const std::string m = budget_message([&] { seg.backward(loss); });
  EXPECT_NE(m.find("One step needs more than the budget"), std::string::npos) << m;
}

TEST(SegmentBudgetAdvice, UncountedStepsSayTheReportCannotTell) {
  Tape tape(Device::cpu(), {.segment_budget = 64 << 10});
  Tensor w = tape.parameter({16, 16});
  Segment seg = tape.segment();
  const std::string m = budget_message([&] {
    Tensor h = tape.zeros({4, 16});
    for (int t = 0; t < 10000; ++t) h = tanh(matmul(h, w));  // never tape.next_step()
  });
  EXPECT_NE(m.find("steps are not counted"), std::string::npos) << m;
  EXPECT_NE(m.find("end it every K steps"), std::string::npos) << m;
  EXPECT_EQ(m.find("One step needs more"), std::string::npos) << m;
}

TEST(SegmentBudgetAdvice, OutputsKeptWithNoGraphAreNotCalledRetention) {
  Tape tape(Device::cpu(), {.segment_budget = 64 << 10});
  Tensor w = tape.parameter({16, 16});
  Segment seg = tape.segment();
  const std::string m = budget_message([&] {
    NoGradGuard ng(tape);
    Tensor h = tape.zeros({4, 16});
    for (int t = 0; t < 10000; ++t, tape.next_step()) h = tanh(matmul(h, w));
  });
  ASSERT_FALSE(m.empty());
  EXPECT_NE(m.find("No graph is recorded in this segment (0 tape nodes"), std::string::npos) << m;
  EXPECT_EQ(m.find("retaining history"), std::string::npos) << m;
}

TEST(SegmentBudgetAdvice, TheBudgetIsNamedAsTheCallerSetsIt) {
  Tape tape(Device::cpu(), {.segment_budget = 64 << 10, .budget_name = "--budget"});
  Tensor w = tape.parameter({16, 16});
  Segment seg = tape.segment();
  const std::string m = budget_message([&] {
    Tensor h = tape.zeros({4, 16});
    for (int t = 0; t < 10000; ++t, tape.next_step()) h = tanh(matmul(h, w));
  });
  EXPECT_NE(m.find("segment budget exceeded (--budget = 64.0 KiB"), std::string::npos) << m;
  EXPECT_NE(m.find("raise --budget"), std::string::npos) << m;
  EXPECT_EQ(m.find("TapeOptions"), std::string::npos) << m;
}

// The ops that only move values (concat, slice, reshape, transpose) take
// int64 tensors, as PyTorch's do, with every value moved as it is (values
// past 2^53, which a double would round, and negative ones); arithmetic on
// them is still refused, and parts of two dtypes.
TEST(Int64, DataMovementOpsTakeIntegerTensors) {
  Tape tape;
  Segment seg = tape.segment();
  const int64_t big = (int64_t(1) << 53) + 1;
  const std::vector<int64_t> av{0, -1, big, 3, -big, 5}, bv{7, 8};
  const Tensor a = tape.from(std::span<const int64_t>(av), {2, 3}), b = tape.from(std::span<const int64_t>(bv), {2, 1});
  EXPECT_EQ(concat({a, b}, 1).to_host<int64_t>(), (std::vector<int64_t>{0, -1, big, 7, 3, -big, 5, 8}));
  EXPECT_EQ(concat({a, a}, 0).shape, (Shape{4, 3}));
  EXPECT_EQ(slice(a, 1, 1, 2).to_host<int64_t>(), (std::vector<int64_t>{-1, big, -big, 5}));
  const Tensor r = reshape(a, {3, 2});
  EXPECT_EQ(r.shape, (Shape{3, 2}));
  EXPECT_EQ(r.dtype, DType::I64);
  EXPECT_EQ(r.to_host<int64_t>(), av);
  EXPECT_EQ(transpose(a).to_host<int64_t>(), (std::vector<int64_t>{0, 3, -1, -big, big, 5}));
  EXPECT_THROW((void)add(a, a), ShapeError);
  const std::vector<float> fv{1, 2};
  const Tensor f = tape.from(std::span<const float>(fv), {2, 1});
  EXPECT_NE(message_of<ShapeError>([&] { (void)concat({a, f}, 1); }).find("concat: dtypes differ"), std::string::npos);
}
