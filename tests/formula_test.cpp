// The elementwise formulas (engine/ops/elementwise.h) with the device's math
// (ops::DeviceMath, what the CUDA kernels use) against the CPU's (cpu::Math),
// on the host: a wrong device formula is found in every build, GPU or not
// (the host-emulated device computes with the CPU's math, so it cannot see one).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "cpu/vmath.h"
#include "ops/device_math.h"
#include "ops/elementwise.h"

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

TEST(Formulas, DeviceSigmoidIsTheLogisticFunction) {
  EXPECT_DOUBLE_EQ(ops::DeviceMath::sigmoid(0.0), 0.5);
  EXPECT_NEAR(ops::DeviceMath::sigmoid(2.0), 1.0 / (1.0 + std::exp(-2.0)), 1e-15);
  EXPECT_NEAR(ops::DeviceMath::sigmoid(-2.0f), 1.0f / (1.0f + std::exp(2.0f)), 1e-7f);
}

}  // namespace
}  // namespace segtape
