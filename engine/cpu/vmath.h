// Branch-free exp / sigmoid / tanh that the compiler vectorizes. float uses a
// Cephes-style polynomial (range reduction by ln 2, degree-6 polynomial,
// exponent by bit manipulation; relative error ~2e-7, within float rounding);
// double keeps the C library's functions, so gradient checks in float64 stay
// exact to the last bits.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace segtape::cpu {

inline float exp_fast(float x) {
  // Below ln(FLT_MIN) (-87.3365) the result would be subnormal (expf's are
  // under 1.2e-38): 0 there, as a flush-to-zero unit gives, so exp(-inf) is
  // 0 (it was e^-87 ~ 1.6e-38, the clamp's). The choice is a bit mask (NaN
  // passes through it unchanged), which vectorizes. Above ~88.7 the exponent
  // field reaches 255: the result is +Inf, as expf's. A NaN is computed as
  // the clamp's low end (converting a NaN to an int is undefined) and comes
  // out NaN through its own mask.
  const uint32_t keep = uint32_t(0) - uint32_t(!(x < -87.33654f));
  const uint32_t nan = (uint32_t(0) - uint32_t(x != x)) & 0x7fc00000u;
  x = x > -87.33654f ? x : -87.33654f;
  x = x < 89.0f ? x : 89.0f;
  // n = round(x / ln 2), halves away from zero, by truncating conversion
  // (std::floor would block vectorization). copysign is two bit operations;
  // the same choice written `t >= 0 ? 0.5f : -0.5f` became compares and
  // blends on both sides (1.1-1.5 ns per element on AVX2, against about
  // 0.9), with the same bits for every float input.
  const float t = x * 1.44269504088896341f;
  const int32_t ni = int32_t(t + std::copysign(0.5f, t));
  const float n = float(ni);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // x - n ln2, ln2 split in two
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return std::bit_cast<float>((std::bit_cast<uint32_t>(p * std::bit_cast<float>((ni + 127) << 23)) & keep) | nan);
}

template <class T>
inline T vexp(T x) {
  if constexpr (sizeof(T) == 4) return exp_fast(x);
  else return std::exp(x);
}
template <class T>
inline T vsigmoid(T x) {
  return T(1) / (T(1) + vexp<T>(-x));
}
template <class T>
inline T vtanh(T x) {
  if constexpr (sizeof(T) == 4) {
    // tanh x = 1 - 2 / (e^{2x} + 1); for |x| < 2^-6 the series x - x^3/3 avoids cancellation.
    // The series is taken at x clamped to [-1, 1], which leaves it unchanged
    // where it is used and finite elsewhere (unclamped, x^3 overflowed for
    // |x| >= ~7e12 and the old arithmetic blend, 0 * inf, gave NaN), with
    // x's sign (x - x^3/3 is +0 at x = -0; tanh(-0) is -0). The choice is a
    // bit select on a 0 / all-ones mask: it vectorizes, unlike `?:` here.
    const T big = T(1) - T(2) / (exp_fast(T(2) * x) + T(1));
    const T xc = std::min(std::max(x, T(-1)), T(1));
    const T small = std::copysign(xc - xc * xc * xc * T(1.0 / 3.0), x);
    const uint32_t keep = uint32_t(0) - uint32_t(std::fabs(x) < T(0.015625));  // all ones where the series is used
    return std::bit_cast<T>((std::bit_cast<uint32_t>(small) & keep) | (std::bit_cast<uint32_t>(big) & ~keep));
  } else {
    return std::tanh(x);
  }
}

// A row's maximum m and sum of exp(x - m): the stable log-sum-exp m + log(sum)
// of softmax, log-softmax and cross-entropy rows (CUDA's is a block
// reduction over the same terms: row_exp in cuda/kernels.cu).
template <class T>
struct RowExp {
  T m, sum;
};
template <class T>
inline RowExp<T> row_exp(const T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t c = 0; c < n; ++c) m = std::max(m, x[c]);
  T s = 0;
  for (int64_t c = 0; c < n; ++c) s += vexp<T>(x[c] - m);
  return {m, s};
}

// The CPU's math for the op formulas of ops/elementwise.h (M in a formula).
struct Math {
  template <class T> static T exp(T x) { return vexp<T>(x); }
  template <class T> static T sigmoid(T x) { return vsigmoid<T>(x); }
  template <class T> static T tanh(T x) { return vtanh<T>(x); }
  template <class T> static T log(T x) { return std::log(x); }
  template <class T> static T log1p(T x) { return std::log1p(x); }
};

}  // namespace segtape::cpu
