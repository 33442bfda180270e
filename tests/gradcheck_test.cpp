// Every op, float64, random shapes and values: backward vs central finite
// differences (relative error <= 1e-6). Plus composed graphs, and the fused
// GRU cell against the same cell composed from primitive ops.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "op_cases.h"
#include "util.h"

using namespace segtape;
using namespace segtape::test;

namespace {

using Case = OpCase;  // the shared table (op_cases.h); tol32 is cuda_test's
const std::vector<Case>& cases() {
  static const std::vector<Case> c = op_cases();
  return c;
}

class GradCheck : public ::testing::TestWithParam<int> {};

// One case at dims d: backward's gradients against central differences of forward.
void check_gradients(const Case& cs, const int64_t* d, std::mt19937& rng, const std::string& what) {
  Tape tape;
  std::vector<Tensor> in = cs.inputs(tape, d, rng, DType::F64);
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
    EXPECT_LE(err, 1e-6) << cs.name << " input " << k << " " << what << " shape " << in[k].shape.str();
  }
}

TEST_P(GradCheck, BackwardMatchesFiniteDifferences) {
  const Case cs = cases()[size_t(GetParam())];
  for (int trial = 0; trial < 3; ++trial) {
    std::mt19937 rng(1234 + 17 * unsigned(GetParam()) + unsigned(trial));
    int64_t d[4];
    for (auto& v : d) v = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    check_gradients(cs, d, rng, "trial " + std::to_string(trial));
  }
}

// Products with one row or one column go to BLAS's GEMV on most OpenBLAS
// kernels (engine/cpu/blas.cpp): every transpose with M, K or N of 1, forward
// and both input gradients, whichever path this machine's BLAS takes.
TEST(GradCheckMatmul, OneRowOrOneColumnInEveryTransposition) {
  const int64_t dims[][4] = {{1, 3, 4, 1}, {3, 4, 1, 1}, {1, 3, 1, 1}, {1, 1, 4, 1}, {4, 1, 3, 1}, {1, 5, 7, 1}};
  int matmuls = 0;
  for (const Case& cs : cases()) {
    if (cs.name.rfind("matmul_t", 0) != 0) continue;
    ++matmuls;
    for (const auto& d : dims) {
      std::mt19937 rng(7 + unsigned(d[0] * 100 + d[1] * 10 + d[2]));
      check_gradients(cs, d, rng, "dims " + std::to_string(d[0]) + "," + std::to_string(d[1]) + "," + std::to_string(d[2]));
    }
  }
  EXPECT_EQ(matmuls, 4);
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::Range(0, int(cases().size())),
                         [](const ::testing::TestParamInfo<int>& i) { return cases()[size_t(i.param)].name; });

// Every op the engine has is in the shared table: each real OpKind is
// recorded by some case on the CPU. (Input is seg.input()'s leaf; GruSequence is recorded by CUDA's cuDNN path, the CPU composing
// gru_cell steps, so the table names it by its case instead.)
TEST(OpTable, EveryOpKindHasACase) {
  std::set<OpKind> seen;
  bool sequence_case = false;
  for (const Case& cs : cases()) {
    sequence_case |= cs.name == "gru_sequence";
    const int64_t d[4] = {2, 3, 2, 2};
    std::mt19937 rng(5);
    Tape tape;
    const std::vector<Tensor> in = cs.inputs(tape, d, rng, DType::F64);
    Segment seg = tape.segment();
    cs.f(tape, in, d);
    for (const Node& n : tape.nodes()) seen.insert(n.op);
  }
  for (size_t k = 0; k < kOpKinds; ++k) {
    const OpKind op = OpKind(k);
    if (op == OpKind::Input) continue;
    if (op == OpKind::GruSequence) EXPECT_TRUE(sequence_case) << "no case named gru_sequence in op_cases.h";
    else EXPECT_TRUE(seen.count(op)) << "op '" << op_name(op) << "' has no case in tests/op_cases.h";
  }
}

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
