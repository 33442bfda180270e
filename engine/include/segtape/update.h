// In-place parameter updates that run where the tensors live: plain loops on
// the CPU, kernels on the tape's stream on CUDA. They are not recorded (no
// node, no gradient) and act on persistent tensors: parameters, their
// gradient buffers and optimizer state. nn's optimizers and clip_grad_norm
// are built on them; the arithmetic is PyTorch 1.13's (docs/nn.md).
//
// None of them allocates. Only grad_squared_norm returns a value to the host,
// so on CUDA it waits for the device; the others are asynchronous there.
#pragma once
#include <cstdint>

#include "segtape/tensor.h"

namespace segtape {

// The optimizers' options, with PyTorch's defaults (nn::SGDOptions,
// nn::AdamOptions and nn::AdamWOptions are these).
struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};
// Adam's and AdamW's options: one definition, whose weight_decay defaults to
// Defaults::weight_decay (PyTorch's: 0 for Adam, 1e-2 for AdamW); each
// converts to the other field for field.
struct AdamDefaults {
  static constexpr double weight_decay = 0;
};
struct AdamWDefaults {
  static constexpr double weight_decay = 1e-2;
};
template <class Defaults>
struct AdamOptionsFor {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = Defaults::weight_decay;
  // nn::Adam keeps its step count on the parameters' device and updates it
  // there (PyTorch's capturable): an optimizer step in a CUDA-graph segment
  // then replays. Off: the count is passed from the host, as PyTorch's default.
  bool capturable = false;
  template <class D>
  operator AdamOptionsFor<D>() const {
    return {lr, beta1, beta2, eps, weight_decay, capturable};
  }
};
using AdamOptions = AdamOptionsFor<AdamDefaults>;

// g = grad + wd p; with a momentum buffer: buf = g (first) or momentum buf + (1 - dampening) g,
// g = nesterov ? g + momentum buf : buf; then p -= lr g. momentum_buffer: undefined without momentum.
// first: the first step (the momentum buffer becomes the gradient: PyTorch's clone).
void sgd_step(const Tensor& param, const Tensor& momentum_buffer, const SgdOptions& o, bool first);

// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), t = step (>= 1).
// decoupled (AdamW): p *= 1 - lr wd first, and the gradient is not decayed.
void adam_step(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamOptions& o, bool decoupled,
               int64_t step);
// The same update with the step count t read where the tensors live
// (PyTorch's capturable=True): `step` is a persistent one-element float64
// tensor of the parameter's tape holding t >= 1 (advance it with
// add_scalar(step, 1)). On CUDA the bias corrections are then computed on
// the device, so the call repeats its signature from step to step and an
// update inside a CUDA-graph segment replays (docs/cuda.md). The results
// equal the other form's for the same t (the same double arithmetic; on
// CUDA, the device's pow and sqrt).
void adam_step(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamOptions& o, bool decoupled,
               const Tensor& step);

// t += value, or t = value, element-wise, where t lives: a persistent
// floating tensor (optimizer state, e.g. adam_step's step count); not recorded.
void add_scalar(const Tensor& t, double value);
void fill_value(const Tensor& t, double value);

// The parameter's gradient buffer: set to zero, scaled, or its sum of squares
// (accumulated in double; on CUDA this waits for the device).
void zero_grad(const Tensor& param);
void scale_grad(const Tensor& param, double factor);
double grad_squared_norm(const Tensor& param);

// clip_grad_norm's two halves without a value returning to the host (the
// capturable form, nn::clip_grad_norm(params, max_norm, total)). acc is a
// persistent float64 [1] tensor of the parameter's tape:
// acc = (first ? 0 : acc) + the parameter's gradient sum of squares (in double,
// as grad_squared_norm), computed where they live; then
// grad *= max_norm / (sqrt(acc) + 1e-6) where that is below 1 (or NaN), read there.
void add_grad_squares(const Tensor& param, const Tensor& acc, bool first);
void clip_grad(const Tensor& param, const Tensor& acc, double max_norm);

}  // namespace segtape
