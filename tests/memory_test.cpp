// Exact memory invariants: a TBPTT loop has the same segment high-water, to
// the byte, in every segment, and makes no heap allocation after the first
// segment; under the teaching policy an uncut loop grows by exactly the
// bytes each step saves.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "alloc_hook.h"
#include "util.h"

using namespace segtape;
using namespace segtape::test;

namespace {

constexpr int64_t B = 4, I = 8, H = 16, C = 5;

struct Model {
  Tensor w_ih, w_hh, b_ih, b_hh, w_out, b_out;
  explicit Model(Tape& t) {
    std::mt19937 rng(3);
    w_ih = t.parameter({3 * H, I}), w_hh = t.parameter({3 * H, H}), b_ih = t.parameter({3 * H}),
    b_hh = t.parameter({3 * H}), w_out = t.parameter({C, H}), b_out = t.parameter({C});
    for (Tensor* p : {&w_ih, &w_hh, &b_ih, &b_hh, &w_out, &b_out}) fill_uniform(*p, rng, -0.3, 0.3);
  }
  Tensor step(Tape& t, std::span<const float> x, std::span<const int64_t> y, Tensor& h) {
    h = gru_cell(t.from(x, {B, I}), h, w_ih, w_hh, b_ih, b_hh);
    return cross_entropy(add(matmul(h, w_out, false, true), b_out), t.from(y, {B}));
  }
  void sgd(float lr) {
    for (Tensor* p : {&w_ih, &w_hh, &b_ih, &b_hh, &w_out, &b_out}) {
      float* w = p->data<float>();
      const float* g = p->grad_tensor().data<float>();
      for (int64_t i = 0; i < p->numel(); ++i) w[i] -= lr * g[i];
    }
  }
};

struct Data {
  std::vector<float> x;
  std::vector<int64_t> y;
  explicit Data(int64_t steps) : x(size_t(steps * B * I)), y(size_t(steps * B)) {
    std::mt19937 rng(5);
    for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    for (auto& v : y) v = std::uniform_int_distribution<int64_t>(0, C - 1)(rng);
  }
  std::span<const float> xt(int64_t t) const { return std::span<const float>(x).subspan(size_t(t * B * I), size_t(B * I)); }
  std::span<const int64_t> yt(int64_t t) const { return std::span<const int64_t>(y).subspan(size_t(t * B), size_t(B)); }
};

TEST(Memory, TbpttHighWaterIsIdenticalAndNothingIsAllocatedAfterTheFirstSegment) {
  constexpr int kSegments = 1000, K = 8;
  const Data data(K);
  Tape tape(Device::cpu(), {.segment_budget = 1 << 20});
  Model m(tape);
  Tensor h = tape.persistent({B, H});
  std::vector<size_t> peaks(kSegments);
  std::vector<size_t> nodes(kSegments);
  uint64_t hook_after_first = 0, engine_after_first = 0;
  for (int s = 0; s < kSegments; ++s) {
    if (s == 1) {
      hook_after_first = alloc_hook::count();
      engine_after_first = memory::system_allocations();
      alloc_hook::enable(true);
    }
    {
      Segment seg = tape.segment();
      Tensor loss;
      for (int t = 0; t < K; ++t, tape.next_step()) {
        Tensor l = m.step(tape, data.xt(t), data.yt(t), h);
        loss = t ? add(loss, l) : l;
      }
      seg.backward(loss);
      nodes[size_t(s)] = tape.stats().node_count;
      m.sgd(0.01f);
      tape.zero_grad();
      h = seg.carry(h);
    }
    peaks[size_t(s)] = tape.stats().last_segment_peak;
  }
  alloc_hook::enable(false);
  const uint64_t heap_allocs = alloc_hook::count() - hook_after_first;
  const uint64_t engine_allocs = memory::system_allocations() - engine_after_first;
  std::printf("segment high-water: %zu bytes; tape nodes per segment: %zu; heap allocations after segment 1: %llu "
              "(hook counts malloc: %d); arena chunks taken after segment 1: %llu\n",
              peaks[0], nodes[0], (unsigned long long)heap_allocs, int(alloc_hook::counts_malloc()),
              (unsigned long long)engine_allocs);
  for (int s = 1; s < kSegments; ++s) {
    ASSERT_EQ(peaks[size_t(s)], peaks[0]) << "segment " << s;
    ASSERT_EQ(nodes[size_t(s)], nodes[0]) << "segment " << s;
  }
  EXPECT_EQ(heap_allocs, 0u);
  EXPECT_EQ(engine_allocs, 0u);
  EXPECT_GT(peaks[0], 0u);
  EXPECT_LE(peaks[0], size_t(1) << 20);
}

TEST(Memory, TeachingPolicyGrowsByExactlyWhatEachStepSaves) {
  constexpr int kSteps = 200;
  const Data data(kSteps);
  Tape tape(Device::cpu(), {.segment_budget = 64 << 10, .grow = true});
  Model m(tape);
  Segment seg = tape.segment();
  Tensor h = tape.zeros({B, H});
  Tensor loss;
  std::vector<size_t> live(kSteps), node_count(kSteps);
  for (int t = 0; t < kSteps; ++t, tape.next_step()) {
    Tensor l = m.step(tape, data.xt(t), data.yt(t), h);
    loss = t ? add(loss, l) : l;
    live[size_t(t)] = tape.stats().live_bytes;
    node_count[size_t(t)] = tape.stats().node_count;
  }
  // What one step keeps alive: its input x and targets, the GRU output and its
  // saved gates (r, z, n, W_hn h + b_hn), the logits before and after the bias,
  // the loss and its saved per-row log-sum-exp, and the running sum of losses.
  const size_t f = sizeof(float);
  const size_t expected = align_up(B * I * f) + align_up(B * sizeof(int64_t)) + align_up(B * H * f) +
                          align_up(B * 4 * H * f) + 2 * align_up(B * C * f) + align_up(f) + align_up(B * f) +
                          align_up(f);
  for (int t = 2; t < kSteps; ++t) {
    ASSERT_EQ(live[size_t(t)] - live[size_t(t - 1)], expected) << "step " << t;
    ASSERT_EQ(node_count[size_t(t)] - node_count[size_t(t - 1)], 5u) << "step " << t;
  }
  std::printf("teaching policy: %zu bytes and 5 tape nodes per step; %zu bytes after %d steps\n", expected,
              live.back(), kSteps);
  EXPECT_GT(live.back(), size_t(64 << 10));  // it grew past the first chunk instead of refusing
  seg.backward(loss);                         // and the whole history is still differentiable
  EXPECT_NE(values(m.w_hh.grad_tensor()), std::vector<double>(size_t(m.w_hh.numel()), 0.0));
}

TEST(Memory, GrowLimitStopsTheTeachingPolicyWithTheReport) {
  Tape tape(Device::cpu(), {.segment_budget = 16 << 10, .grow = true, .grow_limit = 256 << 10});
  Model m(tape);
  const Data data(1);
  Segment seg = tape.segment();
  Tensor h = tape.zeros({B, H});
  try {
    for (int t = 0; t < 100000; ++t, tape.next_step()) (void)m.step(tape, data.xt(0), data.yt(0), h);
    FAIL() << "grow_limit did not stop the loop";
  } catch (const BudgetError& e) {
    EXPECT_NE(std::string(e.what()).find("GruCell"), std::string::npos) << e.what();
    EXPECT_LE(tape.stats().live_bytes, size_t(256 << 10));
  }
}

TEST(Memory, RecomputedGruCellKeepsOnlyItsOutput) {
  Tape tape;
  Model m(tape);
  Segment seg = tape.segment();
  Tensor h = tape.zeros({B, H}), x = tape.zeros({B, I});
  const size_t before = tape.stats().live_bytes;
  Tensor h1 = gru_cell(x, h, m.w_ih, m.w_hh, m.b_ih, m.b_hh, /*recompute=*/true);
  EXPECT_EQ(tape.stats().live_bytes - before, align_up(B * H * 4));
  Tensor h2 = gru_cell(x, h, m.w_ih, m.w_hh, m.b_ih, m.b_hh);
  EXPECT_EQ(tape.stats().live_bytes - before, 2 * align_up(B * H * 4) + align_up(B * 4 * H * 4));
  EXPECT_EQ(values(h1), values(h2));
}

TEST(Memory, StatsReportPersistentAndPerOpBytes) {
  Tape tape;
  Model m(tape);
  const size_t params = size_t(3 * H * I + 3 * H * H + 6 * H + C * H + C) * sizeof(float);
  EXPECT_GE(tape.stats().persistent_bytes, 2 * params);  // values and gradients
  EXPECT_LE(tape.stats().persistent_bytes, 2 * params + 12 * kAlign);
  const Data data(1);
  Segment seg = tape.segment();
  Tensor h = tape.zeros({B, H});
  (void)m.step(tape, data.xt(0), data.yt(0), h);
  const TapeStats s = tape.stats();
  EXPECT_EQ(s.bytes_by_op[size_t(OpKind::GruCell)], align_up(B * H * 4) + align_up(B * 4 * H * 4));
  EXPECT_EQ(s.bytes_by_op[size_t(OpKind::MatMul)], align_up(B * C * 4));
  EXPECT_EQ(s.node_count, 4u);
  EXPECT_EQ(s.live_bytes, s.peak_bytes);
}

}  // namespace

namespace {
// The hook itself must see allocations, or "zero allocations" above would prove nothing.
TEST(Memory, AllocationHookCountsHeapAllocations) {
  const uint64_t before = alloc_hook::count();
  alloc_hook::enable(true);
  auto* v = new std::vector<int>(1000);
  void* p = alloc_hook::counts_malloc() ? std::malloc(64) : nullptr;
  // (p escapes: GCC otherwise removes an unused malloc/free pair, at -O1 too)
  asm volatile("" : : "g"(p) : "memory");
  alloc_hook::enable(false);
  delete v;
  std::free(p);
  EXPECT_GE(alloc_hook::count() - before, alloc_hook::counts_malloc() ? 3u : 2u);
}
}  // namespace
