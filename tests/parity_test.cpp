// Every op against LibTorch on the same random float32 inputs: values and
// gradients, relative error <= 1e-5.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <random>

#include "util.h"

using namespace segtape;
using namespace segtape::test;

namespace {

using TT = torch::Tensor;
struct Case {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Tensor(Tape&, const std::vector<Tensor>&)> ours;
  std::function<TT(const std::vector<TT>&)> theirs;
  double lo = -1, hi = 1;
};

std::vector<int64_t> sizes(const Shape& s) { return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank); }
const std::vector<int64_t> kTargets = {0, 4, 2, 1, 3, 4};
const std::vector<int64_t> kIndices = {3, 0, 3, 5, 1, 2};
TT torch_ints(const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong); }
Tensor our_ints(Tape& t, const std::vector<int64_t>& v) { return t.from(std::span<const int64_t>(v), {int64_t(v.size())}); }

std::vector<Case> cases() {
  using V = const std::vector<Tensor>&;
  using W = const std::vector<TT>&;
  std::vector<Case> c;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      c.push_back({"matmul_t" + std::to_string(ta) + std::to_string(tb),
                   {ta ? Shape{7, 6} : Shape{6, 7}, tb ? Shape{5, 7} : Shape{7, 5}},
                   [=](Tape&, V in) { return matmul(in[0], in[1], ta, tb); },
                   [=](W in) { return torch::matmul(ta ? in[0].t() : in[0], tb ? in[1].t() : in[1]); }});
  c.push_back({"add_bias", {{6, 5}, {5}}, [](Tape&, V in) { return add(in[0], in[1]); }, [](W in) { return in[0] + in[1]; }});
  c.push_back({"sub_same", {{6, 5}, {6, 5}}, [](Tape&, V in) { return sub(in[0], in[1]); }, [](W in) { return in[0] - in[1]; }});
  c.push_back({"mul_bias", {{6, 5}, {5}}, [](Tape&, V in) { return mul(in[0], in[1]); }, [](W in) { return in[0] * in[1]; }});
  c.push_back({"div_scalar", {{6, 5}, {1}}, [](Tape&, V in) { return div(in[0], in[1]); }, [](W in) { return in[0] / in[1]; }, 0.5, 2});
  c.push_back({"neg", {{6, 5}}, [](Tape&, V in) { return neg(in[0]); }, [](W in) { return -in[0]; }});
  c.push_back({"scale", {{6, 5}}, [](Tape&, V in) { return scale(in[0], 0.3); }, [](W in) { return in[0] * 0.3; }});
  c.push_back({"tanh", {{6, 5}}, [](Tape&, V in) { return tanh(in[0]); }, [](W in) { return torch::tanh(in[0]); }});
  c.push_back({"sigmoid", {{6, 5}}, [](Tape&, V in) { return sigmoid(in[0]); }, [](W in) { return torch::sigmoid(in[0]); }});
  c.push_back({"relu", {{6, 5}}, [](Tape&, V in) { return relu(in[0]); }, [](W in) { return torch::relu(in[0]); }});
  c.push_back({"exp", {{6, 5}}, [](Tape&, V in) { return exp(in[0]); }, [](W in) { return torch::exp(in[0]); }});
  c.push_back({"log", {{6, 5}}, [](Tape&, V in) { return log(in[0]); }, [](W in) { return torch::log(in[0]); }, 0.2, 3});
  c.push_back({"sum_all", {{3, 4, 5}}, [](Tape&, V in) { return sum(in[0]); }, [](W in) { return in[0].sum(); }});
  c.push_back({"mean_all", {{3, 4, 5}}, [](Tape&, V in) { return mean(in[0]); }, [](W in) { return in[0].mean(); }});
  c.push_back({"sum_axis1", {{3, 4, 5}}, [](Tape&, V in) { return sum(in[0], 1); }, [](W in) { return in[0].sum(1); }});
  c.push_back({"mean_axis2", {{3, 4, 5}}, [](Tape&, V in) { return mean(in[0], 2); }, [](W in) { return in[0].mean(2); }});
  c.push_back({"softmax", {{6, 5}}, [](Tape&, V in) { return softmax(in[0]); }, [](W in) { return torch::softmax(in[0], -1); }});
  c.push_back({"log_softmax", {{6, 5}}, [](Tape&, V in) { return log_softmax(in[0]); }, [](W in) { return torch::log_softmax(in[0], -1); }});
  c.push_back({"cross_entropy", {{6, 5}}, [](Tape& t, V in) { return cross_entropy(in[0], our_ints(t, kTargets)); },
               [](W in) { return torch::nn::functional::cross_entropy(in[0], torch_ints(kTargets)); }});
  c.push_back({"cross_entropy_sum_ignore", {{6, 5}},
               [](Tape& t, V in) { return cross_entropy(in[0], our_ints(t, {0, 4, -100, 1, 3, -100}), Reduction::Sum); },
               [](W in) {
                 namespace F = torch::nn::functional;
                 return F::cross_entropy(in[0], torch_ints({0, 4, -100, 1, 3, -100}), F::CrossEntropyFuncOptions().reduction(torch::kSum));
               }});
  c.push_back({"mse_loss", {{6, 5}, {6, 5}}, [](Tape&, V in) { return mse_loss(in[0], in[1]); },
               [](W in) { return torch::mse_loss(in[0], in[1]); }});
  c.push_back({"concat", {{6, 2}, {6, 3}}, [](Tape&, V in) { return concat({in[0], in[1]}, 1); },
               [](W in) { return torch::cat({in[0], in[1]}, 1); }});
  c.push_back({"slice", {{6, 5}}, [](Tape&, V in) { return slice(in[0], 1, 1, 3); }, [](W in) { return in[0].slice(1, 1, 4); }});
  c.push_back({"reshape", {{6, 5}}, [](Tape&, V in) { return tanh(reshape(in[0], {3, 10})); },
               [](W in) { return torch::tanh(in[0].reshape({3, 10})); }});
  c.push_back({"transpose", {{6, 5}}, [](Tape&, V in) { return transpose(in[0]); }, [](W in) { return in[0].t(); }});
  c.push_back({"embedding", {{6, 4}}, [](Tape& t, V in) { return embedding(in[0], our_ints(t, kIndices)); },
               [](W in) { return torch::embedding(in[0], torch_ints(kIndices)); }});
  c.push_back({"gru_cell", {{4, 3}, {4, 5}, {15, 3}, {15, 5}, {15}, {15}},
               [](Tape&, V in) { return gru_cell(in[0], in[1], in[2], in[3], in[4], in[5]); },
               [](W in) { return torch::gru_cell(in[0], in[1], in[2], in[3], in[4], in[5]); }});
  return c;
}

class Parity : public ::testing::TestWithParam<int> {};

TEST_P(Parity, ValuesAndGradientsMatchLibTorch) {
  const Case cs = cases()[size_t(GetParam())];
  std::mt19937 rng(99 + unsigned(GetParam()));
  Tape tape;
  std::vector<Tensor> ours;
  std::vector<TT> theirs;
  for (const Shape& s : cs.shapes) {
    ours.push_back(tape.parameter(s));
    fill_uniform(ours.back(), rng, cs.lo, cs.hi);
    theirs.push_back(torch::from_blob(ours.back().ptr, sizes(s), torch::kFloat).clone().requires_grad_(true));
  }
  Segment seg = tape.segment();
  Tensor out = cs.ours(tape, ours);
  TT tout = cs.theirs(theirs);
  ASSERT_EQ(sizes(out.shape), tout.sizes().vec()) << cs.name;
  std::vector<float> w(size_t(out.numel()));
  for (float& v : w) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  seg.backward(sum(mul(out, tape.from(std::span<const float>(w), out.shape))));
  (tout * torch::from_blob(w.data(), tout.sizes(), torch::kFloat)).sum().backward();

  auto torch_values = [](const TT& t) {
    TT c = t.detach().to(torch::kDouble).contiguous();
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  };
  const double ev = rel_error(values(out), torch_values(tout));
  EXPECT_LE(ev, 1e-5) << cs.name << " values";
  double worst = ev;
  for (size_t k = 0; k < ours.size(); ++k) {
    const double eg = rel_error(values(ours[k].grad_tensor()), torch_values(theirs[k].grad()));
    EXPECT_LE(eg, 1e-5) << cs.name << " gradient of input " << k;
    worst = std::max(worst, eg);
  }
  RecordProperty("max_rel_error", std::to_string(worst));
  std::printf("parity %-26s max relative error %.2e\n", cs.name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Ops, Parity, ::testing::Range(0, int(cases().size())),
                         [](const ::testing::TestParamInfo<int>& i) { return cases()[size_t(i.param)].name; });

}  // namespace
