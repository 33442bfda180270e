// Optimizers and gradient clipping with PyTorch 1.13's exact update
// arithmetic (the single-tensor, non-foreach path; docs/nn.md spells it out).
// State (momentum buffers, moments) lives in the tape's persistent pool and is
// allocated at construction: step() performs no allocation of any kind.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "segtape/nn/module.h"
#include "segtape/update.h"

namespace segtape::nn {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  virtual const char* kind() const = 0;  // "SGD", "Adam", "AdamW"
  void zero_grad();                      // the gradients of this optimizer's parameters

  const std::vector<NamedTensor>& params() const { return params_; }
  // Every state tensor, named "<kind of state>.<parameter name>", e.g.
  // "exp_avg.head.weight" (checkpoints save and restore these by name).
  const std::vector<NamedTensor>& state() const { return state_; }
  // Steps taken (PyTorch's per-parameter state["step"]; all parameters step together here).
  int64_t step_count() const { return steps_; }
  void set_step_count(int64_t n);
  // The most steps a count may hold (a loaded one too): doubles count them
  // exactly (Adam's bias corrections), and ++ never reaches int64's end.
  static constexpr int64_t kMaxSteps = int64_t(1) << 53;

 protected:
  // Parameters must be distinct parameters (persistent, with a gradient) of one tape.
  explicit Optimizer(std::vector<NamedTensor> params);
  // A zero persistent tensor like parameter i, registered as "<what>.<name of i>".
  Tensor add_state(const char* what, size_t i);

  std::vector<NamedTensor> params_;
  std::vector<NamedTensor> state_;
  int64_t steps_ = 0;
  bool steps_set_ = false;  // set_step_count was called (Adam's capturable count is rewritten at its next step)
};

// Parameters named by position ("0", "1", ...), as in PyTorch's optimizer state_dict.
std::vector<NamedTensor> numbered(std::span<const Tensor> params);

// lr, momentum, dampening, weight_decay, nesterov (segtape/update.h).
using SGDOptions = segtape::SgdOptions;

// g = grad + wd * p; with momentum: buf = g (first step) or momentum * buf + (1 - dampening) * g,
// g = nesterov ? g + momentum * buf : buf; then p -= lr * g.
class SGD : public Optimizer {
 public:
  SGD(std::vector<NamedTensor> params, SGDOptions o);
  SGD(const Module& m, SGDOptions o) : SGD(m.named_parameters(), o) {}
  void step() override;
  const char* kind() const override { return "SGD"; }
  SGDOptions& options() { return o_; }  // e.g. a learning-rate schedule sets options().lr
  const SGDOptions& options() const { return o_; }

 private:
  SGDOptions o_;
  std::vector<Tensor> buf_;  // momentum buffers (empty without momentum)
};

// lr, beta1, beta2, eps, weight_decay (segtape/update.h): Adam's and AdamW's
// options, one definition with PyTorch's defaults (weight_decay 0 for Adam,
// 1e-2 for AdamW).
using segtape::AdamOptions;
using AdamWOptions = segtape::AdamOptionsFor<segtape::AdamWDefaults>;  // the same fields, weight_decay = 1e-2 by default

// Adam: g = grad + wd * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// With options().capturable, t lives on the parameters' device: step()
// advances it there (add_scalar) and every update reads it there, so each
// step issues the same device calls and can be captured in a CUDA-graph
// segment (as long as lr and the other options stay fixed). The host's
// step_count() is kept as well; set_step_count() reaches the device at the
// next step(), which writes the count whole (one call whose value differs).
// A graph segment that did not run (its replay error) leaves every value it
// would have written undefined, the device's count included: call
// set_step_count(step_count()) before going on. capturable must be set at
// construction (step() allocates nothing).
class Adam : public Optimizer {
 public:
  Adam(std::vector<NamedTensor> params, AdamOptions o) : Adam(std::move(params), o, false) {}
  Adam(const Module& m, AdamOptions o) : Adam(m.named_parameters(), o, false) {}
  void step() override;
  const char* kind() const override { return decoupled_ ? "AdamW" : "Adam"; }
  AdamOptions& options() { return o_; }
  const AdamOptions& options() const { return o_; }

 protected:
  Adam(std::vector<NamedTensor> params, AdamOptions o, bool decoupled);

 private:
  AdamOptions o_;
  bool decoupled_;
  std::vector<Tensor> m_, v_;  // exp_avg, exp_avg_sq
  // options().capturable: the step count on the parameters' device (a
  // persistent float64 [1], zero when made; rewritten after set_step_count).
  Tensor device_step_;
};

// AdamW: p *= 1 - lr * wd (decoupled decay), then Adam's update with g = grad.
class AdamW : public Adam {
 public:
  AdamW(std::vector<NamedTensor> params, AdamWOptions o) : Adam(std::move(params), o, true) {}
  AdamW(const Module& m, AdamWOptions o) : Adam(m.named_parameters(), o, true) {}
};

// torch.nn.utils.clip_grad_norm_ (L2): returns the total norm of all the
// gradients together and multiplies them by min(1, max_norm / (total + 1e-6)).
double clip_grad_norm(std::span<const Tensor> params, double max_norm);
double clip_grad_norm(const Module& m, double max_norm);
// Its two halves, as PyTorch's get_total_norm and clip_grads_with_norm_: the
// total L2 norm of the gradients, leaving them as they are (a caller checks
// it, e.g. for being finite, before anything is scaled), then the scaling by
// min(1, max_norm / (total + 1e-6)) with that norm. The two together are
// clip_grad_norm, bit for bit.
double grad_norm(const Module& m);
void clip_grads_with_norm(const Module& m, double max_norm, double total);
// The first parameter (named_parameters' order) whose gradient holds a value
// that is not finite, with its shape ("rnn.weight_hh [384, 128]"); "" when none.
std::string first_non_finite_grad(const Module& m);
// The same clip with no value returning to the host (PyTorch's
// clip_grad_norm_ with foreach keeps its norm on the device too): the total
// norm's square goes to `total_sq`, a persistent float64 [1] tensor of the
// parameters' tape (make it once: tape.persistent({1}, DType::F64)), where
// it stays; the gradients are scaled where they live. The same gradients as
// the form above (bit for bit on the CPU); on CUDA it issues the same device
// calls every time, so it can run inside a CUDA-graph segment.
void clip_grad_norm(std::span<const Tensor> params, double max_norm, const Tensor& total_sq);
void clip_grad_norm(const Module& m, double max_norm, const Tensor& total_sq);
// grad_norm's form with no value returning to the host: the norm's square
// into `total_sq` (the first half of the clip above, without the scaling).
void grad_squares(const Module& m, const Tensor& total_sq);

}  // namespace segtape::nn
