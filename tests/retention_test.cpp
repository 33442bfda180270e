// The retention lab and the explainer, to the byte: each pitfall grows by
// exactly the sizes of what it keeps (every arena allocation is rounded up to
// 64 bytes), each fix has the same high-water in every segment, the strict
// policy refuses each pitfall with its remedy in the message, and the
// explainer attributes a known graph's bytes to the right op kinds and steps.
// exact-replay's gradients equal pitfall 1's, and its memory is one replayed
// segment plus a stored state per K steps.
// Odd sizes (B=3, E=5, H=7, V=6) make every alignment visible.
// Backward's own buffers are checked apart from the forward tape (each row
// records its TapeStats::grad_bytes): they follow the engine's gradient reuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include "segtape/agent/plot.h"
#include "segtape/agent/retention.h"
#include "segtape/agent/trainer.h"
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
    // Inside segments too: a row per step, the same bytes at the same
    // position every segment, never less than the step before within one.
    ASSERT_EQ(t.bytes.size(), size_t(c.steps)) << info(k).name;
    for (int64_t s = int64_t(first + 1) * K; s < c.steps; ++s)
      ASSERT_EQ(t.bytes[size_t(s)], t.bytes[size_t(s - K)]) << info(k).name << " step " << s;
    for (int64_t s = 1; s < c.steps; ++s)
      if (s % K != 0) {
        ASSERT_GE(t.bytes[size_t(s)], t.bytes[size_t(s - 1)]) << info(k).name << " step " << s;
      }
    std::printf("%-15s segment high-water %.0f bytes\n", info(k).name.c_str(), t.segment_peaks[first]);
  }
}

// gru-state is the agent Trainer's loop, step by step: every segment's
// high-water equals a Trainer's with the same configuration, to the byte.
TEST(Fixes, GruStateIsTheTrainersLoopStepByStep) {
  LabConfig c = small();
  c.steps = 44;  // a last, shorter segment (44 = 5 * 8 + 4)
  const Trace t = run_segtape(Case::GruState, c);
  ASSERT_TRUE(t.error.empty()) << t.error;
  ASSERT_EQ(t.step.size(), size_t(c.steps));
  for (int64_t s = 0; s < c.steps; ++s) ASSERT_EQ(t.step[size_t(s)], s);
  agent::TrainConfig tc;
  tc.env = "recall";
  tc.history = agent::History::parse("tbptt:" + std::to_string(c.trainer_k));
  tc.steps = c.steps, tc.batch = c.batch, tc.hidden = c.hidden, tc.embed = c.embed, tc.seed = c.seed, tc.budget = c.budget;
  tc.env_options.lag = c.lag, tc.env_options.vocab = c.vocab;
  agent::Trainer trainer(tc);
  std::vector<double> peaks;
  while (!trainer.done()) trainer.run_segment(), peaks.push_back(double(trainer.tape().stats().last_segment_peak));
  EXPECT_EQ(t.segment_peaks, peaks);
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
  c.budget = 32 << 10;  // loss-sum passes it at step ~29; tbptt:4 stays at 7 KiB (and its tape nodes, which count in the budget)
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

// LabHooks::interrupted (Python's Ctrl-C): asked before each case, every 64th
// step of a run, between the exact driver's segments and the anomaly timing's
// segments; true ends the lab with Interrupted (not an Error, which a run
// would record as its result).
TEST(Lab, AnInterruptCheckStopsItMidRun) {
  LabConfig c = small();
  c.steps = 640;
  for (Case which : {Case::HiddenNotDetached, Case::Tbptt, Case::ExactReplay}) {
    SCOPED_TRACE(info(which).name);
    int asked = 0;
    LabHooks h;
    h.measure_anomaly = false;
    h.interrupted = [&] { return ++asked == 4; };  // the first during the case's first run
    EXPECT_THROW(run_lab(c, {which}, nullptr, h), Interrupted);
    EXPECT_EQ(asked, 4);
  }
  int asked = 0;
  EXPECT_THROW(anomaly_cost(c, 256, [&] { return ++asked == 3; }), Interrupted);
  EXPECT_EQ(asked, 3);
  LabHooks never;
  never.measure_anomaly = false;
  never.interrupted = [] { return false; };
  EXPECT_EQ(run_lab(c, {Case::Tbptt}, nullptr, never).results.size(), 1u);
}

// ---- exact-replay: pitfall 1's gradients by segment replay

// Pitfall 1 backpropagates every step's loss through the whole history and
// updates once; one replay::Driver window over the episode gives the same

// gradients, whatever K (a last, shorter segment included).
TEST(ExactReplay, GradientsEqualPitfallOnesForEveryK) {
  const LabConfig c = small();
  const Trace p1 = teach(Case::HiddenNotDetached);
  ASSERT_FALSE(p1.grads.empty());
  double norm = 0;
  for (const NamedValues& g : p1.grads)
    if (g.name == "gru.weight_hh")
      for (float v : g.values) norm += double(v) * v;
  EXPECT_GT(norm, 0) << "the recurrent weights have a gradient: the check compares something";
  for (int64_t k : {int64_t(1), c.k, int64_t(5), c.steps}) {
    LabConfig ck = c;
    ck.k = k;
    const Trace t = run_segtape(Case::ExactReplay, ck);
    ASSERT_TRUE(t.error.empty()) << t.error;
    const GradCheck g = compare_gradients(t, p1);
    EXPECT_TRUE(g.run) << g.problem;
    EXPECT_TRUE(g.problem.empty()) << g.problem;
    EXPECT_EQ(g.parameters, p1.grads.size());
    EXPECT_LE(g.max_rel_error, 1e-5) << "K = " << k << ", worst: " << g.worst;
    EXPECT_TRUE(g.passed());
    std::printf("exact-replay K=%-2ld vs pitfall 1: max relative error %.2e (%s)\n", k, g.max_rel_error, g.worst.c_str());
  }
  // The check sees a difference, and says when it cannot run.
  Trace off = run_segtape(Case::ExactReplay, c);
  off.grads[1].values[0] *= 1.01f;
  EXPECT_FALSE(compare_gradients(off, p1).passed());
  Trace none = off;
  none.grads.clear();
  EXPECT_FALSE(compare_gradients(none, p1).run);
  EXPECT_NE(compare_gradients(none, p1).problem.find("has no gradients"), std::string::npos);
}

// Row t: the arena after step t in its replayed segment (a segment's last
// step: the segment's high-water, backward included) + the boundary states
// needed then: one per K steps, plus dL/dh and the final state.
TEST(ExactReplay, OneSegmentPlusAStatePerKSteps) {
  const LabConfig c = small();
  const int64_t K = c.k, S = c.steps / K;
  const Trace t = run_segtape(Case::ExactReplay, c);
  ASSERT_TRUE(t.error.empty()) << t.error;
  ASSERT_EQ(t.bytes.size(), size_t(c.steps));
  ASSERT_EQ(t.state_bytes.size(), size_t(c.steps));
  const size_t state = A(c.batch * c.hidden * 4);
  for (int64_t s = 0; s < c.steps; ++s) {
    ASSERT_EQ(t.state_bytes[size_t(s)], double(size_t(s / K + 3) * state)) << "step " << s;
    EXPECT_GT(t.seconds[size_t(s)], 0) << "step " << s;
  }
  EXPECT_EQ(t.state_bytes.back(), double(t.replay.state_bytes)) << "all S + 2 states at the last step";
  EXPECT_EQ(t.replay.segments, S);
  EXPECT_EQ(t.replay.stored_states, S);
  EXPECT_EQ(t.replay.steps_run, 2 * c.steps);
  // The replayed segments are tbptt:K's segments: the same high-water to the
  // byte (the state arrives as the segment's input instead of carried, the
  // backward is seeded with dL/dh), and the same arena step by step but for
  // the running sum of the losses, which the driver adds after the step
  // returns: its 64 bytes appear one row later.
  const Trace tb = run_segtape(Case::Tbptt, c);
  ASSERT_TRUE(tb.error.empty()) << tb.error;
  const size_t first = size_t((c.lag + K - 1) / K);  // the first segment whose every step has a target
  ASSERT_EQ(t.segment_peaks.size(), size_t(S));
  for (size_t u = first; u < size_t(S); ++u) EXPECT_EQ(t.segment_peaks[u], tb.segment_peaks[u]) << "segment " << u;
  for (int64_t s = int64_t(first) * K; s < c.steps; ++s) {
    const bool inner = s % K != 0 && s % K != K - 1;  // a running sum made, the segment's high-water not reached
    ASSERT_EQ(t.bytes[size_t(s)] - t.state_bytes[size_t(s)], tb.bytes[size_t(s)] - (inner ? double(A(4)) : 0)) << "step " << s;
  }
  std::printf("exact-replay: segment high-water %.0f bytes (tbptt:%ld %.0f), %ld states of %zu bytes at the last step\n",
              t.segment_peaks[first], K, tb.segment_peaks[first], S + 2, state);
}

// The lab runs the check (pitfall 1 for it alone when not asked for), prints
// it and writes it to the JSON; a failed check is flagged in both.
TEST(ExactReplay, TheLabChecksAndFlags) {
  const LabConfig c = small();
  LabReport r = run_lab(c, {Case::ExactReplay}, nullptr);
  ASSERT_EQ(r.results.size(), 1u) << "pitfall 1 ran for the check, not as a case";
  const GradCheck& g = r.results[0].grad_check;
  EXPECT_TRUE(g.passed()) << g.problem << " " << g.max_rel_error;
  EXPECT_FALSE(r.results[0].libtorch_grad_check.run);
  EXPECT_TRUE(r.checks_passed());
  const std::string tab = table(r), json = to_json(r);
  EXPECT_NE(tab.find("exact-replay (exact:4/48): parameter gradients vs 1 hidden-not-detached's"), std::string::npos) << tab;
  EXPECT_NE(tab.find("equal"), std::string::npos) << tab;
  EXPECT_EQ(tab.find("FAILED"), std::string::npos) << tab;
  EXPECT_NE(json.find("\"gradient_check\""), std::string::npos);
  EXPECT_NE(json.find("\"checks_passed\": true"), std::string::npos);
  EXPECT_NE(json.find("\"state_bytes\""), std::string::npos);
  r.results[0].grad_check.max_rel_error = 1e-3;
  EXPECT_FALSE(r.checks_passed());
  EXPECT_NE(table(r).find("FAILED"), std::string::npos);
  EXPECT_NE(to_json(r).find("\"checks_passed\": false"), std::string::npos);
}

// Every name the table prints is a name --cases takes; anything else is
// refused with the list.
TEST(Lab, ParseCaseTakesTheNamesTheTablePrints) {
  const LabConfig def;
  EXPECT_EQ(parse_case("tbptt:8"), Case::Tbptt);
  EXPECT_EQ(parse_case("tbptt"), Case::Tbptt);
  EXPECT_EQ(parse_case("window:8"), Case::Window);
  EXPECT_EQ(parse_case("gru-state (tbptt:32)"), Case::GruState);
  EXPECT_EQ(parse_case("1 hidden-not-detached"), Case::HiddenNotDetached);
  EXPECT_EQ(parse_case("6"), Case::ClipGrad);
  EXPECT_EQ(parse_case(" loss-sum "), Case::LossSum);
  EXPECT_EQ(parse_case("tbptt:4", small()), Case::Tbptt);
  EXPECT_EQ(parse_case("exact-replay"), Case::ExactReplay);
  EXPECT_EQ(parse_case("exact-replay (exact:8/200)"), Case::ExactReplay);
  EXPECT_EQ(parse_case("exact-replay (exact:4/48)", small()), Case::ExactReplay);
  const std::string names = case_names(def);
  size_t n = 0;
  for (size_t a = 0; a < names.size(); ++n) {
    const size_t e = std::min(names.find(", ", a), names.size());
    EXPECT_EQ(parse_case(names.substr(a, e - a)), cases()[n].id) << names.substr(a, e - a);
    a = e + 2;
  }
  EXPECT_EQ(n, cases().size()) << names;
  for (const char* want : {"1 hidden-not-detached", "7 checkpoint", "tbptt:8", "window:8", "gru-state (tbptt:32)", "exact-replay (exact:8/200)"})
    EXPECT_NE(names.find(want), std::string::npos) << names;
  auto refusal = [](const std::string& name, const LabConfig& c) -> std::string {
    try {
      parse_case(name, c);
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const std::string bad = refusal("nonsense", def);
  EXPECT_NE(bad.find("unknown retention case 'nonsense'"), std::string::npos) << bad;
  EXPECT_NE(bad.find(names), std::string::npos) << bad;
  const std::string other_k = refusal("tbptt:8", small());
  EXPECT_NE(other_k.find("the lab runs tbptt:4"), std::string::npos) << other_k;
  const std::string other_exact = refusal("exact-replay:4", def);
  EXPECT_NE(other_exact.find("the lab runs exact-replay (exact:8/200)"), std::string::npos) << other_exact;
  // A label copied from a table of other settings (--steps 24's here) is named, with the name that takes any.
  LabConfig short_run = def;
  short_run.steps = 24;
  const std::string copied = refusal("exact-replay (exact:8/200)", short_run);
  EXPECT_NE(copied.find("the lab runs exact-replay (exact:8/24) ('exact-replay' names it whatever they are"), std::string::npos)
      << copied;
  EXPECT_NE(refusal("0", def).find("unknown"), std::string::npos);
  EXPECT_NE(refusal("8", def).find("unknown"), std::string::npos) << "fixes have no number";
}

// ---- the plot

// A LibTorch stand-in for the plot's second panel: segtape's own trace.
Trace fake_torch(Case c, const LabConfig& cfg) {
  Trace t = run_segtape(c, cfg);
  t.engine = "libtorch";
  return t;
}

const LabReport& small_lab(bool with_torch) {
  static const auto run = [](bool torch) {
    LabConfig c = small();
    c.steps = 96;
    c.budget = 48 << 10;  // every pitfall passes it within the run (1, 6: at the same step), no fix does
    std::vector<Case> all;
    for (const CaseInfo& i : cases()) all.push_back(i.id);
    return run_lab(c, all, torch ? &fake_torch : nullptr);
  };
  static const LabReport with = run(true), without = run(false);
  return with_torch ? with : without;
}

struct Drawn {
  std::string label, attrs;
  std::vector<std::pair<double, double>> points;
};

// The series' polylines of an SVG from render_svg, in order.
std::vector<Drawn> polylines(const std::string& svg) {
  std::vector<Drawn> out;
  for (size_t p = svg.find("<polyline class=\"series\""); p != std::string::npos; p = svg.find("<polyline class=\"series\"", p + 1)) {
    const std::string el = svg.substr(p, svg.find("/>", p) - p);
    Drawn d;
    const size_t l = el.find("data-label=\"") + 12;
    d.label = el.substr(l, el.find('"', l) - l);
    const size_t q = el.find("points=\"") + 8;
    d.attrs = el.substr(0, q);
    std::stringstream ss(el.substr(q, el.find('"', q) - q));
    double x, y;
    char comma;
    while (ss >> x >> comma >> y) d.points.push_back({x, y});
    out.push_back(d);
  }
  return out;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(Plot, PitfallsDashedFixesSolidBudgetLineAndCrossings) {
  const LabReport& r = small_lab(true);
  const LabConfig& c = r.config;
  const std::string svg = to_svg(r);
  const std::vector<Drawn> lines = polylines(svg);
  ASSERT_EQ(lines.size(), 2 * cases().size()) << "one line per case and engine";
  EXPECT_EQ(count(svg, "<clipPath"), 2u) << "two panels";
  size_t crossings = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const CaseInfo& ci = cases()[i % cases().size()];
    SCOPED_TRACE(lines[i].label);
    EXPECT_EQ(lines[i].attrs.find("stroke-dasharray") != std::string::npos, ci.pitfall) << lines[i].attrs;
    EXPECT_EQ(lines[i].points.size(), size_t(c.steps)) << "a point per step";
    const Summary m = summarise(r.results[i % cases().size()].segtape, c.budget);
    if (ci.pitfall) {
      ASSERT_GE(m.budget_step, 0);
      ASSERT_FALSE(m.budget_extrapolated);
      EXPECT_NE(lines[i].label.find("over at " + std::to_string(int64_t(m.budget_step))), std::string::npos);
      ++crossings;
    }
  }
  // The budget, once per panel, and an open marker at every pitfall's crossing.
  EXPECT_EQ(count(svg, "<line class=\"hline\""), 2u);
  EXPECT_EQ(count(svg, "budget " + format_bytes(c.budget)), 2u);
  EXPECT_EQ(count(svg, "<g class=\"mark\">"), crossings);
  // Pitfall 6 is pitfall 1 to the byte: its legend says so, its markers sit elsewhere.
  ASSERT_EQ(r.results[0].segtape.bytes, r.results[5].segtape.bytes);
  EXPECT_NE(lines[5].label.find("(= 1"), std::string::npos) << lines[5].label;
  EXPECT_EQ(lines[0].label.find("(= "), std::string::npos) << lines[0].label;
  EXPECT_EQ(lines[6].label.find("(= "), std::string::npos) << lines[6].label;
  EXPECT_NE(svg.find("\"= 1\""), std::string::npos) << "the note explains the \"= n\" of the legend";
}

// gru-state's line is its per-step trace: a point per step, rising within
// each segment, falling only where a segment begins.
TEST(Plot, GruStateIsDrawnStepByStep) {
  const LabReport& r = small_lab(false);
  const LabConfig& c = r.config;
  const std::vector<Drawn> lines = polylines(to_svg(r));
  const auto it = std::find_if(lines.begin(), lines.end(), [](const Drawn& d) { return d.label.rfind("gru-state", 0) == 0; });
  ASSERT_NE(it, lines.end());
  ASSERT_EQ(it->points.size(), size_t(c.steps));
  size_t falls = 0;
  for (size_t i = 1; i < it->points.size(); ++i) {
    EXPECT_GT(it->points[i].first, it->points[i - 1].first);
    if (it->points[i].second > it->points[i - 1].second) {  // SVG y grows downwards: memory fell
      ++falls;
      EXPECT_EQ(i % size_t(c.trainer_k), 0u) << "memory fell at step " << i << ", inside a segment";
    }
  }
  EXPECT_EQ(falls, size_t((c.steps - 1) / c.trainer_k));
}

TEST(Plot, WithoutLibTorchOnePanelAndANote) {
  const LabReport& r = small_lab(false);
  const std::string svg = to_svg(r);
  EXPECT_EQ(count(svg, "<clipPath"), 1u) << "one panel";
  EXPECT_EQ(polylines(svg).size(), cases().size());
  EXPECT_EQ(svg.find("LibTorch: live"), std::string::npos) << "no LibTorch panel";
  EXPECT_NE(svg.find(r.libtorch_note + ": only segtape"), std::string::npos);
}

// The renderer's own features, as the training plot would use them.
TEST(Plot, RendererDrawsDashesMarkersReferenceLinesFixedRangeAndNotes) {
  agent::Series a{"a", {0, 1, 2, 3}, {1, 2, 3, 4}}, b{"b", {0, 1, 2, 3}, {4, 3, 2, 1}};
  a.dash = "6 3";
  a.marker = agent::Marker::Square, a.marker_every = 2, a.marker_offset = 1;
  a.marks.push_back({2, 3, "here"});
  agent::Panel p{"t", "x", "y", {a, b}, false, false};
  p.hlines.push_back({2.5, "limit"});
  p.y_min = 0, p.y_max = 10;
  p.note = "first line\nsecond line";
  const std::string svg = agent::render_svg({p});
  EXPECT_EQ(count(svg, "stroke-dasharray=\"6 3\""), 2u) << "the line and its legend entry\n" << svg;
  EXPECT_EQ(count(svg, "<rect x="), 2u + 2u + 1u + 1u) << "clip and frame, markers at points 1 and 3, the legend's, the mark\n" << svg;
  EXPECT_NE(svg.find(">here</text>"), std::string::npos);
  EXPECT_NE(svg.find(">limit</text>"), std::string::npos);
  EXPECT_NE(svg.find(">first line</text>"), std::string::npos);
  EXPECT_NE(svg.find(">second line</text>"), std::string::npos);
  EXPECT_NE(svg.find(">10</text>"), std::string::npos) << "the fixed range's top tick";
  // An old-style caller: no dashes, no markers, no reference lines.
  const std::string plain = agent::render_svg({{"t", "x", "y", {agent::Series{"c", {0, 1}, {1, 2}}}, false, true}});
  EXPECT_EQ(plain.find("stroke-dasharray"), std::string::npos);
  EXPECT_EQ(plain.find("class=\"hline\""), std::string::npos);
  EXPECT_EQ(plain.find("class=\"mark"), std::string::npos);
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
  EXPECT_GT(after.grad_bytes, 0u);
  EXPECT_EQ(after.node_bytes, e.node_bytes);
  std::printf("%s", after.report().c_str());
}

TEST(Explain, AHundredThousandNodeTape) {
  constexpr int64_t N = 100000, per_step = 100;
  TapeOptions o;
  o.segment_budget = size_t(128) << 20;  // the tape nodes count in the budget
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

// Parameters by the caller's names; the carried state red, its edge bold.
TEST(Explain, DotNamesParametersAndHighlightsTheCarriedState) {
  Tape tape;
  Graph g(tape);
  DotOptions o;
  o.name_of = [&](const void* p) { return p == g.w_hh.ptr ? std::string("gru.weight_hh") : std::string(); };
  Tensor h;
  {
    Segment first = tape.segment();
    h = first.carry(gru_cell(tape.zeros({B, I}), tape.zeros({B, H}), g.w_ih, g.w_hh, g.b_ih, g.b_hh));
  }
  Segment second = tape.segment();
  gru_cell(tape.zeros({B, I}), h, g.w_ih, g.w_hh, g.b_ih, g.b_hh);
  const std::string dot = to_dot(tape, o), plain = to_dot(tape);
  EXPECT_NE(dot.find("label=\"gru.weight_hh\\nf32[21,7]\""), std::string::npos) << dot;
  EXPECT_EQ(count(dot, "label=\"parameter\\n"), 3u) << "the unnamed ones stay 'parameter'\n" << dot;
  EXPECT_EQ(plain.find("gru.weight_hh"), std::string::npos);
  // The carried h: one red leaf, one bold red edge into the GRU node, labelled.
  EXPECT_EQ(count(dot, "label=\"carried state\\nf32[3,7]\""), 1u) << dot;
  EXPECT_EQ(count(dot, "-> n0 [color=\"#c0392b\", penwidth=2.5, fontcolor=\"#c0392b\", label=\"carried state\"]"), 1u) << dot;
  EXPECT_EQ(count(dot, "penwidth=2.5"), 1u) << "only the carried edge is highlighted\n" << dot;
}

// The lab's DOT export (segtape retention --dot): the model's names; the
// carried state in a fix's second segment, none in pitfall 1's one segment.
TEST(Explain, LabDotNamesTheModelAndShowsTheCarry) {
  const std::string pitfall = tape_dot(Case::HiddenNotDetached, small()), fix = tape_dot(Case::Tbptt, small());
  for (const std::string* d : {&pitfall, &fix})
    for (const char* name : {"encoder.weight", "gru.weight_ih", "gru.weight_hh", "gru.bias_ih", "gru.bias_hh", "head.weight", "head.bias"})
      EXPECT_NE(d->find(std::string("label=\"") + name + "\\n"), std::string::npos) << name << "\n" << *d;
  EXPECT_EQ(pitfall.find("carried state"), std::string::npos) << pitfall;
  EXPECT_NE(pitfall.find("cluster_step_2"), std::string::npos) << "three steps\n" << pitfall;
  EXPECT_EQ(count(fix, "label=\"carried state\"]"), 1u) << fix;
  EXPECT_EQ(fix.find("cluster_step_1 "), std::string::npos) << "only the second segment (steps 2, 3)\n" << fix;
  EXPECT_NE(fix.find("cluster_step_2"), std::string::npos) << fix;
}

}  // namespace
