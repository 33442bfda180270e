// The nn layer: names, shapes and initialisation of every module, seeded
// determinism, optimizer arithmetic and its zero-allocation step, a float64
// gradcheck of GRU through the module API, and checkpoints (round trips,
// error reports, training-state resume, crash safety).
#include <cblas.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>

#include "../bench/workload.h"  // the benchmark workload (bench/compare.cpp)
#include "alloc_hook.h"
#include "segtape/nn.h"
#include "util.h"

using namespace segtape;
using namespace segtape::test;
namespace fs = std::filesystem;
namespace st = segtape::safetensors;

namespace {

using Names = std::vector<std::pair<std::string, std::vector<int64_t>>>;
Names names_and_shapes(const nn::Module& m) {
  Names out;
  for (const auto& [n, p] : m.named_parameters())
    out.emplace_back(n, std::vector<int64_t>(p.shape.dims.begin(), p.shape.dims.begin() + p.rank()));
  return out;
}

// encoder -> GRUCell -> head, on tokens: the shape of the agent's policy.
struct Policy : nn::Module {
  static constexpr int64_t B = 3, V = 7, E = 4, H = 5, C = 3;
  nn::Embedding encoder;
  nn::GRUCell gru;
  nn::Linear head;
  Policy(Tape& t, nn::Rng& r, DType d = DType::F32)
      : Module(t, d), encoder(t, r, V, E, d), gru(t, r, E, H, true, d), head(t, r, H, C, true, d) {
    register_module("encoder", encoder);
    register_module("gru", gru);
    register_module("head", head);
  }
  // Buffers for the data of one step: members, so a step allocates nothing.
  std::array<int64_t, B> tokens{}, targets{};
  // K steps from a zero state, data drawn from `data`; returns the summed loss.
  Tensor unroll(nn::Rng& data, int K) {
    Tensor h, loss;
    for (int k = 0; k < K; ++k) {
      for (int64_t b = 0; b < B; ++b) tokens[size_t(b)] = int64_t(data.next_u64() % V), targets[size_t(b)] = int64_t(data.next_u64() % C);
      h = gru(encoder(tape().from(std::span<const int64_t>(tokens), {B})), h);
      Tensor l = cross_entropy(head(h), tape().from(std::span<const int64_t>(targets), {B}));
      loss = k ? add(loss, l) : l;
    }
    return loss;
  }
};

void train_segment(Policy& p, nn::Rng& data, std::span<nn::Optimizer* const> opts) {
  Segment seg = p.tape().segment();
  seg.backward(p.unroll(data, 3));
  nn::clip_grad_norm(p, 1.0);
  for (nn::Optimizer* o : opts) o->step();
  for (nn::Optimizer* o : opts) o->zero_grad();
}

std::vector<std::vector<std::byte>> snapshot(const std::vector<nn::NamedTensor>& ts) {
  std::vector<std::vector<std::byte>> out;
  for (const auto& [n, t] : ts) {
    const auto* b = static_cast<const std::byte*>(t.ptr);
    out.emplace_back(b, b + t.nbytes());
  }
  return out;
}

class TempDir : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("segtape_nn_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override {
    st::set_before_rename_hook({});
    fs::remove_all(dir);
  }
};

// ------------------------------------------------------------ modules

TEST(Modules, NamesShapesAndCountsMatchPyTorch) {
  Tape tape;
  nn::Rng rng(0);
  nn::Linear lin(tape, rng, 6, 5);
  EXPECT_EQ(names_and_shapes(lin), (Names{{"weight", {5, 6}}, {"bias", {5}}}));
  EXPECT_EQ(lin.parameter_count(), 35);
  nn::Linear nob(tape, rng, 6, 5, false);
  EXPECT_EQ(names_and_shapes(nob), (Names{{"weight", {5, 6}}}));
  EXPECT_FALSE(nob.bias.defined());

  nn::Embedding emb(tape, rng, 10, 4);
  EXPECT_EQ(names_and_shapes(emb), (Names{{"weight", {10, 4}}}));

  nn::GRUCell cell(tape, rng, 6, 8);
  EXPECT_EQ(names_and_shapes(cell), (Names{{"weight_ih", {24, 6}}, {"weight_hh", {24, 8}}, {"bias_ih", {24}}, {"bias_hh", {24}}}));
  EXPECT_EQ(cell.parameter_count(), 24 * 6 + 24 * 8 + 48);
  nn::GRUCell cell_nob(tape, rng, 6, 8, false);
  EXPECT_EQ(names_and_shapes(cell_nob), (Names{{"weight_ih", {24, 6}}, {"weight_hh", {24, 8}}}));
  EXPECT_FALSE(cell_nob.bias_ih.requires_grad);  // zeros, not parameters

  nn::GRU gru(tape, rng, 6, 8, 2);
  EXPECT_EQ(names_and_shapes(gru), (Names{{"weight_ih_l0", {24, 6}}, {"weight_hh_l0", {24, 8}}, {"bias_ih_l0", {24}},
                                          {"bias_hh_l0", {24}}, {"weight_ih_l1", {24, 8}}, {"weight_hh_l1", {24, 8}},
                                          {"bias_ih_l1", {24}}, {"bias_hh_l1", {24}}}));
  EXPECT_EQ(gru.parameter_count(), 24 * 6 + 24 * 8 + 48 + 24 * 8 + 24 * 8 + 48);

  Policy p(tape, rng);
  EXPECT_EQ(names_and_shapes(p), (Names{{"encoder.weight", {7, 4}}, {"gru.weight_ih", {15, 4}}, {"gru.weight_hh", {15, 5}},
                                        {"gru.bias_ih", {15}}, {"gru.bias_hh", {15}}, {"head.weight", {3, 5}},
                                        {"head.bias", {3}}}));
  EXPECT_EQ(p.parameter_count(), 28 + 60 + 75 + 30 + 15 + 3);
  EXPECT_EQ(p.parameters().size(), 7u);
  for (const Tensor& t : p.parameters()) EXPECT_TRUE(t.requires_grad && t.space == Space::Persistent && t.grad);
}

TEST(Modules, RegistrationErrors) {
  Tape tape, other;
  nn::Rng rng(0);
  nn::Module m(tape);
  nn::Linear a(tape, rng, 2, 2), b(other, rng, 2, 2);
  m.register_module("a", a);
  EXPECT_THROW(m.register_module("a", a), Error);
  EXPECT_THROW(m.register_parameter("a", {2}), Error);
  EXPECT_THROW(m.register_parameter("x.y", {2}), Error);
  EXPECT_THROW(m.register_parameter("bad\xff", {2}), Error);  // not UTF-8: nn::save failed on it, naming nothing
  EXPECT_THROW(m.register_parameter("\xc0\xaf", {2}), Error);   // an overlong '/'
  EXPECT_NO_THROW(m.register_parameter("gewicht_\xc3\xa4", {2}));
  EXPECT_THROW(m.register_module("b", b), Error);  // another tape
  EXPECT_THROW(nn::Linear(tape, rng, 0, 3), ShapeError);
}

// A chain of modules deeper than the stack holds a recursive walk's frames
// (Python's named_parameters() overflowed it at about 45,000 levels): every
// walk over the modules is a loop.
TEST(Modules, AChainDeeperThanTheStackWalks) {
  Tape tape;
  constexpr int kDepth = 200000;
  std::vector<std::unique_ptr<nn::Module>> chain;
  chain.push_back(std::make_unique<nn::Module>(tape));
  for (int i = 1; i < kDepth; ++i) {
    chain.push_back(std::make_unique<nn::Module>(tape));
    chain[size_t(i) - 1]->register_module("c", *chain.back());
  }
  chain.back()->register_parameter("w", {3});
  chain[kDepth / 2]->register_parameter("v", {2});
  const nn::Module& root = *chain.front();
  const std::vector<nn::NamedTensor> named = root.named_parameters();
  ASSERT_EQ(named.size(), 2u);
  std::string path;
  for (int i = 0; i < kDepth / 2; ++i) path += "c.";
  EXPECT_EQ(named[0].first, path + "v");  // (a module's own parameters before its children's)
  EXPECT_EQ(named[1].first.size(), size_t(2 * (kDepth - 1) + 1));
  EXPECT_EQ(root.parameter_count(), 5);
  chain.front()->zero_grad();
  EXPECT_NO_THROW(nn::clip_grad_norm(root, 1.0));
  EXPECT_THROW(chain.back()->register_module("loop", *chain.front()), Error);  // (the cycle check walks it too)
}

// A module registered in two places (a tied layer) is one set of
// parameters, as in PyTorch: listed, counted, clipped and stepped once (it
// was clipped twice and refused by every optimizer as "given twice").
TEST(Modules, ASharedModuleIsOneSetOfParameters) {
  Tape tape;
  nn::Rng rng(1);
  nn::Module root(tape);
  nn::Linear lin(tape, rng, 1, 1, /*bias=*/false);
  root.register_module("a", lin);
  root.register_module("b", lin);
  const auto named = root.named_parameters();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].first, "a.weight");  // (its first place)
  EXPECT_EQ(root.parameter_count(), 1);
  fill_value(lin.weight, 1);
  {
    Segment s = tape.segment();
    const std::vector<float> x{3};
    s.backward(sum(lin(tape.from(x, {1, 1}))));
  }
  EXPECT_EQ(lin.weight.grad_tensor().to_host<float>()[0], 3.0f);
  EXPECT_NEAR(nn::clip_grad_norm(root, 1.0), 3.0, 1e-6);  // PyTorch: 3 (it was 4.24: the gradient counted twice)
  EXPECT_NEAR(lin.weight.grad_tensor().to_host<float>()[0], 3.0 / (3.0 + 1e-6), 1e-6);
  nn::SGD sgd(root, {.lr = 0.5});
  sgd.step();
  EXPECT_NEAR(lin.weight.to_host<float>()[0], 1.0 - 0.5 * 3.0 / (3.0 + 1e-6), 1e-6);  // stepped once
}

// A Shape's public fields written by hand are checked where a tensor is made
// of them (rank 9 read past dims[4]; a negative dimension was a BudgetError
// "asked for 0 B more").
TEST(Modules, AHandWrittenShapeIsChecked) {
  Tape tape;
  Segment s = tape.segment();
  Shape bad;
  bad.rank = 9;
  EXPECT_THROW(
      try { (void)tape.zeros(bad); } catch (const ShapeError& e) {
        EXPECT_NE(std::string(e.what()).find("tape.zeros(): a shape of rank 9"), std::string::npos) << e.what();
        throw;
      },
      ShapeError);
  Shape negative;
  negative.rank = 2, negative.dims = {-5, 3, 0, 0};
  EXPECT_THROW(
      try { (void)tape.zeros(negative); } catch (const ShapeError& e) {
        EXPECT_NE(std::string(e.what()).find("dimension -5 is negative"), std::string::npos) << e.what();
        throw;
      },
      ShapeError);
  EXPECT_THROW((void)tape.persistent(negative), ShapeError);
  EXPECT_THROW((void)reshape(tape.zeros({2}), bad), ShapeError);
}

TEST(Modules, ForwardShapesAndErrors) {
  Tape tape;
  nn::Rng rng(1);
  nn::Linear lin(tape, rng, 3, 2);
  nn::GRUCell cell(tape, rng, 3, 4);
  nn::GRU gru(tape, rng, 3, 4, 2);
  Segment seg = tape.segment();
  Tensor x = tape.from(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 2, 3});
  // A rank-3 Linear equals the rank-2 one on the flattened rows.
  Tensor y3 = lin(x), y2 = lin(reshape(x, {4, 3}));
  EXPECT_EQ(y3.shape, Shape({2, 2, 2}));
  EXPECT_EQ(values(y3), values(y2));
  EXPECT_THROW(lin(tape.zeros({2, 4})), ShapeError);
  // An undefined state is zeros.
  Tensor x2 = reshape(x, {4, 3});
  EXPECT_EQ(values(cell(x2)), values(cell(x2, tape.zeros({4, 4}))));
  auto [out, hn] = gru(x);
  EXPECT_EQ(out.shape, Shape({2, 2, 4}));
  EXPECT_EQ(hn.shape, Shape({2, 2, 4}));
  // The last output step is the last layer's final state.
  EXPECT_EQ(values(slice(out, 0, 1, 1)), values(slice(hn, 0, 1, 1)));
  EXPECT_THROW(gru(x, tape.zeros({1, 2, 4})), ShapeError);
  EXPECT_THROW(gru(tape.zeros({2, 2, 5})), ShapeError);
}

// nn::GRU's per-stream resets: every layer's state entering step t is
// multiplied by keep[t, b]: the same values (bit for bit on the CPU) as the
// layers' cells stepped by hand with the states masked, and not those of no
// keep.
TEST(Modules, GruWithResetsEqualsItsLayersSteppedByHandWithTheStatesMasked) {
  Tape tape;
  nn::Rng rng(3);
  const int64_t T = 5, B = 3, I = 3, H = 4, L = 2;
  nn::GRU gru(tape, rng, I, H, L);
  Segment seg = tape.segment();
  std::vector<float> xv(size_t(T * B * I)), kv(size_t(T * B), 1.0f);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(std::sin(double(i)));
  kv[0] = kv[4] = kv[5] = kv[13] = 0;  // (t, b) = (0, 0), (1, 1), (1, 2), (4, 1)
  Tensor x = tape.from(xv, {T, B, I}), keep = tape.from(kv, {T, B});
  auto [out, hn] = gru(x, Tensor{}, keep);
  Tensor seq = x;
  for (int64_t l = 0; l < L; ++l) {
    const nn::GRU::Layer& p = gru.layers()[size_t(l)];
    Tensor h = tape.zeros({B, H});
    std::vector<Tensor> steps;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> m(size_t(B * H));
      for (int64_t b = 0; b < B; ++b) std::fill_n(m.begin() + b * H, H, kv[size_t(t * B + b)]);
      h = gru_cell(reshape(slice(seq, 0, t, 1), {B, seq.dim(2)}), mul(h, tape.from(m, {B, H})), p.weight_ih, p.weight_hh,
                   p.bias_ih, p.bias_hh);
      steps.push_back(reshape(h, {1, B, H}));
    }
    seq = concat(std::span<const Tensor>(steps), 0);
  }
  EXPECT_EQ(values(out), values(seq));
  EXPECT_EQ(values(slice(hn, 0, 1, 1)), values(slice(seq, 0, T - 1, 1)));
  EXPECT_NE(values(out), values(gru(x).output));
  EXPECT_THROW(gru(x, Tensor{}, tape.from(kv, {B, T})), ShapeError);
}

// ------------------------------------------------------------ rng and init

TEST(Init, RngIsSplitmix64AndPortable) {
  nn::Rng r(0);
  // splitmix64's published first outputs for seed 0.
  EXPECT_EQ(r.next_u64(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(r.next_u64(), 0x6E789E6AA1B965F4ull);
  const nn::Rng::State s = r.state();
  EXPECT_EQ(s.counter, 2u);
  const double u = r.uniform(), n = r.normal();
  r.set_state(s);
  EXPECT_EQ(r.uniform(), u);
  EXPECT_EQ(r.normal(), n);
  for (int i = 0; i < 1000; ++i) {
    const double v = r.uniform();
    ASSERT_TRUE(v >= 0 && v < 1);
  }
}

TEST(Init, SameSeedSameModelDifferentSeedDifferent) {
  Tape tape;
  nn::Rng r1(42), r2(42), r3(43);
  Policy a(tape, r1), b(tape, r2), c(tape, r3);
  EXPECT_EQ(snapshot(a.named_parameters()), snapshot(b.named_parameters()));
  const auto sa = snapshot(a.named_parameters()), sc = snapshot(c.named_parameters());
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_NE(sa[i], sc[i]) << a.named_parameters()[i].first;
}

TEST(Init, RangesMatchPyTorchDefaults) {
  Tape tape;
  nn::Rng rng(7);
  auto check_uniform = [](const Tensor& t, double bound, const std::string& what) {
    const auto v = values(t);
    double lo = 1e9, hi = -1e9, mean = 0, sq = 0;
    for (double x : v) lo = std::min(lo, x), hi = std::max(hi, x), mean += x, sq += x * x;
    mean /= double(v.size());
    EXPECT_GE(lo, -bound) << what;
    EXPECT_LE(hi, bound) << what;
    EXPECT_LT(lo, -0.9 * bound) << what;  // the whole range is used
    EXPECT_GT(hi, 0.9 * bound) << what;
    EXPECT_NEAR(sq / double(v.size()), bound * bound / 3, 0.1 * bound * bound) << what;  // U(-b, b) variance
  };
  nn::Linear lin(tape, rng, 100, 50);
  check_uniform(lin.weight, 0.1, "linear weight");
  check_uniform(lin.bias, 0.1, "linear bias");
  nn::GRU gru(tape, rng, 10, 16, 2);
  for (const auto& [n, p] : gru.named_parameters()) check_uniform(p, 0.25, n);
  nn::GRUCell cell(tape, rng, 10, 64, true, DType::F64);
  for (const auto& [n, p] : cell.named_parameters()) check_uniform(p, 0.125, n);
  nn::Embedding emb(tape, rng, 1000, 64);
  const auto v = values(emb.weight);
  double mean = 0, sq = 0;
  for (double x : v) mean += x, sq += x * x;
  mean /= double(v.size());
  const double sd = std::sqrt(sq / double(v.size()) - mean * mean);
  EXPECT_NEAR(mean, 0, 0.02);
  EXPECT_NEAR(sd, 1, 0.02);
}

// ------------------------------------------------------------ gradcheck

TEST(Gradcheck, GruSequenceThroughModuleApiFloat64) {
  constexpr int64_t T = 4, B = 2, I = 3, H = 4, L = 2;
  Tape tape;
  nn::Rng rng(11);
  nn::GRU gru(tape, rng, I, H, L, true, DType::F64);
  Tensor x = tape.parameter({T, B, I}, DType::F64), h0 = tape.parameter({L, B, H}, DType::F64);
  std::mt19937 gen(5);
  fill_uniform(x, gen);
  fill_uniform(h0, gen);
  std::vector<double> wo(size_t(T * B * H)), wh(size_t(L * B * H));
  for (double& v : wo) v = std::uniform_real_distribution<double>(-1, 1)(gen);
  for (double& v : wh) v = std::uniform_real_distribution<double>(-1, 1)(gen);
  auto loss = [&] {
    auto [out, hn] = gru(x, h0);
    return add(sum(mul(out, tape.from(std::span<const double>(wo), out.shape))),
               sum(mul(hn, tape.from(std::span<const double>(wh), hn.shape))));
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
  std::vector<nn::NamedTensor> all = gru.named_parameters();
  all.emplace_back("x", x);
  all.emplace_back("h0", h0);
  for (const auto& [n, p] : all) {
    const double e = rel_error(values(p.grad_tensor()), numeric_grad(p, f));
    EXPECT_LE(e, 1e-7) << n;
  }
}

// ------------------------------------------------------------ optimizers

TEST(Optim, HandComputedSteps) {
  Tape tape;
  Tensor p = tape.parameter({1}, DType::F64);
  auto set = [&](double v, double g) { p.data<double>()[0] = v, static_cast<double*>(p.grad)[0] = g; };
  auto pv = [&] { return p.data<double>()[0]; };
  std::vector<Tensor> ps{p};
  {
    nn::SGD sgd(nn::numbered(ps), {.lr = 0.1, .momentum = 0.9});
    set(1.0, 0.5);
    sgd.step();  // buf = g = 0.5
    EXPECT_DOUBLE_EQ(pv(), 0.95);
    static_cast<double*>(p.grad)[0] = 0.5;
    sgd.step();  // buf = 0.9 * 0.5 + 0.5 = 0.95
    EXPECT_DOUBLE_EQ(pv(), 0.95 - 0.095);
    EXPECT_EQ(sgd.state()[0].first, "momentum_buffer.0");
    EXPECT_DOUBLE_EQ(sgd.state()[0].second.data<double>()[0], 0.95);
  }
  {
    nn::SGD sgd(nn::numbered(ps), {.lr = 0.1, .momentum = 0.5, .weight_decay = 0.1, .nesterov = true});
    set(2.0, 0.3);
    sgd.step();  // g = 0.3 + 0.2 = 0.5; buf = 0.5; g = 0.5 + 0.25
    EXPECT_DOUBLE_EQ(pv(), 2.0 - 0.075);
  }
  {
    nn::Adam adam(nn::numbered(ps), {.lr = 0.01, .weight_decay = 0.5});
    set(1.0, 0.5);
    adam.step();  // g = 1.0; the first Adam step moves by lr * g / (|g| + eps)
    EXPECT_NEAR(pv(), 1.0 - 0.01 * 1.0 / (1.0 + 1e-8), 1e-15);
    EXPECT_EQ(adam.step_count(), 1);
    EXPECT_EQ(adam.state()[0].first, "exp_avg.0");
    EXPECT_EQ(adam.state()[1].first, "exp_avg_sq.0");
  }
  {
    nn::AdamW adamw(nn::numbered(ps), {.lr = 0.01, .weight_decay = 0.5});
    set(1.0, 0.5);
    adamw.step();  // p = 1 * (1 - 0.005), then - 0.01 * 0.5 / (0.5 + eps)
    EXPECT_NEAR(pv(), 0.995 - 0.01 * 0.5 / (0.5 + 1e-8), 1e-15);
    EXPECT_STREQ(adamw.kind(), "AdamW");
  }
  {
    // clip: norm 5 over two parameters, clipped to 1.
    Tensor q = tape.parameter({1}, DType::F64);
    set(0, 3.0);
    static_cast<double*>(q.grad)[0] = 4.0;
    std::vector<Tensor> both{p, q};
    EXPECT_DOUBLE_EQ(nn::clip_grad_norm(both, 1.0), 5.0);
    EXPECT_NEAR(static_cast<double*>(p.grad)[0], 3.0 / (5.0 + 1e-6), 1e-15);
    EXPECT_NEAR(nn::clip_grad_norm(both, 10.0), 1.0, 1e-6);  // below max_norm: unchanged
    EXPECT_NEAR(static_cast<double*>(p.grad)[0], 3.0 / (5.0 + 1e-6), 1e-15);
  }
}

// Adam with its step count where the parameters live (options().capturable:
// add_scalar advances a float64 [1] tensor, adam_step reads it there) makes
// the very same updates as the host count, bit for bit, in float32 and
// float64, Adam and AdamW, also across set_step_count (a resume).
TEST(Optim, CapturableAdamEqualsAdamBitForBit) {
  for (const bool decoupled : {false, true})
    for (const DType d : {DType::F32, DType::F64}) {
      SCOPED_TRACE(std::string(decoupled ? "AdamW " : "Adam ") + dtype_name(d));
      Tape tape;
      std::vector<Tensor> a{tape.parameter({3, 5}, d), tape.parameter({7}, d)}, b{tape.parameter({3, 5}, d), tape.parameter({7}, d)};
      nn::Rng rng(5);
      auto fill = [&](Tensor& t, bool grad) {
        for (int64_t i = 0; i < t.numel(); ++i) {
          const double v = rng.uniform(-1, 1);
          if (d == DType::F32) (grad ? static_cast<float*>(t.grad) : t.data<float>())[i] = float(v);
          else (grad ? static_cast<double*>(t.grad) : t.data<double>())[i] = v;
        }
      };
      auto bytes = [](const Tensor& t) {
        const auto* p = static_cast<const std::byte*>(t.ptr);
        return std::vector<std::byte>(p, p + t.nbytes());
      };
      for (size_t k = 0; k < a.size(); ++k) {
        fill(a[k], false);
        std::memcpy(b[k].ptr, a[k].ptr, a[k].nbytes());
      }
      nn::AdamOptions host{.lr = 0.05, .weight_decay = 0.1}, device = host;
      device.capturable = true;
      std::unique_ptr<nn::Adam> oa = decoupled ? std::make_unique<nn::AdamW>(nn::numbered(a), host)
                                              : std::make_unique<nn::Adam>(nn::numbered(a), host);
      std::unique_ptr<nn::Adam> ob = decoupled ? std::make_unique<nn::AdamW>(nn::numbered(b), device)
                                              : std::make_unique<nn::Adam>(nn::numbered(b), device);
      for (int it = 0; it < 12; ++it) {
        if (it == 7) {  // a resume: the device count follows set_step_count at the next step
          oa->set_step_count(40);
          ob->set_step_count(40);
        }
        for (size_t k = 0; k < a.size(); ++k) {
          fill(a[k], true);
          std::memcpy(b[k].grad, a[k].grad, a[k].nbytes());
        }
        oa->step();
        ob->step();
        for (size_t k = 0; k < a.size(); ++k) ASSERT_EQ(bytes(b[k]), bytes(a[k])) << "parameter " << k << ", step " << it;
      }
      EXPECT_EQ(ob->step_count(), 45);
      for (size_t k = 0; k < oa->state().size(); ++k) EXPECT_EQ(bytes(ob->state()[k].second), bytes(oa->state()[k].second));
      EXPECT_EQ(ob->state().size(), oa->state().size());  // the count is not a state tensor: checkpoints keep step_count()
    }
  // The engine call's checks name what is wrong with the count.
  Tape tape;
  Tensor p = tape.parameter({2}), m = tape.persistent({2}), v = tape.persistent({2});
  const auto refused = [&](const Tensor& step, const std::string& fragment) {
    try {
      adam_step(p, m, v, {}, false, step);
      ADD_FAILURE() << "accepted: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  refused(Tensor{}, "adam_step: the step count is an undefined tensor");
  refused(tape.persistent({1}), "must be a persistent float64 tensor of one element");
  refused(tape.persistent({2}, DType::F64), "must be a persistent float64 tensor of one element");
  Tape other;
  refused(other.persistent({1}, DType::F64), "belongs to another tape");
  EXPECT_THROW(add_scalar(tape.persistent({1}, DType::I64), 1), ShapeError);
  // capturable is chosen at construction: step() allocates nothing.
  nn::Adam late(nn::numbered(std::vector<Tensor>{p}), {});
  late.options().capturable = true;
  try {
    late.step();
    ADD_FAILURE() << "capturable switched on after construction was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("construct the optimizer with capturable = true"), std::string::npos) << e.what();
  }
  EXPECT_EQ(late.step_count(), 0) << "the refused step was counted (every later bias correction with it)";
  // SGD's momentum likewise (its buffers are made at construction).
  nn::SGD sgd(nn::numbered(std::vector<Tensor>{p}), {.lr = 0.1});
  sgd.options().momentum = 0.9;
  try {
    sgd.step();
    ADD_FAILURE() << "momentum switched on after construction was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SGD: options().momentum was switched on after construction"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(sgd.step_count(), 0);
}

// clip_grad_norm with its norm kept where the gradients live (the
// capturable form) scales the gradients exactly as the host form, bit for
// bit: below max_norm (no scaling), above it, and with a non-finite
// gradient (NaN propagates); its sum of squares is the host norm squared.
TEST(Optim, CapturableClipEqualsClipBitForBit) {
  for (const DType d : {DType::F32, DType::F64})
    for (const double max_norm : {100.0, 0.3})
      for (const bool nan : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(d)) + " max_norm " + std::to_string(max_norm) + (nan ? " NaN" : ""));
        Tape tape;
        nn::Rng rng(9);
        nn::Linear a(tape, rng, 5, 3, true, d), b(tape, rng, 5, 3, true, d);
        std::vector<Tensor> pa = {a.weight, a.bias}, pb = {b.weight, b.bias};
        for (size_t k = 0; k < pa.size(); ++k)
          for (int64_t i = 0; i < pa[k].numel(); ++i) {
            const double g = (nan && k == 1 && i == 2) ? std::nan("") : rng.uniform(-1, 1);
            if (d == DType::F32) static_cast<float*>(pa[k].grad)[i] = static_cast<float*>(pb[k].grad)[i] = float(g);
            else static_cast<double*>(pa[k].grad)[i] = static_cast<double*>(pb[k].grad)[i] = g;
          }
        const double total = nn::clip_grad_norm(pa, max_norm);
        Tensor sq = tape.persistent({1}, DType::F64);
        sq.data<double>()[0] = 123.0;  // overwritten, not added to
        nn::clip_grad_norm(pb, max_norm, sq);
        if (nan) EXPECT_TRUE(std::isnan(sq.data<double>()[0]));
        else EXPECT_EQ(std::sqrt(sq.data<double>()[0]), total);
        for (size_t k = 0; k < pa.size(); ++k)
          EXPECT_EQ(std::memcmp(pa[k].grad, pb[k].grad, pa[k].nbytes()), 0) << "gradient " << k;
      }
  // It scales when the norm exceeds max_norm, and the module form is the same clip.
  Tape tape;
  nn::Rng rng(2);
  nn::Linear m(tape, rng, 4, 4);
  for (int64_t i = 0; i < m.weight.numel(); ++i) static_cast<float*>(m.weight.grad)[i] = 1.0f;  // norm 4
  Tensor sq = tape.persistent({1}, DType::F64);
  nn::clip_grad_norm(m, 2.0, sq);
  EXPECT_EQ(sq.data<double>()[0], 16.0);
  EXPECT_EQ(static_cast<float*>(m.weight.grad)[0], float(2.0 / (4.0 + 1e-6)));
  EXPECT_THROW(nn::clip_grad_norm(m, 2.0, tape.persistent({1})), ShapeError);  // float32: not the sum's tensor
}

TEST(Optim, InvalidOptionsAndParameters) {
  Tape tape;
  nn::Rng rng(0);
  nn::Linear lin(tape, rng, 2, 2);
  EXPECT_THROW(nn::SGD(lin, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(nn::SGD(lin, {.lr = -1}), Error);
  EXPECT_THROW(nn::Adam(lin, {.beta1 = 1.0}), Error);
  std::vector<nn::NamedTensor> twice{{"a", lin.weight}, {"b", lin.weight}};
  EXPECT_THROW(nn::SGD(twice, {}), Error);
  std::vector<nn::NamedTensor> not_param{{"a", tape.persistent({2})}};
  EXPECT_THROW(nn::Adam(not_param, {}), Error);
}

TEST(Optim, StepClipAndTrainingLoopAllocateNothing) {
  Tape tape;
  nn::Rng rng(3), data(4);
  Policy p(tape, rng);
  nn::Adam adam(p, {.lr = 1e-2, .weight_decay = 1e-3});
  nn::AdamW adamw(p, {.lr = 1e-2, .weight_decay = 1e-2});
  nn::SGD sgd(p, {.lr = 1e-2, .momentum = 0.9, .nesterov = true});
  std::array<nn::Optimizer*, 3> all{&adam, &adamw, &sgd};
  train_segment(p, data, all);  // warm-up: the arena and op workspace reach their size
  train_segment(p, data, all);
  const size_t state_sizes = adam.state().size() + adamw.state().size() + sgd.state().size();
  const uint64_t chunks = memory::system_allocations();
  alloc_hook::enable(true);
  const uint64_t before = alloc_hook::count();
  for (nn::Optimizer* o : all) o->step();
  nn::clip_grad_norm(p, 0.5);
  std::array<Tensor, 2> two{p.head.weight, p.head.bias};
  nn::clip_grad_norm(two, 0.5);
  p.zero_grad();
  const uint64_t step_allocs = alloc_hook::count() - before;
  for (int s = 0; s < 5; ++s) train_segment(p, data, all);  // whole segments: forward, backward, clip, steps
  const uint64_t loop_allocs = alloc_hook::count() - before - step_allocs;
  alloc_hook::enable(false);
  EXPECT_EQ(memory::system_allocations(), chunks);
  EXPECT_EQ(adam.state().size() + adamw.state().size() + sgd.state().size(), state_sizes);
  if (alloc_hook::counts_malloc()) {
    EXPECT_EQ(step_allocs, 0u);
    EXPECT_EQ(loop_allocs, 0u);
  }
  EXPECT_EQ(adam.step_count(), 8);
}

TEST(Optim, GruModuleForwardAllocatesNothingAfterWarmUp) {
  Tape tape;
  nn::Rng rng(3);
  nn::GRU gru(tape, rng, 3, 4, 2);
  auto run = [&] {
    Segment seg = tape.segment();
    Tensor x = tape.zeros({10, 2, 3});
    seg.backward(sum(gru(x).output));
  };
  run();
  run();
  alloc_hook::enable(true);
  const uint64_t before = alloc_hook::count();
  run();
  const uint64_t n = alloc_hook::count() - before;
  alloc_hook::enable(false);
  if (alloc_hook::counts_malloc()) {
    EXPECT_EQ(n, 0u);
  }
}

// ------------------------------------------------------------ checkpoints

TEST_F(TempDir, StateDictRoundTrip) {
  for (DType d : {DType::F32, DType::F64}) {
    Tape tape;
    nn::Rng r1(1), r2(2);
    Policy a(tape, r1, d), b(tape, r2, d);
    ASSERT_NE(snapshot(a.named_parameters()), snapshot(b.named_parameters()));
    const fs::path path = dir / "model.safetensors";
    nn::save(a, path, {{"note", "hello"}});
    const nn::LoadReport rep = nn::load(b, path);
    EXPECT_EQ(snapshot(a.named_parameters()), snapshot(b.named_parameters()));
    EXPECT_TRUE(rep.missing_keys.empty() && rep.unexpected_keys.empty());
    EXPECT_EQ(rep.metadata.at("note"), "hello");
    // The file is a plain state_dict: dotted names, the module's dtype and shapes.
    const st::File f = st::load(path);
    ASSERT_EQ(f.tensors.size(), 7u);
    const st::TensorInfo* w = f.find("gru.weight_hh");
    ASSERT_TRUE(w);
    EXPECT_EQ(w->dtype, d == DType::F32 ? st::DType::F32 : st::DType::F64);
    EXPECT_EQ(w->shape, (std::vector<int64_t>{15, 5}));
  }
}

struct ThreeLinear : nn::Module {
  nn::Linear a, b, c;
  ThreeLinear(Tape& t, nn::Rng& r, const char* names[3], int64_t b_out, DType d = DType::F32)
      : Module(t, d), a(t, r, 4, 3, true, d), b(t, r, 3, b_out, true, d), c(t, r, 2, 2, true, d) {
    register_module(names[0], a);
    register_module(names[1], b);
    register_module(names[2], c);
  }
};

TEST_F(TempDir, LoadReportsEveryMismatchAtOnceAndChangesNothing) {
  Tape tape;
  nn::Rng rng(1);
  const char* saved_names[3] = {"a", "b", "old"};
  ThreeLinear src(tape, rng, saved_names, 2);
  const fs::path path = dir / "src.safetensors";
  nn::save(src, path);

  const char* new_names[3] = {"a", "b", "fresh"};
  ThreeLinear dst(tape, rng, new_names, 7);  // b.weight [7, 3] vs [2, 3] in the file
  const auto before = snapshot(dst.named_parameters());
  for (bool strict : {true, false}) {
    try {
      nn::load(dst, path, strict);
      ADD_FAILURE() << "load should fail";
    } catch (const CheckpointError& e) {
      const std::string m = e.what();
      if (strict) std::printf("%s\n", m.c_str());  // what a user sees
      EXPECT_NE(m.find(path.string()), std::string::npos) << m;
      EXPECT_NE(m.find("wrong shape: 'b.weight' is [2, 3] in the file, the model has [7, 3]"), std::string::npos) << m;
      EXPECT_NE(m.find("wrong shape: 'b.bias' is [2] in the file, the model has [7]"), std::string::npos) << m;
      const bool lists_names = m.find("missing: 'fresh.weight'") != std::string::npos &&
                               m.find("missing: 'fresh.bias'") != std::string::npos &&
                               m.find("unexpected: 'old.weight'") != std::string::npos &&
                               m.find("unexpected: 'old.bias'") != std::string::npos;
      EXPECT_EQ(lists_names, strict) << m;
      EXPECT_NE(m.find(strict ? "6 problems" : "2 problems"), std::string::npos) << m;
    }
    // a.* matched, but a failed load copies nothing.
    EXPECT_EQ(snapshot(dst.named_parameters()), before);
  }

  // Wrong dtype.
  ThreeLinear f64(tape, rng, saved_names, 2, DType::F64);
  try {
    nn::load(f64, path);
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong dtype: 'a.weight' is F32 in the file, the model has F64"), std::string::npos) << e.what();
  }

  // Non-strict with only missing / unexpected names: loads what matches and reports the rest.
  ThreeLinear part(tape, rng, new_names, 2);
  const auto fresh_before = snapshot(part.c.named_parameters());
  const nn::LoadReport rep = nn::load(part, path, false);
  EXPECT_EQ(rep.missing_keys, (std::vector<std::string>{"fresh.weight", "fresh.bias"}));
  EXPECT_EQ(rep.unexpected_keys, (std::vector<std::string>{"old.bias", "old.weight"}));  // file order
  EXPECT_EQ(snapshot(part.a.named_parameters()), snapshot(src.a.named_parameters()));
  EXPECT_EQ(snapshot(part.b.named_parameters()), snapshot(src.b.named_parameters()));
  EXPECT_EQ(snapshot(part.c.named_parameters()), fresh_before);
  EXPECT_THROW(nn::load(part, path, true), CheckpointError);

  // A file that does not exist.
  try {
    nn::load(part, dir / "nope.safetensors");
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.safetensors"), std::string::npos) << e.what();
  }
}

// A caller's own entries that disagree with their tensors are refused before
// the file is read: the tensor before them in the list is not written.
TEST_F(TempDir, LoadEntriesRefusesBadEntriesBeforeWritingAny) {
  Tape tape;
  Tensor a = tape.parameter({2}), b = tape.parameter({3});
  const float av[] = {1, 2}, bv[] = {3, 4, 5};
  a.from_host(std::span<const float>(av));
  b.from_host(std::span<const float>(bv));
  const fs::path path = dir / "entries.safetensors";
  nn::save_entries(path, std::vector<nn::Entry>{nn::entry("a", a), nn::entry("b", b)}, {});

  Tensor a2 = tape.parameter({2}), b2 = tape.parameter({4});
  nn::Entry lying = nn::entry("b", b2);
  lying.shape = {3};  // matches the file, not its tensor
  const std::vector<nn::Entry> entries = {nn::entry("a", a2), lying};
  std::string m;
  try {
    nn::load_entries(path, entries, "the test's state");
    ADD_FAILURE() << "load should fail";
  } catch (const Error& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("entry 'b' declares F32[3] but its tensor is f32[4]"), std::string::npos) << m;
  EXPECT_NE(m.find("nothing was loaded"), std::string::npos) << m;
  EXPECT_EQ(a2.to_host<float>(), std::vector<float>(2, 0.0f));

  // The same name twice, and an entry with no buffer at all (named and shaped
  // as the file's "b": the copy wrote through a null pointer).
  nn::Entry none;
  none.name = "b";
  none.shape = {3};
  for (const auto& [bad, fragment] : {std::pair{std::vector<nn::Entry>{nn::entry("a", a2), nn::entry("a", a2)}, "entry 'a' is given twice"},
                                      std::pair{std::vector<nn::Entry>{nn::entry("a", a2), none}, "entry 'b' has neither a tensor nor a host buffer"}}) {
    try {
      nn::load_entries(path, bad, "the test's state");
      ADD_FAILURE() << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_EQ(a2.to_host<float>(), std::vector<float>(2, 0.0f));
  }
  // The honest entries load.
  nn::load_entries(path, std::vector<nn::Entry>{nn::entry("a", a2), nn::entry("b", tape.parameter({3}))}, "the test's state");
  EXPECT_EQ(a2.to_host<float>(), (std::vector<float>{1, 2}));
}

TEST_F(TempDir, TrainingStateResumeIsBitIdentical) {
  constexpr int kBefore = 3, kAfter = 3;
  // Two optimizers over disjoint parameters: SGD with momentum on the encoder, Adam on the rest.
  struct Run {
    Tape tape;
    nn::Rng init, data;
    Policy p;
    nn::SGD sgd;
    nn::Adam adam;
    std::array<nn::Optimizer*, 2> opts{&adam, &sgd};
    explicit Run(uint64_t seed)
        : init(seed),
          data(seed + 100),
          p(tape, init),
          sgd(part(p, 0, 1), {.lr = 0.05, .momentum = 0.9}),
          adam(part(p, 1, 7), {.lr = 0.01, .weight_decay = 0.01}) {}
    static std::vector<nn::NamedTensor> part(const nn::Module& m, size_t lo, size_t hi) {
      const auto all = m.named_parameters();
      return {all.begin() + ptrdiff_t(lo), all.begin() + ptrdiff_t(hi)};
    }
    std::vector<nn::NamedTensor> everything() const {
      auto all = p.named_parameters();
      for (const auto& s : adam.state()) all.push_back(s);
      for (const auto& s : sgd.state()) all.push_back(s);
      return all;
    }
  };
  Run straight(1);
  for (int s = 0; s < kBefore + kAfter; ++s) train_segment(straight.p, straight.data, straight.opts);

  const fs::path path = dir / "train.safetensors";
  {
    Run first(1);
    for (int s = 0; s < kBefore; ++s) train_segment(first.p, first.data, first.opts);
    nn::save_training_state(path, first.p, std::span<const nn::Optimizer* const>(first.opts.data(), 2), first.data,
                            kBefore, {{"run", "resume-test"}});
  }
  Run resumed(999);  // different initial weights and data stream: all of it must come from the file
  const nn::TrainingState ts = nn::load_training_state(path, resumed.p, resumed.opts, resumed.data);
  EXPECT_EQ(ts.step, kBefore);
  EXPECT_EQ(ts.metadata, (nn::Metadata{{"run", "resume-test"}}));
  EXPECT_EQ(resumed.adam.step_count(), kBefore);
  EXPECT_EQ(resumed.sgd.step_count(), kBefore);
  for (int s = 0; s < kAfter; ++s) train_segment(resumed.p, resumed.data, resumed.opts);
  EXPECT_EQ(snapshot(resumed.everything()), snapshot(straight.everything()));
  EXPECT_EQ(resumed.data.state(), straight.data.state());

  // The naming scheme of docs/nn.md.
  const st::File f = st::load(path);
  for (const char* n : {"encoder.weight", "head.bias", "optim.exp_avg.gru.weight_ih", "optim.exp_avg_sq.head.bias",
                        "optim.step", "optim1.momentum_buffer.encoder.weight", "optim1.step", "train.step", "rng.state"})
    EXPECT_TRUE(f.find(n)) << n;
  EXPECT_EQ(f.values<int64_t>("train.step"), std::vector<int64_t>{kBefore});
  EXPECT_EQ(f.metadata.at("segtape.optim.kind"), "Adam");
  EXPECT_EQ(f.metadata.at("segtape.optim1.kind"), "SGD");

  // Mismatched optimizers: refused, and nothing changes.
  Run wrong(5);
  std::array<nn::Optimizer*, 2> swapped{&wrong.sgd, &wrong.adam};
  const auto before = snapshot(wrong.everything());
  try {
    nn::load_training_state(path, wrong.p, swapped, wrong.data);
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("optimizer 0 is SGD but the file's 'optim' state is from Adam"), std::string::npos) << m;
    EXPECT_NE(m.find("optimizer 1 is Adam but the file's 'optim1' state is from SGD"), std::string::npos) << m;
    // that alone: not the state tensors each optimizer then lacks or has extra
    EXPECT_EQ(m.find("missing: 'optim.momentum_buffer.encoder.weight'"), std::string::npos) << m;
  }
  EXPECT_EQ(snapshot(wrong.everything()), before);
  EXPECT_EQ(wrong.data.state(), nn::Rng(105).state());
  // Reserved metadata keys, in a training state and in a module's file; a negative step.
  EXPECT_THROW(nn::save_training_state(dir / "x.safetensors", wrong.p, wrong.adam, wrong.data, 0, {{"segtape.kind", "x"}}),
               CheckpointError);
  EXPECT_THROW(nn::save(wrong.p, dir / "x.safetensors", {{"segtape.kind", "x"}}), CheckpointError);
  EXPECT_THROW(nn::save_training_state(dir / "x.safetensors", wrong.p, wrong.adam, wrong.data, -1), CheckpointError);
  EXPECT_FALSE(fs::exists(dir / "x.safetensors"));
  // A null optimizer in the list: an error naming it (it was dereferenced).
  const std::array<const nn::Optimizer*, 2> with_null{&wrong.adam, nullptr};
  EXPECT_THROW(
      try { nn::save_training_state(dir / "y.safetensors", wrong.p, with_null, wrong.data, 0); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("optimizer 1 of the list is null"), std::string::npos) << e.what();
        throw;
      },
      Error);
  EXPECT_FALSE(fs::exists(dir / "y.safetensors"));
  // A step count past 2^53 in a file (INT64_MAX overflowed at the next
  // step): refused on load, nothing changed; and by set_step_count.
  {
    st::File g = st::load(path);
    std::vector<st::TensorRef> refs;
    std::vector<std::byte> big(8);
    const int64_t huge = std::numeric_limits<int64_t>::max();
    std::memcpy(big.data(), &huge, 8);
    for (const st::TensorInfo& t : g.tensors)
      refs.push_back({t.name, t.dtype, t.shape, t.name == "optim.step" ? std::span<const std::byte>(big) : g.data(t)});
    st::save_atomic(dir / "huge.safetensors", refs, g.metadata);
  }
  std::array<nn::Optimizer*, 2> right{&wrong.adam, &wrong.sgd};
  const auto kept = snapshot(wrong.everything());
  try {
    nn::load_training_state(dir / "huge.safetensors", wrong.p, right, wrong.data);
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'optim.step' is 9223372036854775807, outside [0, 2^53]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(snapshot(wrong.everything()), kept);
  EXPECT_THROW(wrong.adam.set_step_count(nn::Optimizer::kMaxSteps + 1), Error);
  // A host entry whose shape's product overflows int64: named, not UB.
  std::vector<int64_t> none;
  EXPECT_THROW(
      try { (void)nn::entry("x", std::span<int64_t>(none), {int64_t(1) << 40, int64_t(1) << 40, 0}); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("nn::entry('x'): shape [1099511627776, 1099511627776, 0] has more elements"),
                  std::string::npos) << e.what();
        throw;
      },
      Error);
  // A plain module checkpoint is not a training state; a training state loads into a module non-strictly.
  nn::save(wrong.p, dir / "plain.safetensors");
  EXPECT_THROW(nn::load_training_state(dir / "plain.safetensors", wrong.p, swapped, wrong.data), CheckpointError);
  nn::load(wrong.p, path, false);
  const std::vector<float> saved = f.values<float>("gru.weight_hh");
  EXPECT_EQ(values(wrong.p.gru.weight_hh), std::vector<double>(saved.begin(), saved.end()));
}

TEST_F(TempDir, CrashBeforeRenameKeepsThePreviousCheckpoint) {
  Tape tape;
  nn::Rng rng(1), data(2);
  Policy p(tape, rng);
  nn::Adam adam(p, {});
  const fs::path path = dir / "ckpt.safetensors";
  nn::save_training_state(path, p, adam, data, 1);
  const auto v1 = snapshot(p.named_parameters());
  std::array<nn::Optimizer*, 1> opts{&adam};
  train_segment(p, data, opts);
  ASSERT_NE(snapshot(p.named_parameters()), v1);
  st::set_before_rename_hook([](const fs::path&) { throw std::runtime_error("simulated crash before rename"); });
  EXPECT_ANY_THROW(nn::save_training_state(path, p, adam, data, 2));
  EXPECT_ANY_THROW(nn::save(p, path));
  st::set_before_rename_hook({});
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1u);  // no temp file left behind
  const nn::TrainingState ts = nn::load_training_state(path, p, adam, data);
  EXPECT_EQ(ts.step, 1);
  EXPECT_EQ(snapshot(p.named_parameters()), v1);
  EXPECT_EQ(adam.step_count(), 0);
}

// The benchmark workload's memory invariants (docs/benchmarks.md), asserted
// here rather than read off the benchmark: a training segment (GRUCell +
// Linear + cross-entropy + Adam, K = 32 steps) takes no heap allocation after
// the first, and its arena high-water is within 1.1x the analytic minimum of
// what backward must keep (1.15x at B = 1, where the 64-byte alignment of the
// tiny per-step tensors is most of the difference).
TEST(Workload, SegmentsAllocateNothingAndPeakNearTheAnalyticMinimum) {
  using namespace segtape::bench;
  openblas_set_num_threads(1);  // OpenBLAS's threaded sgemm allocates (docs/benchmarks.md)
  // (64, 1024) too, in docs/benchmarks.md; left out here for CI's time (4 s).
  const int64_t sizes[][2] = {{1, 128}, {32, 128}, {32, 512}};
  for (const auto& z : sizes) {
    const int64_t B = z[0], H = z[1];
    const Data data(B);
    SegtapeModel m(B, H, data);
    m.train_segment();  // the first segment sizes the arena and the workspaces
    const uint64_t before = alloc_hook::count();
    alloc_hook::enable(true);
    m.train_segment();
    m.train_segment();
    alloc_hook::enable(false);
    EXPECT_EQ(alloc_hook::count() - before, 0u) << "B " << B << " H " << H;
    const double ratio = double(m.tape.stats().last_segment_peak) / double(analytic_saved_bytes(B, H));
    EXPECT_GE(ratio, 1.0) << "B " << B << " H " << H;
    EXPECT_LE(ratio, B == 1 ? 1.15 : 1.1) << "B " << B << " H " << H;
  }
}

}  // namespace
