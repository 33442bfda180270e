// Shared helpers for the test suites: seeded random tensors, finite
// differences, relative errors, and a GRU cell composed from primitive ops.
#pragma once
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "segtape/ops.h"

namespace segtape::test {

// The message of the E that f throws (a test failure, and "", when it throws none).
template <class E, class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

inline void fill_uniform(const Tensor& t, std::mt19937& rng, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  if (t.dtype == DType::F64)
    for (double& v : t.span<double>()) v = u(rng);
  else
    for (float& v : t.span<float>()) v = float(u(rng));
}

inline std::vector<double> values(const Tensor& t) {
  std::vector<double> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype == DType::F64 ? t.data<const double>()[i] : double(t.data<const float>()[i]);
  return v;
}

// ||a - b|| / max(||a||, ||b||): 0 when both are zero.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  const double den = std::sqrt(std::max(na, nb));
  return den == 0 ? std::sqrt(d) : std::sqrt(d) / den;
}

// PyTorch's GRUCell written with primitive ops (the reference for the fused op).
inline Tensor gru_composed(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                           const Tensor& b_hh) {
  const int64_t H = h.dim(1);
  Tensor gi = add(matmul(x, w_ih, false, true), b_ih);
  Tensor gh = add(matmul(h, w_hh, false, true), b_hh);
  Tensor r = sigmoid(add(slice(gi, 1, 0, H), slice(gh, 1, 0, H)));
  Tensor z = sigmoid(add(slice(gi, 1, H, H), slice(gh, 1, H, H)));
  Tensor n = tanh(add(slice(gi, 1, 2 * H, H), mul(r, slice(gh, 1, 2 * H, H))));
  return add(n, mul(z, sub(h, n)));  // (1 - z) * n + z * h
}

// PyTorch's LSTMCell composed of primitive ops: state [2, B, H] (h, c) -> [2, B, H] (h', c').
inline Tensor lstm_composed(const Tensor& x, const Tensor& state, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                            const Tensor& b_hh) {
  const int64_t B = state.dim(1), H = state.dim(2);
  Tensor h = reshape(slice(state, 0, 0, 1), {B, H}), c = reshape(slice(state, 0, 1, 1), {B, H});
  Tensor gates = add(add(matmul(x, w_ih, false, true), b_ih), add(matmul(h, w_hh, false, true), b_hh));
  Tensor i = sigmoid(slice(gates, 1, 0, H)), f = sigmoid(slice(gates, 1, H, H));
  Tensor g = tanh(slice(gates, 1, 2 * H, H)), o = sigmoid(slice(gates, 1, 3 * H, H));
  Tensor c1 = add(mul(f, c), mul(i, g));
  Tensor h1 = mul(o, tanh(c1));
  return concat({reshape(h1, {1, B, H}), reshape(c1, {1, B, H})}, 0);
}

// Central finite difference of f() with respect to every element of p (float64).
inline std::vector<double> numeric_grad(const Tensor& p, const std::function<double()>& f, double eps = 1e-6) {
  std::vector<double> g(size_t(p.numel()));
  double* v = p.data<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + eps;
    const double up = f();
    v[i] = keep - eps;
    const double down = f();
    v[i] = keep;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

}  // namespace segtape::test
