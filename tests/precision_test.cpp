// TapeOptions::precision (segtape/precision.h, docs/precision.md): bfloat16
// rounding; bf16 matrix products forward and backward, exactly where the
// products of rounded operands can be computed the same way, within bounds of
// float32 elsewhere; the recurrent cells' float32-only paths (packed weights,
// batched weight gradients) off under it; the language model and the default
// agent learning as they do in float32; --precision in the checkpoint and the
// refusals. (Compiled into lm_test: it needs the agent library and its corpus.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <bit>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

#include "agent_util.h"
#include "segtape/agent/trainer.h"
#include "segtape/kernels.h"
#include "segtape/precision.h"
#include "segtape/nn/safetensors.h"
#include "util.h"

using namespace segtape;
using namespace segtape::agent;
namespace fs = std::filesystem;

namespace {

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
bool representable(float x) { return (bits(x) & 0xffffu) == 0; }

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}
std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_round(x);
  return v;
}

TapeOptions with(Precision p) {
  TapeOptions o;
  o.precision = p;
  return o;
}

}  // namespace

TEST(Precision, Bf16RoundIsToNearestTiesToEven) {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // bfloat16's spacing at 1
  EXPECT_EQ(bf16_round(one), one);
  EXPECT_EQ(bf16_round(one + ulp), one + ulp);
  EXPECT_EQ(bf16_round(one + ulp / 2), one) << "a tie goes to the even neighbour (1)";
  EXPECT_EQ(bf16_round(one + 3 * ulp / 2), one + 2 * ulp) << "a tie goes to the even neighbour (1 + 2 ulp)";
  EXPECT_EQ(bf16_round(one + ulp / 2 + std::ldexp(1.0f, -20)), one + ulp) << "above the tie: up";
  EXPECT_EQ(bf16_round(one + ulp / 2 - std::ldexp(1.0f, -20)), one) << "below the tie: down";
  EXPECT_EQ(bf16_round(-(one + 3 * ulp / 2)), -(one + 2 * ulp)) << "the sign is kept";
  EXPECT_EQ(bf16_round(3.14159265f), 3.140625f);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_round(inf), inf);
  EXPECT_EQ(bf16_round(-inf), -inf);
  EXPECT_EQ(bf16_round(std::numeric_limits<float>::max()), inf) << "past bfloat16's largest finite value";
  EXPECT_EQ(bf16_round(from_bits(0x7f7f0000u)), from_bits(0x7f7f0000u)) << "bfloat16's largest finite value";
  EXPECT_TRUE(std::isnan(bf16_round(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(bf16_round(from_bits(0x7f800001u)))) << "a NaN whose payload is in the dropped bits stays a NaN";
  EXPECT_EQ(bits(bf16_round(from_bits(0x00018000u))), 0x00020000u) << "subnormals: a tie to even";
  EXPECT_EQ(bits(bf16_round(from_bits(0x00000001u))), 0u) << "the smallest subnormal rounds to +0";
  for (float x : random_floats(1000, 7, 100)) {
    const float r = bf16_round(x);
    ASSERT_TRUE(representable(r)) << x;
    ASSERT_LE(std::abs(r - x), std::abs(x) * std::ldexp(1.0f, -8)) << x << ": within half a bfloat16 ulp";
  }
  EXPECT_EQ(parse_precision("bf16"), Precision::Bf16);
  EXPECT_EQ(parse_precision("f32"), Precision::F32);
  EXPECT_FALSE(parse_precision("fp16").has_value());
  EXPECT_STREQ(precision_name(Precision::Bf16), "bf16");
}

// bf16 on a CUDA GPU without bfloat16 tensor cores (compute capability
// below 8.0) is refused at the tape's setup, naming the GPU, the limit and
// what to use instead (the CUDA backend throws it as an Error).
TEST(Precision, Bf16OnAGpuWithoutBf16IsRefusedNamingTheAlternative) {
  const std::string m = precision_unsupported(Precision::Bf16, 7, 5, "cuda:0, Tesla T4 (sm_75)");
  EXPECT_NE(m.find("--precision bf16"), std::string::npos) << m;
  EXPECT_NE(m.find("Tesla T4 (sm_75)"), std::string::npos) << m;
  EXPECT_NE(m.find("compute capability 8.0"), std::string::npos) << m;
  EXPECT_NE(m.find("this GPU is 7.5"), std::string::npos) << m;
  EXPECT_NE(m.find("use precision f32 on this GPU"), std::string::npos) << m;
  EXPECT_EQ(precision_unsupported(Precision::Bf16, 8, 0, "A100"), "");
  EXPECT_EQ(precision_unsupported(Precision::Bf16, 9, 0, "H200"), "");
  EXPECT_EQ(precision_unsupported(Precision::F32, 7, 0, "V100"), "");
}

// matmul on a bf16 tape is OpenBLAS's float32 product of the rounded
// operands, rounded: to the bit (the same GEMM call runs on the same values),
// in every transposition, for a one-row product (GEMV) too. Its gradients
// are products rounded to bfloat16 (every element representable), within a
// bfloat16 rounding of the double-precision products of the rounded values,
// and not float32's.
TEST(Precision, Bf16MatmulIsTheRoundedProductOfRoundedOperandsForwardAndBackward) {
  struct Case {
    int64_t M, N, K;
    bool ta, tb;
  };
  for (const Case cs : {Case{5, 7, 9, false, false}, Case{5, 7, 9, true, false}, Case{5, 7, 9, false, true}, Case{6, 4, 33, true, true},
                        Case{1, 16, 24, false, false}, Case{16, 1, 24, false, true}}) {
    SCOPED_TRACE(testing::Message() << cs.M << "x" << cs.N << "x" << cs.K << " ta " << cs.ta << " tb " << cs.tb);
    const Shape sa = cs.ta ? Shape{cs.K, cs.M} : Shape{cs.M, cs.K}, sb = cs.tb ? Shape{cs.N, cs.K} : Shape{cs.K, cs.N};
    const std::vector<float> a = random_floats(size_t(cs.M * cs.K), 1), b = random_floats(size_t(cs.K * cs.N), 2),
                             g = random_floats(size_t(cs.M * cs.N), 3);
    Tape bf(Device::cpu(), with(Precision::Bf16)), ref(Device::cpu());
    Tensor pa = bf.parameter(sa), pb = bf.parameter(sb);
    std::copy(a.begin(), a.end(), pa.data<float>());
    std::copy(b.begin(), b.end(), pb.data<float>());
    std::vector<float> out;
    {
      Segment seg = bf.segment();
      Tensor c = matmul(pa, pb, cs.ta, cs.tb);
      out = c.to_host<float>();
      seg.backward(c, bf.from(std::span<const float>(g), {cs.M, cs.N}));
    }
    std::vector<float> expect;
    {
      Segment seg = ref.segment();
      const std::vector<float> ra = rounded(a), rb = rounded(b);
      expect = rounded(matmul(ref.from(std::span<const float>(ra), sa), ref.from(std::span<const float>(rb), sb), cs.ta, cs.tb)
                           .to_host<float>());
    }
    EXPECT_EQ(out, expect);
    // dA = G op(B)^T (laid out as A), dB = op(A)^T G (laid out as B), in double on the rounded values
    const std::vector<float> ra = rounded(a), rb = rounded(b), rg = rounded(g);
    auto A = [&](int64_t i, int64_t k) { return double(ra[size_t(cs.ta ? k * cs.M + i : i * cs.K + k)]); };
    auto Bv = [&](int64_t k, int64_t j) { return double(rb[size_t(cs.tb ? j * cs.K + k : k * cs.N + j)]); };
    std::vector<double> da(a.size()), db(b.size());
    for (int64_t i = 0; i < cs.M; ++i)
      for (int64_t j = 0; j < cs.N; ++j)
        for (int64_t k = 0; k < cs.K; ++k) {
          const double gij = rg[size_t(i * cs.N + j)];
          da[size_t(cs.ta ? k * cs.M + i : i * cs.K + k)] += gij * Bv(k, j);
          db[size_t(cs.tb ? j * cs.K + k : k * cs.N + j)] += A(i, k) * gij;
        }
    for (const auto& [p, want] : {std::pair{pa, &da}, std::pair{pb, &db}}) {
      const std::vector<float> got = p.grad_tensor().to_host<float>();
      double scale = 0;
      for (double w : *want) scale = std::max(scale, std::abs(w));
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(representable(got[i])) << i << ": " << got[i];
        ASSERT_NEAR(got[i], (*want)[i], std::abs((*want)[i]) * std::ldexp(1.0, -8) + scale * 1e-6) << i;
      }
    }
  }
}

// A GRU or LSTM cell's products (with W_ih and W_hh) under bf16: within
// 1 % of float32's largest value or gradient, not equal to them; the packed
// weights and the batched weight gradients (float32 kernels) are off, so
// turning them off changes nothing to the bit.
TEST(Precision, Bf16CellsStayNearFloat32AndTakeNoFloat32OnlyPath) {
  constexpr int64_t B = 32, I = 48, H = 128, T = 12;
  for (const bool lstm : {false, true}) {
    SCOPED_TRACE(lstm ? "lstm" : "gru");
    const int64_t G = (lstm ? 4 : 3) * H;
    auto run = [&](Precision p, bool packed, bool batch) {
      TapeOptions o = with(p);
      o.batch_weight_grads = batch;
      kernels::Options k = kernels::options();
      k.packed = packed ? kernels::Packed::Best : kernels::Packed::Off;
      const kernels::Scope scope(k);
      Tape tape(Device::cpu(), o);
      std::mt19937 rng(11);
      Tensor w_ih = tape.parameter({G, I}), w_hh = tape.parameter({G, H}), b_ih = tape.parameter({G}), b_hh = tape.parameter({G});
      for (Tensor* w : {&w_ih, &w_hh, &b_ih, &b_hh}) test::fill_uniform(*w, rng, -0.2, 0.2);
      const std::vector<float> xs = random_floats(size_t(T * B * I), 5);
      std::vector<float> values;
      {
        Segment seg = tape.segment();
        const std::vector<float> h0 = random_floats(size_t((lstm ? 2 : 1) * B * H), 6);
        Tensor h = lstm ? tape.from(std::span<const float>(h0), {2, B, H}) : tape.from(std::span<const float>(h0), {B, H});
        Tensor loss;
        for (int64_t t = 0; t < T; ++t) {
          Tensor x = tape.from(std::span<const float>(xs).subspan(size_t(t * B * I), size_t(B * I)), {B, I});
          h = lstm ? lstm_cell(x, h, w_ih, w_hh, b_ih, b_hh) : gru_cell(x, h, w_ih, w_hh, b_ih, b_hh);
          Tensor m = mean(mul(h, h));
          loss = t ? add(loss, m) : m;
        }
        values = h.to_host<float>();
        seg.backward(loss);
      }
      for (Tensor* w : {&w_ih, &w_hh}) {
        const std::vector<float> g = w->grad_tensor().to_host<float>();
        values.insert(values.end(), g.begin(), g.end());
      }
      return values;
    };
    const std::vector<float> f32 = run(Precision::F32, true, true), bf16 = run(Precision::Bf16, true, true);
    ASSERT_EQ(f32.size(), bf16.size());
    double scale = 0, worst = 0;
    size_t differ = 0;
    for (size_t i = 0; i < f32.size(); ++i) {
      scale = std::max(scale, double(std::abs(f32[i])));
      worst = std::max(worst, double(std::abs(f32[i] - bf16[i])));
      differ += f32[i] != bf16[i];
    }
    EXPECT_GT(differ, f32.size() / 2) << "bf16 rounds most values";
    EXPECT_LT(worst, 0.01 * scale) << "the largest difference from float32, against the largest value " << scale;
    EXPECT_EQ(run(Precision::Bf16, false, true), bf16) << "the packed kernels are off under bf16";
    EXPECT_EQ(run(Precision::Bf16, true, false), bf16) << "the batched weight gradients are off under bf16";
  }
}

// The language model (GRU, then a one-layer LSTM) trained for two epochs of
// the 20,000-byte corpus: bf16's validation losses within 1 % of float32's
// (0.02 % and 0.12 % on the machine that wrote this), falling; the run's
// parameters not float32's.
TEST(Precision, Bf16LanguageModelLearnsAsFloat32Does) {
  const fs::path text = fs::path(SEGTAPE_SOURCE_DIR) / "tests" / "data" / "shakespeare-20k.txt";
  for (const char* cell : {"gru", "lstm"}) {
    SCOPED_TRACE(cell);
    auto valid = [&](const std::string& precision, std::vector<float>* params) {
      TrainConfig c;
      c.env = "lm", c.algo = Algo::Lm, c.env_options.data = text.string(), c.history = History::parse("tbptt:16");
      c.batch = 8, c.hidden = 64, c.embed = 32, c.steps = 2 * 2249, c.lr = 1e-2, c.cell = cell, c.precision = precision;
      Trainer tr(c);
      std::vector<double> v;
      while (!tr.done())
        if (const UpdateResult r = tr.run_segment(); r.metric("valid_loss") > 0) v.push_back(r.metric("valid_loss"));
      *params = test::params_of(tr);
      return v;
    };
    std::vector<float> p32, p16;
    const std::vector<double> f32 = valid("f32", &p32), bf16 = valid("bf16", &p16);
    ASSERT_EQ(f32.size(), 2u);
    ASSERT_EQ(bf16.size(), 2u);
    for (size_t e = 0; e < 2; ++e) EXPECT_NEAR(bf16[e], f32[e], 0.01 * f32[e]) << "epoch " << e + 1;
    EXPECT_LT(bf16.back(), bf16.front());
    EXPECT_NE(p32, p16);
  }
}

// The default agent (recall, a2c, tbptt:32, B 32, H 128), its first 6,000
// steps: bf16's mean loss over the last third within 2 % of float32's (0.07 %
// on the machine that wrote this), float32's well below its first updates'.
TEST(Precision, Bf16DefaultAgentLearnsAsFloat32Does) {
  auto curve = [](const std::string& precision) {
    TrainConfig c;
    c.steps = 6000, c.precision = precision;
    Trainer tr(c);
    std::vector<double> losses;  // per update: mean loss per step
    while (!tr.done())
      if (const UpdateResult r = tr.run_segment(); r.loss_steps > 0) losses.push_back(r.loss_sum / double(r.loss_steps));
    return losses;
  };
  const std::vector<double> f32 = curve("f32"), bf16 = curve("bf16");
  ASSERT_EQ(f32.size(), bf16.size());
  auto mean = [](const std::vector<double>& v, size_t from, size_t to) {
    double s = 0;
    for (size_t i = from; i < to; ++i) s += v[i];
    return s / double(to - from);
  };
  const size_t n = f32.size(), tail = n / 3;
  const double first32 = mean(f32, 0, 10), end32 = mean(f32, n - tail, n), end16 = mean(bf16, n - tail, n);
  EXPECT_LT(end32, 0.8 * first32) << "float32 learns";
  EXPECT_NEAR(end16, end32, 0.02 * end32) << "bf16's curve ends where float32's does";
  EXPECT_NE(f32, bf16);
}

// --precision is in the checkpoint (only when not f32: float32 checkpoints
// are as before), a resumed bf16 run continues bit for bit, a trainer of
// another precision refuses it, and the bad values are refused by name.
TEST(Precision, IsInTheCheckpointResumesAndRefusesBadValues) {
  const fs::path dir = fs::temp_directory_path() / ("segtape_precision_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TrainConfig c;
  c.steps = 640, c.hidden = 32, c.precision = "bf16";
  Trainer straight(c), first(c);
  while (!straight.done()) straight.run_segment();
  while (first.step() < 320) first.run_segment();
  first.save(dir / "bf16.safetensors");
  EXPECT_EQ(safetensors::load(dir / "bf16.safetensors").metadata.at("precision"), "bf16");
  TrainConfig back = Trainer::read_config(dir / "bf16.safetensors");
  EXPECT_EQ(back.precision, "bf16");
  Trainer second(back);
  second.load(dir / "bf16.safetensors");
  while (!second.done()) second.run_segment();
  EXPECT_EQ(test::params_of(second), test::params_of(straight));
  c.precision = "f32";
  Trainer f32(c);
  EXPECT_THROW(
      try { f32.load(dir / "bf16.safetensors"); } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find("another --precision"), std::string::npos) << e.what();
        throw;
      },
      CheckpointError);
  f32.save(dir / "f32.safetensors");
  EXPECT_EQ(safetensors::load(dir / "f32.safetensors").metadata.count("precision"), 0u);
  c.precision = "fp16";
  EXPECT_THROW(
      try { c.validate(); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--precision 'fp16'"), std::string::npos) << e.what();
        throw;
      },
      Error);
  if (Device::cuda_built()) {  // bf16 on the GPU too: cuBLAS's bfloat16 GEMM (without the CUDA backend --device cuda is refused)
    c.precision = "bf16", c.device = "cuda";
    EXPECT_NO_THROW(c.validate());
  }
  fs::remove_all(dir);
}
