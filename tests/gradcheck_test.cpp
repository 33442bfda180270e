// Every op, float64, random shapes and values: backward vs central finite
// differences (relative error <= 1e-6). Plus composed graphs, and the fused
// GRU cell against the same cell composed from primitive ops.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "util.h"

using namespace segtape;
using namespace segtape::test;

namespace {

struct Case {
  std::string name;
  // Input shapes from the case's random dims d[0..3] (each in 1..4).
  std::function<std::vector<Shape>(const int64_t* d)> shapes;
  std::function<Tensor(Tape&, const std::vector<Tensor>&, const int64_t* d)> f;
  double lo = -1, hi = 1;  // input value range
};


std::vector<Case> cases() {
  using S = std::vector<Shape>;
  std::vector<Case> c;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      c.push_back({"matmul_t" + std::to_string(ta) + std::to_string(tb),
                   [=](const int64_t* d) {
                     return S{ta ? Shape{d[1], d[0]} : Shape{d[0], d[1]}, tb ? Shape{d[2], d[1]} : Shape{d[1], d[2]}};
                   },
                   [=](Tape&, const std::vector<Tensor>& in, const int64_t*) { return matmul(in[0], in[1], ta, tb); }});
  const std::pair<const char*, Tensor (*)(const Tensor&, const Tensor&)> bin[] = {
      {"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}};
  for (auto [name, fn] : bin) {
    const bool is_div = std::string(name) == "div";
    // same shape, a bias row, a scalar
    c.push_back({std::string(name) + "_same", [](const int64_t* d) { return S{{d[0], d[1]}, {d[0], d[1]}}; },
                 [fn](Tape&, const std::vector<Tensor>& in, const int64_t*) { return fn(in[0], in[1]); },
                 is_div ? 0.5 : -1, is_div ? 2.0 : 1});
    c.push_back({std::string(name) + "_row", [](const int64_t* d) { return S{{d[0], d[1], d[2]}, {d[2]}}; },
                 [fn](Tape&, const std::vector<Tensor>& in, const int64_t*) { return fn(in[0], in[1]); },
                 is_div ? 0.5 : -1, is_div ? 2.0 : 1});
    c.push_back({std::string(name) + "_scalar", [](const int64_t* d) { return S{{d[0], d[1]}, {1}}; },
                 [fn](Tape&, const std::vector<Tensor>& in, const int64_t*) { return fn(in[0], in[1]); },
                 is_div ? 0.5 : -1, is_div ? 2.0 : 1});
  }
  const std::pair<const char*, Tensor (*)(const Tensor&)> un[] = {{"neg", neg},         {"tanh", tanh}, {"sigmoid", sigmoid},
                                                                  {"relu", relu},       {"exp", exp},   {"softmax", softmax},
                                                                  {"log_softmax", log_softmax}};
  for (auto [name, fn] : un)
    c.push_back({name, [](const int64_t* d) { return S{{d[0], d[1], d[2]}}; },
                 [fn](Tape&, const std::vector<Tensor>& in, const int64_t*) { return fn(in[0]); }});
  c.push_back({"log", [](const int64_t* d) { return S{{d[0], d[1]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) { return log(in[0]); }, 0.3, 2.0});
  c.push_back({"scale", [](const int64_t* d) { return S{{d[0], d[1]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) { return scale(in[0], -2.5); }});
  c.push_back({"sum_all", [](const int64_t* d) { return S{{d[0], d[1], d[2]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) { return sum(in[0]); }});
  c.push_back({"mean_all", [](const int64_t* d) { return S{{d[0], d[1], d[2]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) { return mean(in[0]); }});
  for (int ax = 0; ax < 3; ++ax) {
    c.push_back({"sum_axis" + std::to_string(ax), [](const int64_t* d) { return S{{d[0], d[1], d[2]}}; },
                 [ax](Tape&, const std::vector<Tensor>& in, const int64_t*) { return sum(in[0], ax); }});
    c.push_back({"mean_axis" + std::to_string(ax), [](const int64_t* d) { return S{{d[0], d[1], d[2]}}; },
                 [ax](Tape&, const std::vector<Tensor>& in, const int64_t*) { return mean(in[0], ax); }});
  }
  for (int red = 0; red < 2; ++red)
    c.push_back({red ? "cross_entropy_sum_ignore" : "cross_entropy_mean", [](const int64_t* d) { return S{{d[0] + 1, d[1] + 1}}; },
                 [red](Tape& t, const std::vector<Tensor>& in, const int64_t* d) {
                   std::vector<int64_t> y(size_t(d[0] + 1));
                   for (size_t i = 0; i < y.size(); ++i) y[i] = int64_t(i * 7 % size_t(d[1] + 1));
                   if (red) y[0] = -100;  // ignored row
                   return cross_entropy(in[0], t.from(std::span<const int64_t>(y), {int64_t(y.size())}),
                                        red ? Reduction::Sum : Reduction::Mean);
                 }});
  c.push_back({"mse_loss", [](const int64_t* d) { return S{{d[0], d[1]}, {d[0], d[1]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) { return mse_loss(in[0], in[1]); }});
  c.push_back({"mse_loss_sum", [](const int64_t* d) { return S{{d[0], d[1]}, {d[0], d[1]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) { return mse_loss(in[0], in[1], Reduction::Sum); }});
  for (int ax = 0; ax < 2; ++ax)
    c.push_back({"concat_axis" + std::to_string(ax),
                 [ax](const int64_t* d) {
                   return ax ? S{{d[0], d[1]}, {d[0], d[2]}, {d[0], 1}} : S{{d[0], d[1]}, {d[2], d[1]}, {1, d[1]}};
                 },
                 [ax](Tape&, const std::vector<Tensor>& in, const int64_t*) { return concat({in[0], in[1], in[2]}, ax); }});
  c.push_back({"slice", [](const int64_t* d) { return S{{d[0], d[1] + 2, d[2]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t* d) { return slice(in[0], 1, 1, d[1]); }});
  c.push_back({"reshape", [](const int64_t* d) { return S{{d[0], d[1], d[2]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t* d) {
                 return mul(reshape(in[0], {d[0] * d[1], d[2]}), reshape(in[0], {d[0] * d[1], d[2]}));
               }});
  c.push_back({"transpose", [](const int64_t* d) { return S{{d[0], d[1]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) { return transpose(in[0]); }});
  c.push_back({"embedding", [](const int64_t* d) { return S{{d[0] + 2, d[1]}}; },
               [](Tape& t, const std::vector<Tensor>& in, const int64_t* d) {
                 std::vector<int64_t> ix = {0, d[0] + 1, 1, 0};  // repeats accumulate
                 return embedding(in[0], t.from(std::span<const int64_t>(ix), {2, 2}));
               }});
  c.push_back({"gru_cell", [](const int64_t* d) { return S{{d[0], d[1]}, {d[0], d[2]}, {3 * d[2], d[1]}, {3 * d[2], d[2]}, {3 * d[2]}, {3 * d[2]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) { return gru_cell(in[0], in[1], in[2], in[3], in[4], in[5]); }});
  c.push_back({"gru_cell_recompute", [](const int64_t* d) { return S{{d[0], d[1]}, {d[0], d[2]}, {3 * d[2], d[1]}, {3 * d[2], d[2]}, {3 * d[2]}, {3 * d[2]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) { return gru_cell(in[0], in[1], in[2], in[3], in[4], in[5], true); }});
  // Composed graphs.
  c.push_back({"mlp_cross_entropy", [](const int64_t* d) { return S{{d[0], d[1]}, {d[1], d[2]}, {d[2]}, {d[2], 3}}; },
               [](Tape& t, const std::vector<Tensor>& in, const int64_t* d) {
                 Tensor hid = tanh(add(matmul(in[0], in[1]), in[2]));
                 std::vector<int64_t> y(size_t(d[0]), 2);
                 return cross_entropy(matmul(hid, in[3]), t.from(std::span<const int64_t>(y), {d[0]}));
               }});
  c.push_back({"gru_unrolled_3", [](const int64_t* d) { return S{{d[0], d[1]}, {d[0], d[2]}, {3 * d[2], d[1]}, {3 * d[2], d[2]}, {3 * d[2]}, {3 * d[2]}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) {
                 Tensor h = in[1];
                 Tensor loss;
                 for (int s = 0; s < 3; ++s) {
                   h = gru_cell(scale(in[0], 1.0 + s), h, in[2], in[3], in[4], in[5]);
                   Tensor l = mean(mul(h, h));
                   loss = s ? add(loss, l) : l;
                 }
                 return loss;
               }});
  c.push_back({"softmax_log_exp_chain", [](const int64_t* d) { return S{{d[0], d[1] + 1}}; },
               [](Tape&, const std::vector<Tensor>& in, const int64_t*) {
                 return sum(log(add(softmax(in[0]), exp(relu(in[0])))), 1);
               }});
  return c;
}

class GradCheck : public ::testing::TestWithParam<int> {};

TEST_P(GradCheck, BackwardMatchesFiniteDifferences) {
  const Case cs = cases()[size_t(GetParam())];
  for (int trial = 0; trial < 3; ++trial) {
    std::mt19937 rng(1234 + 17 * unsigned(GetParam()) + unsigned(trial));
    int64_t d[4];
    for (auto& v : d) v = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    Tape tape;
    std::vector<Tensor> in;
    for (const Shape& s : cs.shapes(d)) {
      in.push_back(tape.parameter(s, DType::F64));
      fill_uniform(in.back(), rng, cs.lo, cs.hi);
    }
    // L = sum(f(in) * W) with a fixed random W, so every output element matters.
    std::vector<double> w;
    auto loss = [&](Tape& t) {
      Tensor out = cs.f(t, in, d);
      if (w.empty()) {
        w.resize(size_t(out.numel()));
        for (double& v : w) v = std::uniform_real_distribution<double>(-1, 1)(rng);
      }
      return sum(mul(out, t.from(std::span<const double>(w), out.shape)));
    };
    {
      Segment seg = tape.segment();
      seg.backward(loss(tape));
    }
    auto eval = [&] {
      Segment seg = tape.segment();
      NoGradGuard ng(tape);
      return loss(tape).item();
    };
    for (size_t k = 0; k < in.size(); ++k) {
      const double err = rel_error(values(in[k].grad_tensor()), numeric_grad(in[k], eval));
      EXPECT_LE(err, 1e-6) << cs.name << " input " << k << " trial " << trial << " shape " << in[k].shape.str();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::Range(0, int(cases().size())),
                         [](const ::testing::TestParamInfo<int>& i) { return cases()[size_t(i.param)].name; });

// The fused GRU cell equals the composed one, in values and in every gradient.
TEST(FusedGru, EqualsComposedCell) {
  std::mt19937 rng(7);
  const int64_t B = 3, I = 5, H = 4;
  Tape tape;
  std::vector<Shape> shapes = {{B, I}, {B, H}, {3 * H, I}, {3 * H, H}, {3 * H}, {3 * H}};
  std::vector<Tensor> in;
  for (auto& s : shapes) {
    in.push_back(tape.parameter(s, DType::F64));
    fill_uniform(in.back(), rng);
  }
  std::vector<double> out_fused, out_comp;
  std::vector<std::vector<double>> g_fused, g_comp;
  for (int pass = 0; pass < 2; ++pass) {
    tape.zero_grad();
    Segment seg = tape.segment();
    Tensor h = pass ? gru_composed(in[0], in[1], in[2], in[3], in[4], in[5]) : gru_cell(in[0], in[1], in[2], in[3], in[4], in[5]);
    Tensor h2 = pass ? gru_composed(in[0], h, in[2], in[3], in[4], in[5]) : gru_cell(in[0], h, in[2], in[3], in[4], in[5]);
    (pass ? out_comp : out_fused) = values(h2);
    seg.backward(sum(mul(h2, h2)));
    auto& g = pass ? g_comp : g_fused;
    for (auto& t : in) g.push_back(values(t.grad_tensor()));
  }
  EXPECT_LE(rel_error(out_fused, out_comp), 1e-14);
  for (size_t k = 0; k < in.size(); ++k) EXPECT_LE(rel_error(g_fused[k], g_comp[k]), 1e-13) << "input " << k;
}

}  // namespace
