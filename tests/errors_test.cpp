// Misuse gets a clear error naming what went wrong and what to do.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "segtape/update.h"
#include "util.h"

using namespace segtape;

namespace {

using test::message_of;

TEST(Errors, ExpiredTensorNamesSegmentStepAndRemedy) {
  Tape tape;
  Tensor w = tape.parameter({2, 2});
  Tensor stale;
  {
    Segment seg = tape.segment();
    tape.next_step();
    tape.next_step();
    stale = tanh(w);  // made in segment 1 at step 2
  }
  Segment seg = tape.segment();
  const std::string m = message_of<ExpiredTensorError>([&] { (void)matmul(stale, w); });
  EXPECT_NE(m.find("matmul"), std::string::npos) << m;
  EXPECT_NE(m.find("segment 1 at step 2"), std::string::npos) << m;
  EXPECT_NE(m.find("seg.carry"), std::string::npos) << m;
  EXPECT_THROW((void)stale.data<float>(), ExpiredTensorError);
  EXPECT_FALSE(stale.is_live());
}

TEST(Errors, CarriedTensorExpiresAfterTheNextSegment) {
  Tape tape;
  Tensor w = tape.parameter({2});
  Tensor c;
  {
    Segment seg = tape.segment();
    c = seg.carry(tanh(w));
  }
  { Segment seg = tape.segment(); EXPECT_NO_THROW((void)add(c, w)); }
  Segment seg = tape.segment();
  const std::string m = message_of<ExpiredTensorError>([&] { (void)add(c, w); });
  EXPECT_NE(m.find("carried out of segment 1"), std::string::npos) << m;
  EXPECT_NE(m.find("carry it again"), std::string::npos) << m;
}

TEST(Errors, BudgetOverflowReportsWhatFilledTheArena) {
  Tape tape(Device::cpu(), {.segment_budget = 64 << 10});
  const int64_t B = 4, H = 32;
  Tensor w_ih = tape.parameter({3 * H, H}), w_hh = tape.parameter({3 * H, H});
  Tensor b = tape.parameter({3 * H});
  Segment seg = tape.segment();
  Tensor h = tape.zeros({B, H});
  const std::string m = message_of<BudgetError>([&] {
    for (int t = 0; t < 1000; ++t, tape.next_step()) h = gru_cell(h, h, w_ih, w_hh, b, b);  // never cut
  });
  EXPECT_NE(m.find("segment budget exceeded"), std::string::npos) << m;
  // The first line leads with the dominant kind, not with the request that crossed the line.
  const std::string first = m.substr(0, m.find('\n'));
  EXPECT_NE(first.find("the largest share is GruCell"), std::string::npos) << m;
  EXPECT_NE(m.find("largest first: GruCell"), std::string::npos) << m;
  EXPECT_NE(m.find("Tape nodes: "), std::string::npos) << m;  // node memory has its own line
  EXPECT_NE(m.find("By step"), std::string::npos) << m;
  EXPECT_NE(m.find("retaining history"), std::string::npos) << m;  // many steps, a graph: real retention
  EXPECT_NE(m.find("carry"), std::string::npos) << m;
}

// A budget the machine cannot hold is an OutOfMemoryError naming the pool
// (as a field, so callers need not parse the message), not a BudgetError.
TEST(Errors, ABudgetBeyondMemoryIsAnOutOfMemoryErrorNamingThePool) {
  try {
    Tape tape(Device::cpu(), {.segment_budget = SIZE_MAX});
    ADD_FAILURE() << "a Tape with a budget of 2^64 - 1 bytes was made";
  } catch (const OutOfMemoryError& e) {
    EXPECT_STREQ(e.pool, kSegmentArenaPool);
    EXPECT_NE(std::string(e.what()).find("could not reserve an arena chunk of 18446744073709551615 bytes (segment arena"),
              std::string::npos)
        << e.what();
  }
}

TEST(Errors, ShapeMismatchNamesOpAndBothShapes) {
  Tape tape;
  Tensor a = tape.parameter({2, 3}), b = tape.parameter({4, 5});
  Segment seg = tape.segment();
  std::string m = message_of<ShapeError>([&] { (void)matmul(a, b); });
  EXPECT_NE(m.find("matmul"), std::string::npos);
  EXPECT_NE(m.find("[2,3]"), std::string::npos);
  EXPECT_NE(m.find("[4,5]"), std::string::npos) << m;
  m = message_of<ShapeError>([&] { (void)add(a, b); });
  EXPECT_NE(m.find("add: shapes do not broadcast"), std::string::npos) << m;
  EXPECT_NE(m.find("[4,5]"), std::string::npos) << m;
  EXPECT_THROW((void)mse_loss(a, b), ShapeError);
  EXPECT_THROW((void)concat({a, b}, 0), ShapeError);
  EXPECT_THROW((void)slice(a, 1, 2, 2), ShapeError);
  EXPECT_THROW((void)reshape(a, {7}), ShapeError);
  EXPECT_THROW((void)sum(a, 2), ShapeError);
  EXPECT_THROW((void)gru_cell(a, a, b, b, b, b), ShapeError);
  Tensor d = tape.parameter({2, 3}, DType::F64);
  m = message_of<ShapeError>([&] { (void)add(a, d); });
  EXPECT_NE(m.find("dtypes differ"), std::string::npos) << m;
}

TEST(Errors, IndicesOutOfRange) {
  Tape tape;
  Tensor w = tape.parameter({4, 2});
  Segment seg = tape.segment();
  const int64_t bad[] = {1, 4};
  std::string m = message_of<IndexError>([&] { (void)embedding(w, tape.from(std::span<const int64_t>(bad), {2})); });
  EXPECT_NE(m.find("embedding: index 4 at position 1 is out of range for 4 rows"), std::string::npos) << m;
  const int64_t targets[] = {1, 4, 0, 0};
  m = message_of<IndexError>([&] { (void)cross_entropy(w, tape.from(std::span<const int64_t>(targets), {4})); });
  EXPECT_NE(m.find("cross_entropy: target 4 at row 1 is out of range for 2 classes"), std::string::npos) << m;
  const int64_t neg[] = {-1, 0, 0, 0};
  EXPECT_THROW((void)cross_entropy(w, tape.from(std::span<const int64_t>(neg), {4})), IndexError);
}

TEST(Errors, DoubleBackwardWithoutRetain) {
  Tape tape;
  Tensor w = tape.parameter({2});
  Segment seg = tape.segment();
  Tensor h = tanh(w);
  seg.backward(sum(h));
  const std::string m = message_of<TapeError>([&] { seg.backward(sum(mul(h, h))); });
  EXPECT_NE(m.find("second time"), std::string::npos) << m;
  EXPECT_NE(m.find("retain_graph"), std::string::npos) << m;
}

// The refusal comes before any gradient is added: v's product is walked
// before the released tanh it also reaches.
TEST(Errors, ABackwardReachingReleasedNodesChangesNoGradient) {
  Tape tape;
  Tensor w = tape.parameter({2}), v = tape.parameter({2});
  const float vv[] = {0.5f, -1.0f};
  v.from_host(std::span<const float>(vv));
  Segment seg = tape.segment();
  Tensor h = tanh(w);
  seg.backward(sum(h));
  const std::vector<float> wg = w.grad_tensor().to_host<float>();
  Tensor loss = sum(mul(h, v));
  const std::string m = message_of<TapeError>([&] { seg.backward(loss); });
  EXPECT_NE(m.find("no gradient was changed"), std::string::npos) << m;
  EXPECT_EQ(v.grad_tensor().to_host<float>(), std::vector<float>(2, 0.0f));
  EXPECT_EQ(w.grad_tensor().to_host<float>(), wg);
  // A later loss that reaches only unreleased nodes still works.
  seg.backward(sum(mul(v, v)));
  EXPECT_EQ(v.grad_tensor().to_host<float>(), (std::vector<float>{1.0f, -2.0f}));
}

// Released are the nodes a backward processed, not every node recorded
// before its loss: an earlier loss of its own (independent of the first)
// still runs, as PyTorch's does; one that shares a processed node does not.
TEST(Errors, AnEarlierIndependentLossStillRunsAfterABackward) {
  Tape tape;
  Tensor w = tape.parameter({2}), v = tape.parameter({2});
  const float wv[] = {0.25f, -0.5f};
  w.from_host(std::span<const float>(wv));
  v.from_host(std::span<const float>(wv));
  Segment seg = tape.segment();
  Tensor lw = sum(mul(w, w));  // recorded first
  Tensor hv = tanh(v);
  seg.backward(sum(hv));       // walks tanh(v) only
  seg.backward(lw);            // refused before: every node below the first loss counted as released
  EXPECT_EQ(w.grad_tensor().to_host<float>(), (std::vector<float>{0.5f, -1.0f}));
  const std::string m = message_of<TapeError>([&] { seg.backward(sum(mul(hv, hv))); });
  EXPECT_NE(m.find("second time"), std::string::npos) << m;
}

// PyTorch's "modified by an inplace operation": an optimizer step between two
// backwards through the same graph changes a weight a recorded product
// reads. The second backward is refused before any gradient changes, naming
// the op, the tensor and the writer; BackwardOptions::allow_overwritten lets
// it through with the current weight. A step after a backward, then a new
// forward in the same segment, is not such a write.
TEST(Errors, AWeightStepBetweenTwoBackwardsThroughOneGraphIsRefused) {
  Tape tape;
  Tensor w = tape.parameter({2, 2}), x = tape.parameter({1, 2});
  const float wv[] = {0.5f, -1.0f, 2.0f, 0.25f}, xv[] = {1.0f, 3.0f};
  w.from_host(std::span<const float>(wv));
  x.from_host(std::span<const float>(xv));
  Segment seg = tape.segment();
  const Tensor loss = sum(matmul(x, w));
  seg.backward(loss, {.retain_graph = true});
  const std::vector<float> gx = x.grad_tensor().to_host<float>(), gw = w.grad_tensor().to_host<float>();
  EXPECT_EQ(gx, (std::vector<float>{-0.5f, 2.25f}));  // rows of w summed
  sgd_step(w, Tensor{}, {.lr = 0.5}, true);
  const std::string m = message_of<TapeError>([&] { seg.backward(loss, {.retain_graph = true}); });
  EXPECT_NE(m.find("op 'MatMul'"), std::string::npos) << m;
  EXPECT_NE(m.find("its input 1, f32[2,2] (persistent)"), std::string::npos) << m;
  EXPECT_NE(m.find("sgd_step wrote into it after that"), std::string::npos) << m;
  EXPECT_NE(m.find("no gradient was changed"), std::string::npos) << m;
  EXPECT_EQ(x.grad_tensor().to_host<float>(), gx);
  EXPECT_EQ(w.grad_tensor().to_host<float>(), gw);
  // Allowed, it reads the stepped weight: w - 0.5 * dw, dw = x^T 1 = {1, 1; 3, 3},
  // whose rows sum to {-1.5, -0.75}.
  seg.backward(loss, {.retain_graph = true, .allow_overwritten = true});
  EXPECT_EQ(x.grad_tensor().to_host<float>(), (std::vector<float>{-0.5f + -1.5f, 2.25f + -0.75f}));
  // A new forward after the step reads the new weight: nothing to refuse.
  tape.zero_grad();
  seg.backward(sum(matmul(x, w)));
  EXPECT_EQ(x.grad_tensor().to_host<float>(), (std::vector<float>{-1.5f, -0.75f}));
}

// What counts as a write: data<T>() hands the bytes out to be written;
// data<const T>(), to_host() and item() read. A write into bytes no recorded
// op's backward reads (an addend; tanh's input, since tanh reads its output)
// is not refused.
TEST(Errors, OnlyAWriteIntoBytesABackwardReadsIsRefused) {
  Tape tape;
  Tensor w = tape.parameter({3}), b = tape.parameter({3});
  const float wv[] = {0.5f, -1.0f, 2.0f};
  w.from_host(std::span<const float>(wv));
  Segment seg = tape.segment();
  const Tensor y = tanh(w);          // reads its output y
  const Tensor loss = sum(add(y, b));  // add reads neither operand
  EXPECT_EQ(w.data<const float>()[1], -1.0f);
  EXPECT_FLOAT_EQ(y.to_host<float>()[0], std::tanh(0.5f));
  EXPECT_NEAR(loss.item(), std::tanh(0.5) + std::tanh(-1.0) + std::tanh(2.0), 1e-6);
  fill_value(b, 7.0);                 // b: read by no backward
  w.from_host(std::span<const float>(wv));  // w: tanh reads its output, not w
  seg.backward(loss, {.retain_graph = true});
  EXPECT_FLOAT_EQ(w.grad_tensor().to_host<float>()[0], 1.0f - std::tanh(0.5f) * std::tanh(0.5f));
  (void)y.data<float>();  // handed out to be written: counts as a write
  const std::string m = message_of<TapeError>([&] { seg.backward(loss); });
  EXPECT_NE(m.find("op 'Tanh'"), std::string::npos) << m;
  EXPECT_NE(m.find("reads its output"), std::string::npos) << m;
  EXPECT_NE(m.find("data<T>() (non-const T: a write) wrote into it after that"), std::string::npos) << m;
}

TEST(Errors, MisuseOfSegments) {
  Tape tape;
  Tensor w = tape.parameter({2});
  EXPECT_THROW((void)tanh(w), TapeError);  // no open segment
  Segment seg = tape.segment();
  std::string m = message_of<TapeError>([&] { (void)tape.segment(); });
  EXPECT_NE(m.find("still open"), std::string::npos) << m;
  m = message_of<ShapeError>([&] { seg.backward(tanh(w)); });
  EXPECT_NE(m.find("single-element"), std::string::npos) << m;
  {
    NoGradGuard ng(tape);
    Tensor y = sum(w);
    EXPECT_THROW(seg.backward(y), TapeError);
  }
  Tensor undefined;
  EXPECT_THROW((void)tanh(undefined), TapeError);
  Tape other;
  Tensor v = other.parameter({2});
  EXPECT_THROW((void)add(w, v), TapeError);
}

TEST(Errors, AnomalyModeNamesTheFirstNonFiniteOp) {
  Tape tape(Device::cpu(), {.anomaly = true});
  Tensor w = tape.parameter({2});
  w.data<float>()[0] = -1.0f;
  Segment seg = tape.segment();
  tape.next_step();
  EXPECT_NO_THROW((void)exp(w));
  const std::string m = message_of<AnomalyError>([&] { (void)log(w); });
  EXPECT_NE(m.find("op 'Log' at step 1"), std::string::npos) << m;
  EXPECT_NE(m.find("NaN"), std::string::npos) << m;
}

// gru_sequence's per-stream resets: keep must be [T, B] of x's dtype on x's
// tape, and is data (no gradient); each refusal names the op and the shapes,
// before anything is recorded.
TEST(Errors, AGruSequenceKeepOfTheWrongShapeDtypeOrWithAGradientIsRefused) {
  const int64_t T = 3, B = 2, I = 4, H = 5;
  Tape tape, other;
  Tensor x = tape.parameter({T, B, I}), h0 = tape.parameter({B, H}), w_ih = tape.parameter({3 * H, I}),
         w_hh = tape.parameter({3 * H, H}), b_ih = tape.parameter({3 * H}), b_hh = tape.parameter({3 * H});
  Tensor wrong = tape.persistent({B, T}), grad = tape.parameter({T, B}), f64 = tape.persistent({T, B}, DType::F64),
         elsewhere = other.persistent({T, B});
  Segment seg = tape.segment();
  const size_t nodes = tape.nodes().size();
  std::string m = message_of<ShapeError>([&] { (void)gru_sequence(x, h0, w_ih, w_hh, b_ih, b_hh, wrong); });
  EXPECT_NE(m.find("gru_sequence: keep must be [T, B]"), std::string::npos) << m;
  EXPECT_NE(m.find("[2,3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[3,2,4]"), std::string::npos) << m;
  m = message_of<Error>([&] { (void)gru_sequence(x, h0, w_ih, w_hh, b_ih, b_hh, grad); });
  EXPECT_NE(m.find("keep f32[3,2]"), std::string::npos) << m;
  EXPECT_NE(m.find("requires a gradient"), std::string::npos) << m;
  m = message_of<ShapeError>([&] { (void)gru_sequence(x, h0, w_ih, w_hh, b_ih, b_hh, f64); });
  EXPECT_NE(m.find("gru_sequence: dtypes differ"), std::string::npos) << m;
  m = message_of<TapeError>([&] { (void)gru_sequence(x, h0, w_ih, w_hh, b_ih, b_hh, elsewhere); });
  EXPECT_NE(m.find("different tapes"), std::string::npos) << m;
  EXPECT_EQ(tape.nodes().size(), nodes);
  // detached, the same values are accepted; so is keep itself where no gradient is recorded
  EXPECT_NO_THROW((void)gru_sequence(x, h0, w_ih, w_hh, b_ih, b_hh, detach(grad)));
  NoGradGuard ng(tape);
  EXPECT_NO_THROW((void)gru_sequence(x, h0, w_ih, w_hh, b_ih, b_hh, grad));
}

// Found by attacking the C++ API (2026-12-03): a batch of no rows through
// the GRU's backward divided by zero (SIGFPE), and an unbounded node
// reserve ended in vector::reserve's length_error, naming nothing.
TEST(Errors, AGruBatchOfNoRowsAndAHugeNodeReserve) {
  Tape t;
  Tensor w_ih = t.parameter({12, 3}), w_hh = t.parameter({12, 4}), b_ih = t.parameter({12}), b_hh = t.parameter({12});
  {
    Segment s = t.segment();
    Tensor h = gru_cell(t.zeros({0, 3}), t.zeros({0, 4}), w_ih, w_hh, b_ih, b_hh);
    EXPECT_EQ(h.dim(0), 0);
    s.backward(sum(h));
  }
  for (float g : w_hh.grad_tensor().to_host<float>()) EXPECT_EQ(g, 0.0f);
  const std::string m = message_of<Error>([] { Tape huge(Device::cpu(), {.node_capacity = SIZE_MAX}); });
  EXPECT_NE(m.find("TapeOptions::node_capacity 18446744073709551615: reserve at most 2^24 nodes"), std::string::npos) << m;
}

}  // namespace
