// Engine-internal: the device's math for the op formulas of
// ops/elementwise.h (M in a formula), the full-precision functions of the C
// library. Host and device (SEGTAPE_HD), so the CUDA kernels use it and a
// host test (tests/formula_test.cpp) checks it against the CPU's cpu::Math
// in every build, GPU or not. Compiled by g++ (C++20) and nvcc (C++17).
#pragma once
#include <math.h>

#include "hd.h"

namespace segtape::ops {

struct DeviceMath {
  SEGTAPE_HD static float exp(float x) { return ::expf(x); }
  SEGTAPE_HD static double exp(double x) { return ::exp(x); }
  SEGTAPE_HD static float log(float x) { return ::logf(x); }
  SEGTAPE_HD static double log(double x) { return ::log(x); }
  SEGTAPE_HD static float log1p(float x) { return ::log1pf(x); }
  SEGTAPE_HD static double log1p(double x) { return ::log1p(x); }
  SEGTAPE_HD static float tanh(float x) { return ::tanhf(x); }
  SEGTAPE_HD static double tanh(double x) { return ::tanh(x); }
  template <class T> SEGTAPE_HD static T sigmoid(T x) { return T(1) / (T(1) + exp(-x)); }
};

}  // namespace segtape::ops
