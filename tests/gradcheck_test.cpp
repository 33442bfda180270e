// Every op, float64, random shapes and values: backward vs central finite
// differences (relative error <= 1e-6). Plus composed graphs, and the fused
// GRU cell against the same cell composed from primitive ops.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
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

// A write after an op is recorded: backward refuses it exactly where the
// write would change a gradient (PyTorch's "modified by an inplace
// operation"), and elsewhere gives the gradients it gave without the write.
// For each operand of a case (every input, then the output), after the
// forward: the same new values written where segtape sees the write
// (from_host) and where it cannot (through the pointer data<const T>()
// hands out, as a `.data` write in PyTorch). The unseen write shows whether
// the gradients depend on those bytes; the seen one must be refused exactly
// then, before any gradient changes, and leave the gradients as they were
// otherwise. With every input a parameter, and with each input in turn a
// tensor that wants no gradient (what an op reads can depend on which
// gradients are wanted: matmul reads B only for dA).
TEST_P(GradCheck, AWriteAfterTheForwardIsRefusedExactlyWhereItChangesAGradient) {
  const Case cs = cases()[size_t(GetParam())];
  const int64_t d0[4] = {2, 2, 2, 2};
  const size_t n_inputs = cs.shapes(d0).size();
  for (int trial = 0; trial < 2 * int(n_inputs + 1); ++trial) {
    const size_t frozen = size_t(trial / 2);  // this input wants no gradient (n_inputs: none)
    if (frozen < n_inputs && n_inputs == 1) continue;  // (nothing would be recorded)
    const unsigned seed = 4321 + 17 * unsigned(GetParam()) + unsigned(trial);
    std::mt19937 drng(seed);
    int64_t d[4];
    for (auto& v : d) v = std::uniform_int_distribution<int64_t>(1, 4)(drng);
    enum class Write { None, Seen, Unseen };
    // The parameter gradients after: forward, the write into operand k (an
    // input, or the output at k == number of inputs), backward. nullopt when refused.
    auto run = [&](size_t k, Write how, size_t* operands, std::string* refusal) -> std::optional<std::vector<double>> {
      std::mt19937 rng(seed);
      Tape tape;
      std::vector<Tensor> in = cs.inputs(tape, d, rng, DType::F64);
      if (frozen < in.size()) {
        const Tensor c = tape.persistent(in[frozen].shape, DType::F64);
        const std::vector<double> v = values(in[frozen]);
        c.from_host(std::span<const double>(v));
        in[frozen] = c;
      }
      Segment seg = tape.segment();
      const Tensor out = cs.f(tape, in, d);
      std::vector<double> w(size_t(out.numel()));
      for (double& v : w) v = std::uniform_real_distribution<double>(-1, 1)(rng);
      const Tensor loss = sum(mul(out, tape.from(std::span<const double>(w), out.shape)));
      *operands = in.size() + 1;
      if (how != Write::None) {
        const Tensor& t = k < in.size() ? in[k] : out;
        std::vector<double> v = values(t);
        for (double& x : v) x = -1.7 * x + 0.31;
        if (how == Write::Seen) t.from_host(std::span<const double>(v));
        else std::copy(v.begin(), v.end(), const_cast<double*>(t.data<const double>()));
      }
      std::optional<std::vector<double>> grads;
      try {
        seg.backward(loss);
        grads.emplace();
      } catch (const TapeError& e) {
        *refusal = e.what();
      }
      std::vector<double> all;
      for (const Tensor& p : in) {
        if (!p.grad) continue;  // the frozen input
        const std::vector<double> g = values(p.grad_tensor());
        all.insert(all.end(), g.begin(), g.end());
      }
      if (!grads) {  // refused before any gradient was added
        EXPECT_EQ(all, std::vector<double>(all.size(), 0.0)) << cs.name << ": a refused backward changed a gradient";
        return std::nullopt;
      }
      *grads = all;
      return grads;
    };
    size_t operands = 0;
    std::string refusal;
    const auto plain = run(0, Write::None, &operands, &refusal);
    ASSERT_TRUE(plain) << cs.name << ": " << refusal;
    for (size_t k = 0; k < operands; ++k) {
      const std::string which = cs.name + " trial " + std::to_string(trial) +
                                (frozen < n_inputs ? " (input " + std::to_string(frozen) + " frozen)" : std::string()) + ", " +
                                (k + 1 < operands ? "input " + std::to_string(k) : std::string("the output"));
      std::string why;
      const auto unseen = run(k, Write::Unseen, &operands, &why);
      ASSERT_TRUE(unseen) << which << ": " << why;
      const bool changes = *unseen != *plain;
      std::string refused;
      const auto seen = run(k, Write::Seen, &operands, &refused);
      if (changes) {
        EXPECT_FALSE(seen) << which << ": the write changed the gradients and backward did not refuse it";
        EXPECT_NE(refused.find("from_host wrote into it after that"), std::string::npos) << which << ": " << refused;
      } else {
        EXPECT_TRUE(seen) << which << ": refused a write its gradients do not depend on: " << refused;
        if (seen) {
          EXPECT_EQ(*seen, *plain) << which;
        }
      }
    }
  }
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

// The fused LSTM cell equals the composed one, in values and in every
// gradient, over two steps (the second's state is the first's output).
TEST(FusedLstm, EqualsComposedCell) {
  std::mt19937 rng(8);
  const int64_t B = 3, I = 5, H = 4;
  Tape tape;
  std::vector<Shape> shapes = {{B, I}, {2, B, H}, {4 * H, I}, {4 * H, H}, {4 * H}, {4 * H}};
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
    auto cell = [&](const Tensor& s) {
      return pass ? lstm_composed(in[0], s, in[2], in[3], in[4], in[5]) : lstm_cell(in[0], s, in[2], in[3], in[4], in[5]);
    };
    Tensor s2 = cell(cell(in[1]));
    (pass ? out_comp : out_fused) = values(s2);
    seg.backward(sum(mul(s2, s2)));
    auto& g = pass ? g_comp : g_fused;
    for (auto& t : in) g.push_back(values(t.grad_tensor()));
  }
  EXPECT_LE(rel_error(out_fused, out_comp), 1e-14);
  for (size_t k = 0; k < in.size(); ++k) EXPECT_LE(rel_error(g_fused[k], g_comp[k]), 1e-13) << "input " << k;
}

// Bad shapes and dtypes: errors that name the op and the shapes.
TEST(FusedLstm, BadInputsNameTheOpAndTheShapes) {
  Tape tape;
  const int64_t B = 2, I = 3, H = 4;
  Tensor x = tape.parameter({B, I}), s = tape.parameter({2, B, H}), wi = tape.parameter({4 * H, I}), wh = tape.parameter({4 * H, H});
  Tensor bi = tape.parameter({4 * H}), bh = tape.parameter({4 * H});
  Segment seg = tape.segment();
  auto msg = [](auto f) {
    try {
      f();
    } catch (const ShapeError& e) {
      return std::string(e.what());
    }
    return std::string("no ShapeError");
  };
  const std::string state = msg([&] { (void)lstm_cell(x, tape.zeros({B, H}), wi, wh, bi, bh); });
  EXPECT_NE(state.find("lstm_cell: expects x [B, I], state [2, B, H]"), std::string::npos) << state;
  EXPECT_NE(state.find("f32[2,4]"), std::string::npos) << state;
  const std::string gru_weights = msg([&] { (void)lstm_cell(x, s, tape.zeros({3 * H, I}), wh, bi, bh); });
  EXPECT_NE(gru_weights.find("lstm_cell: weights must be w_ih [4H, I] and w_hh [4H, H]"), std::string::npos) << gru_weights;
  const std::string bias = msg([&] { (void)lstm_cell(x, s, wi, wh, tape.zeros({3 * H}), bh); });
  EXPECT_NE(bias.find("lstm_cell: biases must have 4H elements"), std::string::npos) << bias;
  const std::string dtype = msg([&] { (void)lstm_cell(x, tape.zeros({2, B, H}, DType::F64), wi, wh, bi, bh); });
  EXPECT_NE(dtype.find("lstm_cell: dtypes differ"), std::string::npos) << dtype;
  const std::string pair = msg([&] { (void)lstm_cell(x, tape.zeros({B, H}), tape.zeros({B, H + 1}), wi, wh, bi, bh); });
  EXPECT_NE(pair.find("lstm_state: expects h and c of one shape [B, H]"), std::string::npos) << pair;
  const std::string part = msg([&] { (void)lstm_h(tape.zeros({3, B, H})); });
  EXPECT_NE(part.find("lstm_h: expects an LSTM state [2, B, H]"), std::string::npos) << part;
}

}  // namespace
