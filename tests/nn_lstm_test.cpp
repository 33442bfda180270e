// The nn layer's LSTM and dropout: names, shapes and initialisation of
// LSTMCell and LSTM, LSTM against its cells stepped by hand (masks
// included), a float64 gradcheck through the module API, Dropout's
// statistics, train / eval and errors, dropout between GRU and LSTM layers,
// the masks' Rng in a checkpoint, and no heap allocation per step once warm.
#include <cblas.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "alloc_hook.h"
#include "segtape/nn.h"
#include "segtape/replay.h"
#include "util.h"

using namespace segtape;
using namespace segtape::test;
namespace fs = std::filesystem;

namespace {

using Names = std::vector<std::pair<std::string, std::vector<int64_t>>>;
Names names_and_shapes(const nn::Module& m) {
  Names out;
  for (const auto& [n, p] : m.named_parameters())
    out.emplace_back(n, std::vector<int64_t>(p.shape.dims.begin(), p.shape.dims.begin() + p.rank()));
  return out;
}

template <class E, class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

std::vector<float> sines(size_t n, double phase = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(std::sin(double(i) * 0.7 + phase));
  return v;
}

// ------------------------------------------------------------ modules

TEST(Lstm, NamesShapesAndCountsMatchPyTorch) {
  Tape tape;
  nn::Rng rng(0);
  nn::LSTMCell cell(tape, rng, 6, 8);
  EXPECT_EQ(names_and_shapes(cell), (Names{{"weight_ih", {32, 6}}, {"weight_hh", {32, 8}}, {"bias_ih", {32}}, {"bias_hh", {32}}}));
  EXPECT_EQ(cell.parameter_count(), 32 * 6 + 32 * 8 + 64);
  nn::LSTMCell nob(tape, rng, 6, 8, false);
  EXPECT_EQ(names_and_shapes(nob), (Names{{"weight_ih", {32, 6}}, {"weight_hh", {32, 8}}}));
  EXPECT_FALSE(nob.bias_ih.requires_grad);  // zeros, not parameters
  nn::LSTM lstm(tape, rng, 6, 8, 2, true, DType::F32, 0.5, 7);
  EXPECT_EQ(names_and_shapes(lstm), (Names{{"weight_ih_l0", {32, 6}}, {"weight_hh_l0", {32, 8}}, {"bias_ih_l0", {32}},
                                           {"bias_hh_l0", {32}}, {"weight_ih_l1", {32, 8}}, {"weight_hh_l1", {32, 8}},
                                           {"bias_ih_l1", {32}}, {"bias_hh_l1", {32}}}));
  EXPECT_EQ(lstm.dropout, 0.5);
  // Dropout has no parameters (nor does the dropout of an LSTM or GRU: their state_dicts are PyTorch's).
  nn::Dropout drop(tape, 0.1);
  EXPECT_TRUE(drop.named_parameters().empty());
  nn::GRU gru(tape, rng, 6, 8, 2, true, DType::F32, 0.2);
  EXPECT_EQ(gru.named_parameters().size(), 8u);
}

TEST(Lstm, InitRangesMatchPyTorchDefaults) {
  Tape tape;
  nn::Rng rng(9);
  nn::LSTM lstm(tape, rng, 10, 16, 2);
  nn::LSTMCell cell(tape, rng, 10, 64, true, DType::F64);
  auto check = [](const std::string& n, const Tensor& p, double bound) {
    const auto v = values(p);
    double lo = 1e9, hi = -1e9, sq = 0;
    for (double x : v) lo = std::min(lo, x), hi = std::max(hi, x), sq += x * x;
    EXPECT_GE(lo, -bound) << n;
    EXPECT_LE(hi, bound) << n;
    EXPECT_LT(lo, -0.9 * bound) << n;
    EXPECT_GT(hi, 0.9 * bound) << n;
    EXPECT_NEAR(sq / double(v.size()), bound * bound / 3, 0.1 * bound * bound) << n;
  };
  for (const auto& [n, p] : lstm.named_parameters()) check(n, p, 0.25);
  for (const auto& [n, p] : cell.named_parameters()) check(n, p, 0.125);
  // Same seed, same model; the dropout seed draws nothing at construction.
  nn::Rng a(3), b(3);
  nn::LSTM x(tape, a, 4, 5, 2), y(tape, b, 4, 5, 2, true, DType::F32, 0.3, 99);
  for (size_t i = 0; i < x.parameters().size(); ++i) EXPECT_EQ(values(x.parameters()[i]), values(y.parameters()[i]));
  EXPECT_EQ(a.state(), b.state());
}

TEST(Lstm, ForwardShapesAndErrors) {
  Tape tape;
  nn::Rng rng(1);
  nn::LSTMCell cell(tape, rng, 3, 4);
  nn::LSTM lstm(tape, rng, 3, 4, 2);
  Segment seg = tape.segment();
  const auto xv = sines(12);
  Tensor x = tape.from(xv, {2, 2, 3}), x2 = reshape(x, {4, 3});
  // An undefined state is zeros; the (h, c) form is the state's halves.
  Tensor s = cell(x2);
  EXPECT_EQ(s.shape, Shape({2, 4, 4}));
  EXPECT_EQ(values(s), values(cell(x2, tape.zeros({2, 4, 4}))));
  const LstmPair p = cell(x2, tape.zeros({4, 4}), tape.zeros({4, 4}));
  EXPECT_EQ(values(p.h), values(lstm_h(s)));
  EXPECT_EQ(values(p.c), values(lstm_c(s)));
  EXPECT_NE(message_of<ShapeError>([&] { (void)cell(tape.zeros({4, 5})); }).find("nn::LSTMCell(3, 4): input f32[4,5]"),
            std::string::npos);
  auto [out, hn, cn] = lstm(x);
  EXPECT_EQ(out.shape, Shape({2, 2, 4}));
  EXPECT_EQ(hn.shape, Shape({2, 2, 4}));
  EXPECT_EQ(cn.shape, Shape({2, 2, 4}));
  EXPECT_EQ(values(slice(out, 0, 1, 1)), values(slice(hn, 0, 1, 1)));  // the last step is the last layer's final h
  const std::string alone = message_of<ShapeError>([&] { (void)lstm(x, tape.zeros({2, 2, 4})); });
  EXPECT_NE(alone.find("nn::LSTM(3, 4, 2): h0 and c0 are given together or not at all"), std::string::npos) << alone;
  const std::string wrong = message_of<ShapeError>([&] { (void)lstm(x, tape.zeros({1, 2, 4}), tape.zeros({1, 2, 4})); });
  EXPECT_NE(wrong.find("h0 f32[1,2,4]"), std::string::npos) << wrong;
  EXPECT_THROW(lstm(tape.zeros({2, 2, 5})), ShapeError);
  const std::string masks = message_of<ShapeError>([&] { (void)lstm(x, {}, {}, tape.zeros({2, 2, 2, 4})); });
  EXPECT_NE(masks.find("nn::LSTM(3, 4, 2): dropout_masks f32[2,2,2,4]"), std::string::npos) << masks;
  EXPECT_NE(masks.find("must be [1, 2, 2, 4] of f32 for input f32[2,2,3]"), std::string::npos) << masks;
  nn::LSTM one(tape, rng, 3, 4, 1);
  EXPECT_NE(message_of<ShapeError>([&] { (void)one(x, {}, {}, tape.zeros({1, 2, 2, 4})); }).find("given to one layer"),
            std::string::npos);
}

// nn::LSTM is its layers' cells stepped by hand, the dropout masks between
// layers applied to each layer's output: the same values, bit for bit.
TEST(Lstm, EqualsItsCellsSteppedByHandWithTheMasks) {
  const int64_t T = 7, B = 3, I = 3, H = 4, L = 3;
  Tape tape;
  nn::Rng rng(3);
  nn::LSTM lstm(tape, rng, I, H, L, true, DType::F32, 0.4, 11);
  Segment seg = tape.segment();
  const auto xv = sines(size_t(T * B * I)), hv = sines(size_t(L * B * H), 1), cv = sines(size_t(L * B * H), 2);
  std::vector<float> mv(size_t((L - 1) * T * B * H));
  lstm.dropout_masks(mv);
  Tensor x = tape.from(xv, {T, B, I}), h0 = tape.from(hv, {L, B, H}), c0 = tape.from(cv, {L, B, H}), m = tape.from(mv, {L - 1, T, B, H});
  auto [out, hn, cn] = lstm(x, h0, c0, m);
  Tensor seq = x;
  std::vector<Tensor> hs, cs;
  for (int64_t l = 0; l < L; ++l) {
    const nn::LSTM::Layer& p = lstm.layers()[size_t(l)];
    if (l > 0) seq = mul(seq, reshape(slice(m, 0, l - 1, 1), {T, B, H}));
    Tensor s = lstm_state(reshape(slice(h0, 0, l, 1), {B, H}), reshape(slice(c0, 0, l, 1), {B, H}));
    std::vector<Tensor> steps;
    for (int64_t t = 0; t < T; ++t) {
      s = lstm_cell(reshape(slice(seq, 0, t, 1), {B, seq.dim(2)}), s, p.weight_ih, p.weight_hh, p.bias_ih, p.bias_hh);
      steps.push_back(reshape(lstm_h(s), {1, B, H}));
    }
    seq = concat(std::span<const Tensor>(steps), 0);
    hs.push_back(reshape(lstm_h(s), {1, B, H}));
    cs.push_back(reshape(lstm_c(s), {1, B, H}));
  }
  EXPECT_EQ(values(out), values(seq));
  EXPECT_EQ(values(hn), values(concat(std::span<const Tensor>(hs), 0)));
  EXPECT_EQ(values(cn), values(concat(std::span<const Tensor>(cs), 0)));
  // About 40 % of the mask is zeros, the rest 1 / 0.6 in float.
  size_t zeros = 0;
  for (float v : mv) {
    zeros += v == 0.0f;
    ASSERT_TRUE(v == 0.0f || v == 1.0f / float(1.0 - 0.4)) << v;
  }
  EXPECT_NEAR(double(zeros) / double(mv.size()), 0.4, 0.1);
  // Masks drawn inside forward are those dropout_masks draws from the same
  // Rng state: a forward without masks equals one given them.
  nn::Rng r1(3), r2(3);
  nn::LSTM a(tape, r1, I, H, L, true, DType::F32, 0.4, 5), b(tape, r2, I, H, L, true, DType::F32, 0.4, 5);
  b.dropout_masks(mv);
  EXPECT_EQ(values(a(x).output), values(b(x, {}, {}, tape.from(mv, {L - 1, T, B, H})).output));
  EXPECT_EQ(a.dropout_rng().state(), b.dropout_rng().state());
  // In evaluation mode there is no dropout: the masks are ignored (and none is drawn).
  lstm.eval();
  const nn::Rng::State before = lstm.dropout_rng().state();
  std::vector<float> ones(mv.size());
  lstm.dropout_masks(ones);
  EXPECT_EQ(ones, std::vector<float>(mv.size(), 1.0f));
  EXPECT_EQ(values(lstm(x, h0, c0, m).output), values(lstm(x, h0, c0).output));
  EXPECT_EQ(lstm.dropout_rng().state(), before);
  EXPECT_NE(values(lstm(x, h0, c0).output), values(out));
}

// The dropout between GRU layers, PyTorch's dropout=: the layers' sequences
// stepped by hand with the masks, and nothing in evaluation mode.
TEST(Lstm, GruDropoutBetweenLayers) {
  const int64_t T = 5, B = 2, I = 3, H = 4, L = 2;
  Tape tape;
  nn::Rng r1(4), r2(4);
  nn::GRU gru(tape, r1, I, H, L, true, DType::F32, 0.3, 8), plain(tape, r2, I, H, L);
  Segment seg = tape.segment();
  const auto xv = sines(size_t(T * B * I));
  std::vector<float> mv(size_t(T * B * H));
  gru.dropout_masks(mv);
  Tensor x = tape.from(xv, {T, B, I}), m = tape.from(mv, {1, T, B, H});
  auto [out, hn] = gru(x, {}, {}, m);
  const nn::GRU::Layer &p0 = gru.layers()[0], &p1 = gru.layers()[1];
  Tensor s0 = gru_sequence(x, tape.zeros({B, H}), p0.weight_ih, p0.weight_hh, p0.bias_ih, p0.bias_hh);
  Tensor s1 = gru_sequence(mul(s0, reshape(m, {T, B, H})), tape.zeros({B, H}), p1.weight_ih, p1.weight_hh, p1.bias_ih, p1.bias_hh);
  EXPECT_EQ(values(out), values(s1));
  EXPECT_NE(values(out), values(plain(x).output));
  gru.eval();
  EXPECT_EQ(values(gru(x, {}, {}, m).output), values(plain(x).output));
  gru.train();
  EXPECT_TRUE(gru.is_training());
}

// ------------------------------------------------------------ dropout

TEST(Dropout, MasksHaveTheirStatisticsAndPyTorchsScale) {
  Tape tape;
  for (double p : {0.1, 0.5, 0.9}) {
    nn::Dropout drop(tape, p, 42);
    std::vector<float> m(200000);
    drop.mask(m);
    double zeros = 0, sum = 0;
    for (float v : m) {
      zeros += v == 0.0f;
      sum += v;
      ASSERT_TRUE(v == 0.0f || v == 1.0f / float(1.0 - p)) << v;
    }
    const double n = double(m.size()), sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(zeros / n, p, 5 * sd) << p;              // the drop rate
    EXPECT_NEAR(sum / n, 1.0, 5 * sd / (1 - p)) << p;    // inverted: the mean stays 1
    EXPECT_EQ(drop.rng().state().counter, m.size());     // one draw per element
    std::vector<double> m64(1000);
    drop.mask(m64);
    for (double v : m64) ASSERT_TRUE(v == 0.0 || v == 1.0 / (1.0 - p)) << v;
  }
  // The same seed gives the same masks, another seed others.
  nn::Dropout a(tape, 0.5, 1), b(tape, 0.5, 1), c(tape, 0.5, 2);
  std::vector<float> ma(64), mb(64), mc(64);
  a.mask(ma), b.mask(mb), c.mask(mc);
  EXPECT_EQ(ma, mb);
  EXPECT_NE(ma, mc);
}

TEST(Dropout, TrainAndEval) {
  Tape tape;
  nn::Dropout drop(tape, 0.5, 3);
  Segment seg = tape.segment();
  const auto xv = sines(40);
  Tensor x = tape.from(xv, {4, 10});
  EXPECT_TRUE(drop.is_training());
  Tensor y = drop(x);
  const auto xs = values(x), ys = values(y);
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_TRUE(ys[i] == 0 || ys[i] == double(float(xs[i]) * 2.0f)) << i;
  EXPECT_NE(ys, xs);
  // apply(): x times the given mask.
  std::vector<float> mv(40);
  drop.mask(mv);
  EXPECT_EQ(values(drop.apply(x, tape.from(mv, {4, 10}))), values(mul(x, tape.from(mv, {4, 10}))));
  // Evaluation: x itself, no draw, masks of ones.
  drop.eval();
  const nn::Rng::State s = drop.rng().state();
  EXPECT_EQ(drop(x).ptr, x.ptr);
  EXPECT_EQ(drop.apply(x, tape.from(mv, {4, 10})).ptr, x.ptr);
  drop.mask(mv);
  EXPECT_EQ(mv, std::vector<float>(40, 1.0f));
  EXPECT_EQ(drop.rng().state(), s);
  // p = 0: the identity in training mode too, and no draw.
  nn::Dropout none(tape, 0.0);
  EXPECT_EQ(none(x).ptr, x.ptr);
  EXPECT_EQ(none.rng().state().counter, 0u);
  // train() / eval() reach every module below (PyTorch's recursion).
  struct Net : nn::Module {
    nn::Dropout d;
    nn::LSTM lstm;
    Net(Tape& t, nn::Rng& r) : Module(t), d(t, 0.2), lstm(t, r, 2, 3, 2, true, DType::F32, 0.2) {
      register_module("d", d);
      register_module("lstm", lstm);
    }
  };
  nn::Rng rng(0);
  Net net(tape, rng);
  net.eval();
  EXPECT_FALSE(net.is_training() || net.d.is_training() || net.lstm.is_training());
  net.train();
  EXPECT_TRUE(net.is_training() && net.d.is_training() && net.lstm.is_training());
}

TEST(Dropout, BadArgumentsNameTheModule) {
  Tape tape;
  for (double p : {-0.1, 1.0, 1.5, std::nan("")}) {
    const std::string m = message_of<Error>([&] { nn::Dropout d(tape, p); });
    EXPECT_NE(m.find("nn::Dropout: the dropout probability must be in [0, 1), got"), std::string::npos) << m;
  }
  nn::Rng rng(0);
  EXPECT_NE(message_of<Error>([&] { nn::LSTM l(tape, rng, 2, 3, 2, true, DType::F32, 1.0); }).find("nn::LSTM: the dropout probability"),
            std::string::npos);
  EXPECT_NE(message_of<Error>([&] { nn::GRU g(tape, rng, 2, 3, 2, true, DType::F32, -1); }).find("nn::GRU: the dropout probability must be in [0, 1), got -1"),
            std::string::npos);
  nn::Dropout drop(tape, 0.25);
  Segment seg = tape.segment();
  const std::string shape = message_of<ShapeError>([&] { (void)drop.apply(tape.zeros({2, 3}), tape.zeros({3, 2})); });
  EXPECT_NE(shape.find("nn::Dropout(p=0.25): the mask f32[3,2]"), std::string::npos) << shape;
  EXPECT_NE(shape.find("must have the shape of x f32[2,3]"), std::string::npos) << shape;
  const std::string ints = message_of<ShapeError>([&] { (void)drop(tape.from(std::vector<int64_t>{1, 2}, {2})); });
  EXPECT_NE(ints.find("expects a floating-point input, got i64[2]"), std::string::npos) << ints;
}

// The masks' Rng is checkpointed as an entry (its two words bit for bit):
// after a load, the same masks follow as in a run that never stopped.
TEST(Dropout, TheMaskRngSavesAndLoadsInACheckpoint) {
  const fs::path path = fs::temp_directory_path() / ("segtape_dropout_rng_" + std::to_string(::getpid()) + ".safetensors");
  Tape tape;
  nn::Rng rng(1);
  nn::LSTM lstm(tape, rng, 2, 3, 2, true, DType::F32, 0.5, 77);
  std::vector<float> m(50), after(50), again(50);
  lstm.dropout_masks(m);
  {
    const std::vector<nn::Entry> e = {nn::entry("lstm.dropout_rng", lstm.dropout_rng())};
    nn::save_entries(path, e, {});
  }
  lstm.dropout_masks(after);
  lstm.dropout_masks(m);  // moves on
  {
    const std::vector<nn::Entry> e = {nn::entry("lstm.dropout_rng", lstm.dropout_rng())};
    nn::load_entries(path, e, "the dropout rng");
  }
  lstm.dropout_masks(again);
  EXPECT_EQ(again, after);
  fs::remove(path);
}

// Exact BPTT by replay (segtape/replay.h) through an LSTM cell with dropout
// on its input: each step takes its mask through Inputs::take, so the
// replayed segments apply the first pass's masks (the driver checks every
// recomputed boundary state bit for bit), and the gradients are those of one
// segment over the whole window with the same masks.
TEST(Dropout, MasksTakenAsStepInputsReplayExactly) {
  constexpr int64_t T = 12, K = 4, B = 2, I = 3, H = 4;
  Tape tape;
  nn::Rng rng(2);
  nn::LSTMCell cell(tape, rng, I, H, true, DType::F64);
  nn::Dropout drop(tape, 0.3, 5);
  std::vector<double> xv(size_t(T * B * I));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.3 * double(i));
  std::vector<std::vector<double>> masks(T);  // what each step drew, the first time
  const replay::StepFn step = [&](Tape& t, int64_t s, const Tensor& state, replay::Inputs& in) {
    const std::span<const double> m = in.take<double>(size_t(B * I), [&](std::span<double> v) {
      drop.mask(v);
      masks[size_t(s)].assign(v.begin(), v.end());
    });
    const Tensor x = t.from(std::span<const double>(xv).subspan(size_t(s * B * I), size_t(B * I)), {B, I});
    const Tensor next = cell(drop.apply(x, t.from(m, {B, I})), state);
    return replay::StepResult{next, mean(mul(lstm_h(next), lstm_c(next)))};
  };
  Tensor s0 = tape.persistent({2, B, H}, DType::F64);
  replay::Driver drv(tape, s0, {.horizon = T, .k = K});
  const replay::Report r = drv.run(step, s0);
  EXPECT_EQ(r.recompute_factor, 2.0);
  std::vector<std::vector<double>> replayed;
  for (const Tensor& p : cell.parameters()) replayed.push_back(values(p.grad_tensor()));
  cell.zero_grad();
  {
    Segment seg = tape.segment();
    Tensor state = s0, loss;
    for (int64_t s = 0; s < T; ++s) {
      const Tensor x = tape.from(std::span<const double>(xv).subspan(size_t(s * B * I), size_t(B * I)), {B, I});
      state = cell(drop.apply(x, tape.from(std::span<const double>(masks[size_t(s)]), {B, I})), state);
      const Tensor l = mean(mul(lstm_h(state), lstm_c(state)));
      loss = s ? add(loss, l) : l;
    }
    EXPECT_NEAR(loss.item(), r.loss, 1e-12);
    seg.backward(loss);
  }
  const auto params = cell.parameters();
  for (size_t k = 0; k < params.size(); ++k) EXPECT_LE(rel_error(replayed[k], values(params[k].grad_tensor())), 1e-12) << k;
  EXPECT_EQ(drop.rng().state().counter, uint64_t(T * B * I));  // each mask drawn once: the replays took the records
}

// ------------------------------------------------------------ gradcheck

TEST(Lstm, GradcheckThroughModuleApiFloat64) {
  constexpr int64_t T = 4, B = 2, I = 3, H = 4, L = 2;
  Tape tape;
  nn::Rng rng(11);
  nn::LSTM lstm(tape, rng, I, H, L, true, DType::F64, 0.3, 2);
  Tensor x = tape.parameter({T, B, I}, DType::F64), h0 = tape.parameter({L, B, H}, DType::F64),
         c0 = tape.parameter({L, B, H}, DType::F64);
  std::mt19937 gen(5);
  fill_uniform(x, gen);
  fill_uniform(h0, gen);
  fill_uniform(c0, gen);
  std::vector<double> wo(size_t(T * B * H)), wh(size_t(L * B * H)), wc(size_t(L * B * H)), mv(size_t((L - 1) * T * B * H));
  for (auto* w : {&wo, &wh, &wc})
    for (double& v : *w) v = std::uniform_real_distribution<double>(-1, 1)(gen);
  lstm.dropout_masks(mv);  // fixed masks: the loss is a function of the inputs
  auto loss = [&] {
    auto [out, hn, cn] = lstm(x, h0, c0, tape.from(std::span<const double>(mv), {L - 1, T, B, H}));
    return add(add(sum(mul(out, tape.from(std::span<const double>(wo), out.shape))),
                   sum(mul(hn, tape.from(std::span<const double>(wh), hn.shape)))),
               sum(mul(cn, tape.from(std::span<const double>(wc), cn.shape))));
  };
  {
    Segment seg = tape.segment();
    seg.backward(loss());
  }
  auto f = [&] {
    Segment seg = tape.segment();
    NoGradGuard ng(tape);
    return loss().item();
  };
  std::vector<nn::NamedTensor> all = lstm.named_parameters();
  all.emplace_back("x", x);
  all.emplace_back("h0", h0);
  all.emplace_back("c0", c0);
  for (const auto& [n, p] : all) EXPECT_LE(rel_error(values(p.grad_tensor()), numeric_grad(p, f)), 1e-7) << n;
}

// ------------------------------------------------------------ allocations

// Once warm, a training segment of an LSTM with dropout between its layers
// (masks drawn inside forward), of LSTMCell steps carrying the state and of
// Dropout makes no heap allocation.
TEST(Lstm, TrainingSegmentsAllocateNothingAfterWarmUp) {
  openblas_set_num_threads(1);  // OpenBLAS's threaded sgemm allocates (docs/benchmarks.md)
  Tape tape;
  nn::Rng rng(3);
  nn::LSTM lstm(tape, rng, 3, 4, 2, true, DType::F32, 0.3, 1);
  nn::LSTMCell cell(tape, rng, 3, 4);
  nn::Dropout drop(tape, 0.2, 2);
  nn::Adam adam(lstm, {.lr = 1e-3});
  Tensor state = tape.persistent({2, 2, 4});
  auto run = [&] {
    Segment seg = tape.segment();
    Tensor x = tape.zeros({10, 2, 3});
    Tensor s = state, loss = mean(lstm(x).output);
    for (int t = 0; t < 5; ++t) {
      s = cell(drop(reshape(slice(x, 0, t, 1), {2, 3})), s);
      loss = add(loss, mean(lstm_h(s)));
    }
    seg.backward(loss);
    adam.step();
    adam.zero_grad();
    state = seg.carry(s);
  };
  run();
  run();
  const uint64_t chunks = memory::system_allocations();
  alloc_hook::enable(true);
  const uint64_t before = alloc_hook::count();
  run();
  run();
  const uint64_t n = alloc_hook::count() - before;
  alloc_hook::enable(false);
  EXPECT_EQ(memory::system_allocations(), chunks);
  if (alloc_hook::counts_malloc()) {
    EXPECT_EQ(n, 0u);
  }
}

}  // namespace
