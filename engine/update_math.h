// Engine-internal: the per-element arithmetic of segtape/update.h, written
// once and compiled twice: by the CPU loops (update.cpp) and by the CUDA
// kernels (engine/cuda/kernels.cu, nvcc, C++17; hence no C++20 here). The
// scalars are rounded to the element type once, on the host, as PyTorch's
// kernels take them; the bias corrections are computed in double, as PyTorch
// computes them on Python floats.
#pragma once
#include <cmath>
#include <cstdint>

#include "hd.h"

namespace segtape::detail {

template <class T>
struct SgdScalars {
  T wd, mom, keep, neg_lr;
  bool decay, momentum, nesterov, first;
};

template <class T>
SgdScalars<T> sgd_scalars(double lr, double momentum, double dampening, double weight_decay, bool nesterov, bool first,
                          bool has_buffer) {
  return {T(weight_decay), T(momentum),  T(1 - dampening), T(-lr), weight_decay != 0,
          has_buffer,      nesterov, first};
}

template <class T>
SEGTAPE_HD void sgd_element(T& p, T g, T* buf, const SgdScalars<T>& s) {
  T d = g;
  if (s.decay) d = d + s.wd * p;
  if (s.momentum) {
    *buf = s.first ? d : *buf * s.mom + s.keep * d;
    d = s.nesterov ? d + s.mom * *buf : *buf;
  }
  p = p + s.neg_lr * d;
}

template <class T>
struct AdamScalars {
  T decay, wd, b1, b2, c1, c2, s2, eps, neg_step;
  bool decoupled, coupled;
};

// The bias corrections' double arithmetic, rounded the same way on the host
// and on the device, so that the capturable adam_step (its scalars computed
// by every thread from the step tensor) equals the one given the count from
// the host bit for bit: each product rounded on its own (nvcc, and g++ where
// the target has FMA, would otherwise fuse a product into the subtraction
// that follows it), and beta^t by squaring, the same multiplications in both
// places (CUDA's pow and the C library's may differ in the last bit).
SEGTAPE_HD double update_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  volatile double r = a * b;  // (stored: not fused into what follows)
  return r;
#endif
}
// a^t for a whole t >= 0 (a step count), by squaring: within a few units in
// the last place of the correctly rounded power for any count a run reaches.
SEGTAPE_HD double update_pow(double a, double t) {
  double r = 1, base = a;
  for (uint64_t n = uint64_t(t); n; n >>= 1) {
    if (n & 1) r = update_mul(r, base);
    if (n > 1) base = update_mul(base, base);
  }
  return r;
}
SEGTAPE_HD double update_sqrt_d(double x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// t: the step count (>= 1). On the host for adam_step(..., int64_t step); on
// the device, from the step tensor, for the capturable adam_step(..., const
// Tensor& step): the same double arithmetic in both places.
template <class T>
SEGTAPE_HD AdamScalars<T> adam_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                       bool decoupled, double t) {
  const double bc1 = 1 - update_pow(beta1, t), bc2 = 1 - update_pow(beta2, t);
  return {T(1 - update_mul(lr, weight_decay)), T(weight_decay), T(beta1), T(beta2), T(1 - beta1), T(1 - beta2),
          T(update_sqrt_d(bc2)),    T(eps),          T(-(lr / bc1)),
          decoupled,                !decoupled && weight_decay != 0};
}

template <class T>
SEGTAPE_HD T update_sqrt(T x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return sqrtf(x);
  else return sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// clip_grad_norm's coefficient from the sum of squares (torch's
// max_norm / (total + 1e-6)); scale by it only where !(c >= 1).
SEGTAPE_HD double clip_coefficient(double sum_sq, double max_norm) { return max_norm / (update_sqrt_d(sum_sq) + 1e-6); }

template <class T>
SEGTAPE_HD void adam_element(T& p, T g, T& m, T& v, const AdamScalars<T>& s) {
  if (s.decoupled) p = p * s.decay;       // param.mul_(1 - lr * weight_decay)
  T d = g;
  if (s.coupled) d = d + s.wd * p;        // grad.add(param, alpha=weight_decay)
  m = m * s.b1 + s.c1 * d;                // exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
  v = v * s.b2 + s.c2 * d * d;            // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
  const T denom = update_sqrt(v) / s.s2 + s.eps;  // (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps)
  p = p + s.neg_step * m / denom;         // param.addcdiv_(exp_avg, denom, value=-step_size)
}

}  // namespace segtape::detail
