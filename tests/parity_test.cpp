// Every case of the shared op table (op_cases.h) against LibTorch on the
// same random float32 inputs: values and gradients, relative error <= 1e-5.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <random>

#define SEGTAPE_OP_CASES_TORCH
#include "op_cases.h"
#include "util.h"

using namespace segtape;
using namespace segtape::test;

namespace {

using TT = torch::Tensor;
std::vector<int64_t> sizes(const Shape& s) { return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.rank); }

// The shared op table (op_cases.h), each case at fixed dims.
const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> c = op_cases();
  return c;
}
constexpr int64_t kDims[4] = {6, 5, 4, 3};

TEST(ParityTable, EveryCaseHasALibTorchVersion) {
  for (const OpCase& cs : cases()) EXPECT_TRUE(bool(cs.torch)) << cs.name << ": no SEGTAPE_TORCH(...) in op_cases.h";
}

class Parity : public ::testing::TestWithParam<int> {};

TEST_P(Parity, ValuesAndGradientsMatchLibTorch) {
  const OpCase& cs = cases()[size_t(GetParam())];
  ASSERT_TRUE(bool(cs.torch)) << cs.name;
  const int64_t* d = kDims;
  std::mt19937 rng(99 + unsigned(GetParam()));
  Tape tape;
  const std::vector<Tensor> ours = cs.inputs(tape, d, rng, DType::F32);
  std::vector<TT> theirs;
  for (const Tensor& t : ours)
    theirs.push_back(torch::from_blob(t.ptr, sizes(t.shape), torch::kFloat).clone().requires_grad_(true));
  Segment seg = tape.segment();
  Tensor out = cs.f(tape, ours, d);
  TT tout = cs.torch(theirs, d);
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
