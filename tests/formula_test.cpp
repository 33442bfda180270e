// The elementwise formulas (engine/ops/elementwise.h) with the device's math
// (ops::DeviceMath, what the CUDA kernels use) against the CPU's (cpu::Math),
// on the host: a wrong device formula is found in every build, GPU or not
// (the host-emulated device computes with the CPU's math, so it cannot see one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "cpu/vmath.h"
#include "ops/device_math.h"
#include "ops/elementwise.h"
#include "update_math.h"

namespace segtape {
namespace {

// |a - b| <= tol * max(1, |b|), or both not finite in the same way.
template <class T>
void expect_close(T device, T cpu, double tol, const std::string& what) {
  if (!std::isfinite(cpu) || !std::isfinite(device)) {
    EXPECT_EQ(std::isnan(device), std::isnan(cpu)) << what << ": device " << device << ", CPU " << cpu;
    if (!std::isnan(cpu)) {
      EXPECT_EQ(device, cpu) << what;
    }
    return;
  }
  EXPECT_LE(std::fabs(double(device) - double(cpu)), tol * std::max(1.0, std::fabs(double(cpu))))
      << what << ": device " << device << ", CPU " << cpu;
}

template <class Op, class T>
void check_op(const char* name, double tol) {
  const T inf = std::numeric_limits<T>::infinity();
  const T xs[] = {-inf, T(-1e30), T(-30), T(-6), T(-2), T(-0.5), T(-1e-3), T(0), T(1e-3), T(0.5), T(2), T(6), T(25), T(1e30), inf};
  const T s = T(1.5), g = T(0.75);
  for (T x : xs) {
    const T yd = Op::template forward<ops::DeviceMath, T>(x, s);
    const T yc = Op::template forward<cpu::Math, T>(x, s);
    const std::string at = std::string(name) + "(" + std::to_string(double(x)) + ")" + (sizeof(T) == 4 ? " float" : " double");
    expect_close<T>(yd, yc, tol, at + " forward");
    expect_close<T>(Op::template backward<ops::DeviceMath, T>(g, x, yc, s), Op::template backward<cpu::Math, T>(g, x, yc, s), tol,
                    at + " backward");
  }
}

TEST(Formulas, DeviceMathEqualsTheCpusForEveryUnaryOp) {
  // double: both use the C library's exp / tanh (the CPU's float ones are
  // its own vectorized approximations, within a few ulp of it).
#define SEGTAPE_CHECK_OP(Kind, name, fwd, bwd)          \
  check_op<ops::Kind, double>(#name, 1e-12);            \
  check_op<ops::Kind, float>(#name, 2e-6);
  SEGTAPE_UNARY_OPS(SEGTAPE_CHECK_OP)
#undef SEGTAPE_CHECK_OP
}

// The forward formulas at the ends of the range, with both maths, against
// PyTorch's values there (torch 1.13: torch.tanh(inf) is 1, torch.relu(nan)
// nan, torch.relu(-0.0) and torch.tanh(-0.0) -0.0, ...). exp(-inf) is 0
// (the CPU's float exp was e^-87 ~ 1.6e-38 there); below ln(FLT_MIN) the
// CPU's float exp is 0 where PyTorch's may be a subnormal (under 1.2e-38),
// and just above it a normal number within its usual error.
template <class M, class T>
void check_edges(const std::string& math) {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN(), big = T(1e30);
  const std::string at = math + (sizeof(T) == 4 ? " float" : " double");
  auto f = [](auto op, T x) { return decltype(op)::template forward<M, T>(x, T(1)); };
  auto same = [&](T got, T want, const std::string& what) {
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << what << " " << at << ": " << got;
    } else {
      EXPECT_EQ(got, want) << what << " " << at;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << what << " " << at << ": the sign of " << got;
    }
  };
  for (T x : {inf, big}) {
    same(f(ops::Tanh{}, x), T(1), "tanh(+large)");
    same(f(ops::Tanh{}, -x), T(-1), "tanh(-large)");
    same(f(ops::Sigmoid{}, x), T(1), "sigmoid(+large)");
    same(f(ops::Sigmoid{}, -x), T(0), "sigmoid(-large)");
    same(f(ops::Exp{}, x), inf, "exp(+large)");
    same(f(ops::Softplus{}, x), x, "softplus(+large)");
    same(f(ops::Relu{}, x), x, "relu(+large)");
    same(f(ops::Relu{}, -x), T(0), "relu(-large)");
  }
  same(f(ops::Exp{}, -inf), T(0), "exp(-inf)");
  same(f(ops::Exp{}, -big), T(0), "exp(-large)");
  EXPECT_LE(f(ops::Exp{}, T(-88)), T(6.1e-39)) << "exp(-88) " << at;  // (0 on the CPU in float; 6.05e-39 a subnormal)
  EXPECT_NEAR(f(ops::Exp{}, T(-87.3)) / std::exp(double(T(-87.3))), 1.0, 1e-6) << "exp(-87.3) " << at;  // (a normal float: kept)
  same(f(ops::Log{}, T(0)), -inf, "log(0)");
  same(f(ops::Log{}, inf), inf, "log(inf)");
  same(f(ops::Log{}, T(-1)), nan, "log(-1)");
  same(f(ops::Relu{}, T(-0.0)), T(-0.0), "relu(-0)");
  same(f(ops::Tanh{}, T(-0.0)), T(-0.0), "tanh(-0)");
  same(f(ops::Tanh{}, T(0)), T(0), "tanh(0)");
  // Every unary op (the same list as check_op's): NaN in, NaN out.
#define SEGTAPE_NAN_IN_NAN_OUT(Kind, name, fwd, bwd) same(f(ops::Kind{}, nan), nan, #name "(nan)");
  SEGTAPE_UNARY_OPS(SEGTAPE_NAN_IN_NAN_OUT)
#undef SEGTAPE_NAN_IN_NAN_OUT
}

TEST(Formulas, EdgeValuesArePyTorchs) {
  check_edges<cpu::Math, float>("cpu::Math");
  check_edges<cpu::Math, double>("cpu::Math");
  check_edges<ops::DeviceMath, float>("DeviceMath");
  check_edges<ops::DeviceMath, double>("DeviceMath");
}

TEST(Formulas, DeviceSigmoidIsTheLogisticFunction) {
  EXPECT_DOUBLE_EQ(ops::DeviceMath::sigmoid(0.0), 0.5);
  EXPECT_NEAR(ops::DeviceMath::sigmoid(2.0), 1.0 / (1.0 + std::exp(-2.0)), 1e-15);
  EXPECT_NEAR(ops::DeviceMath::sigmoid(-2.0f), 1.0f / (1.0f + std::exp(2.0f)), 1e-7f);
}


// Adam's bias corrections take beta^t by squaring (update_math.h), the same
// multiplications on the host and in the capturable kernel. Squaring carries
// beta's rounding into beta^t t times over (relative error about t 2^-53),
// but the bias correction 1 - beta^t, the number Adam uses, stays within
// 2^-53 / (1 - beta) of the C library's relative to itself (x e^-x / (1 - e^-x)
// <= 1 at x = t (1 - beta)): 1.1e-12 at beta 0.9999, nine orders of magnitude
// below float32's resolution. Measured here as a multiple of that bound.
TEST(Formulas, AdamBiasCorrectionBySquaringIsTheLibrarysWithinItsBound) {
  constexpr double u = 0x1p-53;
  double worst = 0;
  for (const double beta : {0.9, 0.999, 0.99, 0.95, 0.5, 0.9999}) {
    EXPECT_EQ(detail::update_pow(beta, 0), 1.0);
    EXPECT_EQ(detail::update_pow(beta, 1), beta);
    for (double t = 1; t <= 1e7; t = t < 5000 ? t + 1 : std::floor(t * 1.37)) {
      const double got = 1 - detail::update_pow(beta, t), want = 1 - std::pow(beta, t);
      const double k = std::fabs(got - want) / want / (u / (1 - beta));
      worst = std::max(worst, k);
      ASSERT_LE(k, 2.0) << "1 - " << beta << "^" << t << ": " << got << " against " << want;
    }
  }
  std::printf("1 - beta^t by squaring: within %.3f x 2^-53 / (1 - beta) of the C library's\n", worst);
  EXPECT_EQ(detail::update_mul(0.1, 3.0), 0.1 * 3.0);
}

}  // namespace
}  // namespace segtape
