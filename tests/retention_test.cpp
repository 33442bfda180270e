// The retention lab and the explainer, to the byte: each pitfall grows by
// exactly the sizes of what it keeps (every arena allocation is rounded up to
// 64 bytes), each fix has the same high-water in every segment, the strict
// policy refuses each pitfall with its remedy in the message, and the
// explainer attributes a known graph's bytes to the right op kinds and steps.
// Odd sizes (B=3, E=5, H=7, V=6) make every alignment visible.
// Backward's own buffers are checked apart from the forward tape (each row
// records its OpKind::Grad bytes): they follow the engine's gradient reuse.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>

#include "segtape/agent/retention.h"
#include "segtape/explain.h"
#include "segtape/ops.h"

using namespace segtape;
using namespace segtape::agent::retention;

namespace {

LabConfig small() {
  LabConfig c;
  c.steps = 48, c.batch = 3, c.vocab = 6, c.embed = 5, c.hidden = 7, c.lag = 4, c.k = 4, c.window = 4, c.trainer_k = 8;
  return c;
}

size_t A(int64_t n) { return align_up(size_t(n)); }

// What one GRU step with a target allocates in the arena: tokens, embedding,
// the GRU output and (unless recomputed) its saved gates, the logits before
// and after the bias, the targets, the loss and its saved log-sum-exp.
size_t forward_bytes(const LabConfig& c, bool recompute) {
  const int64_t B = c.batch, E = c.embed, H = c.hidden, V = c.vocab;
  return A(B * 8) + A(B * E * 4) + A(B * H * 4) + (recompute ? 0 : A(B * 4 * H * 4)) + 2 * A(B * V * 4) + A(B * 8) + A(4) + A(B * 4);
}

std::vector<double> increments(const Trace& t) {
  std::vector<double> d(t.bytes.size(), 0);
  for (size_t i = 1; i < d.size(); ++i) d[i] = t.bytes[i] - t.bytes[i - 1];
  return d;
}

Trace teach(Case c, const LabConfig& cfg = small()) {
  Trace t = run_segtape(c, cfg);
  EXPECT_TRUE(t.error.empty()) << info(c).name << ": " << t.error;
  EXPECT_EQ(t.bytes.size(), size_t(cfg.steps));
  return t;
}

TEST(Pitfalls, LossSumGrowsByOneStepsTapeEveryStep) {
  const LabConfig c = small();
  const Trace t = teach(Case::LossSum);
  const auto d = increments(t);
  // ... plus the running sum's add node. The last step runs the one backward.
  const size_t per_step = forward_bytes(c, false) + A(4);
  for (int64_t s = c.lag + 1; s + 1 < c.steps; ++s) ASSERT_EQ(d[size_t(s)], double(per_step)) << "step " << s;
  std::printf("loss-sum: %zu bytes per step (B=%ld E=%ld H=%ld V=%ld)\n", per_step, c.batch, c.embed, c.hidden, c.vocab);
}

// Of each row, what is not backward's gradient buffers: the forward tape.
std::vector<double> forward_increments(const Trace& t) {
  std::vector<double> d(t.bytes.size(), 0);
  for (size_t i = 1; i < d.size(); ++i) d[i] = (t.bytes[i] - t.grad_bytes[i]) - (t.bytes[i - 1] - t.grad_bytes[i - 1]);
  return d;
}

// Backward every step through the whole history (pitfalls 1, 5, 6, 7): the
// forward tape of every step stays, exactly; so do each backward's buffers:
// its table of one pointer per node on the tape, plus a working set of
// gradient buffers that is the same every step (backward reuses dead
// gradient buffers within one backward, not across them).
TEST(Pitfalls, BackwardEveryStepKeepsTheGraphAndEveryBackwardsBuffers) {
  const LabConfig c = small();
  for (Case k : {Case::HiddenNotDetached, Case::DetachInputOnly, Case::ClipGrad, Case::Checkpoint}) {
    const Trace t = teach(k);
    const auto fwd = forward_increments(t);
    for (int64_t s = c.lag + 1; s < c.steps; ++s)
      ASSERT_EQ(fwd[size_t(s)], double(forward_bytes(c, k == Case::Checkpoint))) << info(k).name << " step " << s;
    auto working_set = [&](int64_t s) {
      const int64_t nodes = 4 * (s + 1) + (s - c.lag + 1);  // embedding, gru, matmul, add per step; a loss from lag on
      return t.grad_bytes[size_t(s)] - t.grad_bytes[size_t(s - 1)] - double(A(8 * nodes));
    };
    EXPECT_GT(working_set(c.lag + 2), 0.0);
    for (int64_t s = c.lag + 2; s < c.steps; ++s) ASSERT_EQ(working_set(s), working_set(c.lag + 2)) << info(k).name << " step " << s;
  }
  // Clipping changes no byte; recomputation saves exactly the gates, every step.
  const Trace p1 = teach(Case::HiddenNotDetached), p6 = teach(Case::ClipGrad), p7 = teach(Case::Checkpoint);
  EXPECT_EQ(p1.bytes, p6.bytes);
  for (size_t s = 0; s < p1.bytes.size(); ++s)
    ASSERT_EQ(p1.bytes[s] - p7.bytes[s], double((s + 1) * A(small().batch * 4 * small().hidden * 4))) << "step " << s;
}

TEST(Pitfalls, LogitsBufferKeepsEveryChunkWholeInOneSegment) {
  const LabConfig c = small();
  ASSERT_EQ(c.lag % c.k, 0);
  const int64_t K = c.k;
  const Trace t = teach(Case::LogitsBuffer);
  const auto fwd = forward_increments(t);
  // Every step keeps its forward tape, plus the running sum's add after the chunk's first loss.
  for (int64_t s = c.lag + 1; s < c.steps; ++s)
    ASSERT_EQ(fwd[size_t(s)], double(forward_bytes(c, false) + (s % K ? A(4) : 0))) << "step " << s;
  // Every chunk's backward keeps its pointer table and the same working set.
  std::vector<double> working;
  for (int64_t end = c.lag + K - 1; end < c.steps; end += K) {
    const int64_t chunks = (end + 1 - c.lag) / K;
    const int64_t nodes = 4 * (end + 1) + (end + 1 - c.lag) + chunks * (K - 1);  // + losses, + their running sums
    working.push_back(t.grad_bytes[size_t(end)] - t.grad_bytes[size_t(end - K)] - double(A(8 * nodes)));
  }
  ASSERT_GE(working.size(), 3u);
  for (double w : working) ASSERT_EQ(w, working[0]);
  EXPECT_GT(working[0], 0.0);
}

TEST(Pitfalls, GrowingContextAddsTheWholeHistoryEveryStep) {
  const LabConfig c = small();
  const int64_t B = c.batch, E = c.embed, H = c.hidden, V = c.vocab;
  const Trace t = teach(Case::GrowingContext);
  const auto d = increments(t);
  // tokens, embedding, mean, ctx (matmul, bias, tanh), logits (matmul, bias),
  // targets, loss + log-sum-exp, the running sum; plus the new concat [s + 1, B, E].
  const size_t fixed = A(B * 8) + 2 * A(B * E * 4) + 3 * A(B * H * 4) + 2 * A(B * V * 4) + A(B * 8) + A(4) + A(B * 4) + A(4);
  for (int64_t s = c.lag + 1; s + 1 < c.steps; ++s)
    ASSERT_EQ(d[size_t(s)], double(fixed + A((s + 1) * B * E * 4))) << "step " << s;
}

TEST(Fixes, IdenticalHighWaterInEverySegmentAfterWarmUp) {
  LabConfig c = small();
  for (Case k : {Case::Tbptt, Case::Detach, Case::NogradHistory, Case::Window, Case::GruState}) {
    const Trace t = run_segtape(k, c);
    ASSERT_TRUE(t.error.empty()) << info(k).name << ": " << t.error;
    const int64_t K = k == Case::Detach ? 1 : k == Case::GruState ? c.trainer_k : c.k;
    ASSERT_EQ(c.steps % K, 0);
    ASSERT_EQ(t.segment_peaks.size(), size_t(c.steps / K)) << info(k).name;
    const size_t first = size_t((c.lag + K - 1) / K);  // the first segment whose every step has a target
    for (size_t s = first + 1; s < t.segment_peaks.size(); ++s)
      ASSERT_EQ(t.segment_peaks[s], t.segment_peaks[first]) << info(k).name << " segment " << s;
    EXPECT_GT(t.segment_peaks[first], 0) << info(k).name;
    EXPECT_LE(t.segment_peaks[first], double(c.budget)) << info(k).name;
    // Inside segments too: the same bytes at the same position, every segment.
    if (k != Case::GruState) {
      for (int64_t s = int64_t(first + 1) * K; s < c.steps; ++s)
        ASSERT_EQ(t.bytes[size_t(s)], t.bytes[size_t(s - K)]) << info(k).name << " step " << s;
    }
    std::printf("%-15s segment high-water %.0f bytes\n", info(k).name.c_str(), t.segment_peaks[first]);
  }
}

TEST(Strict, EveryPitfallIsRefusedWithItsRemedy) {
  LabConfig c = small();
  c.budget = 8 << 10;
  RunOptions strict;
  strict.strict = true;
  for (const CaseInfo& i : cases()) {
    if (!i.pitfall) continue;
    const Trace t = run_segtape(i.id, c, strict);
    EXPECT_EQ(t.error_type, "BudgetError") << i.name << ": " << t.error;
    EXPECT_NE(t.error.find("budget"), std::string::npos) << t.error;
    EXPECT_NE(t.error.find("seg.carry"), std::string::npos) << "the remedy is missing: " << t.error;
    EXPECT_LT(t.bytes.size(), size_t(c.steps)) << i.name << " ran to the end";
  }
  // Without retain_graph, a backward per step meets the released history at the second loss.
  strict.retain_graph = false;
  for (Case k : {Case::HiddenNotDetached, Case::DetachInputOnly, Case::ClipGrad, Case::Checkpoint}) {
    LabConfig roomy = small();
    const Trace t = run_segtape(k, roomy, strict);
    EXPECT_EQ(t.error_type, "TapeError") << info(k).name << ": " << t.error;
    EXPECT_EQ(t.error_step, roomy.lag + 1) << t.error;
    EXPECT_NE(t.error.find("retain_graph"), std::string::npos) << t.error;
    EXPECT_NE(t.error.find("carry"), std::string::npos) << "the remedy is missing: " << t.error;
  }
}

TEST(Lab, SummaryAndOutputsOnASmallRun) {
  LabConfig c = small();
  c.budget = 16 << 10;  // loss-sum passes it at step ~18, tbptt:4 stays at 7 KiB
  const LabReport r = run_lab(c, {Case::LossSum, Case::Tbptt}, nullptr);
  ASSERT_EQ(r.results.size(), 2u);
  const Summary loss = summarise(r.results[0].segtape, c.budget);
  EXPECT_NEAR(loss.bytes_per_step, double(forward_bytes(c, false) + A(4)), 0.2 * double(forward_bytes(c, false)));
  EXPECT_EQ(r.results[0].strict.error_type, "BudgetError");
  EXPECT_GT(loss.budget_step, double(c.lag));
  EXPECT_FALSE(loss.budget_extrapolated);
  const Summary fix = summarise(r.results[1].segtape, c.budget);
  EXPECT_LT(fix.budget_step, 0) << "a fix never reaches the budget";
  const std::string json = to_json(r), csv = to_csv(r), svg = to_svg(r), tab = table(r);
  EXPECT_NE(json.find("\"bytes_per_step\""), std::string::npos);
  EXPECT_NE(json.find("LibTorch not built"), std::string::npos);
  EXPECT_NE(svg.find("LibTorch not built"), std::string::npos);
  EXPECT_EQ(size_t(std::count(csv.begin(), csv.end(), '\n')), 1 + 2 * size_t(c.steps));
  EXPECT_NE(tab.find("loss-sum"), std::string::npos);
  EXPECT_THROW(parse_case("no-such-case"), Error);
  EXPECT_EQ(parse_case("window"), Case::Window);
}

// ---- the explainer

constexpr int64_t B = 3, I = 5, H = 7, C = 6;

struct Graph {
  Tensor w_ih, w_hh, b_ih, b_hh, w_out;
  explicit Graph(Tape& t)
      : w_ih(t.parameter({3 * H, I})), w_hh(t.parameter({3 * H, H})), b_ih(t.parameter({3 * H})), b_hh(t.parameter({3 * H})),
        w_out(t.parameter({C, H})) {}
  // Per step: x (input, no node), gru (output + saved gates), matmul, tanh, a reshape view.
  Tensor run(Tape& t, int steps) {
    Tensor h = t.zeros({B, H}), y;
    std::vector<float> x(size_t(B * I), 0.5f);
    for (int s = 0; s < steps; ++s, t.next_step()) {
      h = gru_cell(t.from(x, {B, I}), h, w_ih, w_hh, b_ih, b_hh);
      y = reshape(tanh(matmul(h, w_out, false, true)), {B * C});
    }
    return y;
  }
};

TEST(Explain, AttributesAKnownGraphToItsOpKindsAndSteps) {
  constexpr int S = 5;
  Tape tape;
  Graph g(tape);
  for (int i = 0; i < 3; ++i) tape.next_step();  // steps 3..7
  Segment seg = tape.segment();
  const Tensor y = g.run(tape, S);
  const Explanation e = explain(tape);
  std::map<OpKind, size_t> want = {{OpKind::GruCell, S * (A(B * H * 4) + A(B * 4 * H * 4))},
                                   {OpKind::MatMul, S * A(B * C * 4)},
                                   {OpKind::Tanh, S * A(B * C * 4)},
                                   {OpKind::Reshape, 0}};
  const size_t per_step = A(B * H * 4) + A(B * 4 * H * 4) + 2 * A(B * C * 4);
  size_t total = 0, right = 0;
  for (auto [k, b] : want) {
    total += b;
    right += std::min(b, e.node_bytes_by_op[size_t(k)]);
    EXPECT_EQ(e.node_bytes_by_op[size_t(k)], b) << op_name(k);
    EXPECT_EQ(e.nodes_by_op[size_t(k)], size_t(S)) << op_name(k);
  }
  EXPECT_GE(double(right), 0.99 * double(total));
  EXPECT_EQ(e.node_bytes, total);
  ASSERT_EQ(e.by_step.size(), size_t(S));
  size_t right_steps = 0;
  for (int s = 0; s < S; ++s) {
    EXPECT_EQ(e.by_step[size_t(s)].step, uint32_t(3 + s));
    right_steps += std::min(e.by_step[size_t(s)].bytes, per_step);
  }
  EXPECT_GE(double(right_steps), 0.99 * double(total));
  EXPECT_EQ(e.first_step, 3u);
  EXPECT_EQ(e.last_step, uint32_t(3 + S - 1));
  EXPECT_DOUBLE_EQ(e.bytes_per_step(), double(per_step));
  // Everything else in the arena is the inputs: x per step and the zero state.
  EXPECT_EQ(e.arena_by_op[size_t(OpKind::Input)], S * A(B * I * 4) + A(B * H * 4));
  EXPECT_EQ(e.arena_bytes, e.node_bytes + e.arena_by_op[size_t(OpKind::Input)]);
  ASSERT_FALSE(e.largest.empty());
  EXPECT_EQ(e.largest[0].op, OpKind::GruCell);
  EXPECT_EQ(e.largest[0].saved_bytes, A(B * 4 * H * 4));
  EXPECT_EQ(e.largest[0].step, 3u);  // ties: the earliest first
  const std::string r = e.report();
  EXPECT_NE(r.find("GruCell"), std::string::npos) << r;
  EXPECT_NE(r.find("history is retained"), std::string::npos) << r;
  // After a backward its gradient buffers appear as such.
  seg.backward(y, tape.from(std::vector<float>(size_t(B * C), 1.0f), {B * C}));
  const Explanation after = explain(tape);
  EXPECT_GT(after.arena_by_op[size_t(OpKind::Grad)], 0u);
  EXPECT_EQ(after.node_bytes, e.node_bytes);
  std::printf("%s", after.report().c_str());
}

TEST(Explain, AHundredThousandNodeTape) {
  constexpr int64_t N = 100000, per_step = 100;
  TapeOptions o;
  o.segment_budget = size_t(16) << 20;
  o.node_capacity = N + 16;
  Tape tape(Device::cpu(), o);
  const Tensor a = tape.parameter({1});
  Segment seg = tape.segment();
  Tensor x = a;
  for (int64_t i = 0; i < N; ++i) {
    x = add(x, a);
    if ((i + 1) % per_step == 0) tape.next_step();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Explanation e = explain(tape);
  const std::string r = e.report();
  const double ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("explained %zu nodes over %zu steps in %.2f ms (report %zu chars)\n", e.node_count, e.by_step.size(), ms, r.size());
  EXPECT_EQ(e.node_count, size_t(N));
  EXPECT_EQ(e.node_bytes, size_t(N) * kAlign);
  EXPECT_EQ(e.node_bytes_by_op[size_t(OpKind::Add)], size_t(N) * kAlign);
  EXPECT_EQ(e.by_step.size(), size_t(N / per_step));
  for (const StepBytes& s : e.by_step) ASSERT_EQ(s.bytes, size_t(per_step) * kAlign);
  EXPECT_EQ(e.largest.size(), 10u);
  EXPECT_EQ(e.arena_bytes, e.node_bytes);
}

TEST(Explain, DotExportOfASmallSegment) {
  Tape tape;
  Graph g(tape);
  Segment seg = tape.segment();
  g.run(tape, 2);
  const std::string dot = to_dot(tape);
  EXPECT_EQ(dot.rfind("digraph", 0), 0u);
  size_t boxes = 0;
  for (size_t p = dot.find("shape=box"); p != std::string::npos; p = dot.find("shape=box", p + 1)) ++boxes;
  EXPECT_EQ(boxes, tape.nodes().size());
  for (const char* want : {"cluster_step_0", "cluster_step_1", "GruCell", "saved 384 B", "parameter", "n0 -> n"})
    EXPECT_NE(dot.find(want), std::string::npos) << want << "\n" << dot;
  DotOptions late;
  late.first_step = 1;
  EXPECT_NE(to_dot(tape, late).find("from step < 1"), std::string::npos);
  DotOptions tiny;
  tiny.max_nodes = 1;
  EXPECT_THROW(to_dot(tape, tiny), TapeError);
  seg.end();
  EXPECT_THROW(to_dot(tape), TapeError);
  EXPECT_EQ(explain(tape).node_count, 0u);
}

}  // namespace
