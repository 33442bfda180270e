#include "segtape/nn/optim.h"

#include <cmath>

#include "segtape/update.h"

namespace segtape::nn {

// ---- Optimizer

Optimizer::Optimizer(std::vector<NamedTensor> params) : params_(std::move(params)) {
  if (params_.empty()) throw Error("nn optimizer: got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, p] = params_[i];
    if (!p.defined() || p.space != Space::Persistent || !p.requires_grad || !p.grad)
      throw Error("nn optimizer: '" + name + "' (" + (p.defined() ? p.describe() : "undefined") +
                  ") is not a parameter: make it with tape.parameter() or Module::register_parameter()");
    if (p.tape != params_[0].second.tape) throw Error("nn optimizer: '" + name + "' belongs to another tape");
    for (size_t j = 0; j < i; ++j) {
      if (params_[j].second.ptr == p.ptr)
        throw Error("nn optimizer: parameter '" + name + "' is given twice (also as '" + params_[j].first + "')");
      if (params_[j].first == name) throw Error("nn optimizer: two parameters are named '" + name + "'");
    }
  }
}

Tensor Optimizer::add_state(const char* what, size_t i) {
  const Tensor& p = params_[i].second;
  Tensor s = p.tape->persistent(p.shape, p.dtype);
  state_.emplace_back(std::string(what) + "." + params_[i].first, s);
  return s;
}

void Optimizer::zero_grad() {
  for (const auto& [name, p] : params_) segtape::zero_grad(p);
}

void Optimizer::set_step_count(int64_t n) {
  if (n < 0 || n > kMaxSteps) throw Error("nn optimizer: step count must be in [0, 2^53], got " + std::to_string(n));
  steps_ = n;
  steps_set_ = true;
}

std::vector<NamedTensor> numbered(std::span<const Tensor> params) {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < params.size(); ++i) out.emplace_back(std::to_string(i), params[i]);
  return out;
}

namespace {

void require(bool ok, const char* opt, const std::string& what) {
  if (!ok) throw Error(std::string("nn::") + opt + ": invalid option: " + what);
}

}  // namespace

// ---- SGD

// Checked at construction and again at every step(): options() is writable
// (a schedule sets lr), and a NaN or negative value there would reach every
// parameter. The messages are built only on failure (step() allocates nothing).
static void check_options(const SGDOptions& o) {
  const auto number = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!number(o.lr)) require(false, "SGD", "lr " + std::to_string(o.lr) + " is not a finite number >= 0");
  if (!number(o.momentum)) require(false, "SGD", "momentum " + std::to_string(o.momentum) + " is not a finite number >= 0");
  if (!number(o.weight_decay))
    require(false, "SGD", "weight_decay " + std::to_string(o.weight_decay) + " is not a finite number >= 0");
  if (!std::isfinite(o.dampening)) require(false, "SGD", "dampening " + std::to_string(o.dampening) + " is not finite");
  if (o.nesterov && !(o.momentum > 0 && o.dampening == 0))
    require(false, "SGD", "Nesterov momentum requires a momentum and zero dampening");
}

static void check_options(const AdamOptions& o, const char* me) {
  const auto number = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!number(o.lr)) require(false, me, "lr " + std::to_string(o.lr) + " is not a finite number >= 0");
  if (!number(o.eps)) require(false, me, "eps " + std::to_string(o.eps) + " is not a finite number >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) require(false, me, "beta1 " + std::to_string(o.beta1) + " outside [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) require(false, me, "beta2 " + std::to_string(o.beta2) + " outside [0, 1)");
  if (!number(o.weight_decay))
    require(false, me, "weight_decay " + std::to_string(o.weight_decay) + " is not a finite number >= 0");
}

SGD::SGD(std::vector<NamedTensor> params, SGDOptions o) : Optimizer(std::move(params)), o_(o) {
  check_options(o);
  if (o.momentum != 0)
    for (size_t i = 0; i < params_.size(); ++i) buf_.push_back(add_state("momentum_buffer", i));
}

void SGD::step() {
  check_options(o_);
  if (o_.momentum != 0 && buf_.empty() && !params_.empty())
    throw Error("SGD: options().momentum was switched on after construction (it has no momentum buffers): construct the "
                "optimizer with momentum");
  // PyTorch creates the buffer as a clone of the first step's gradient.
  for (size_t k = 0; k < params_.size(); ++k) sgd_step(params_[k].second, buf_.empty() ? Tensor{} : buf_[k], o_, steps_ == 0);
  ++steps_;
}

// ---- Adam / AdamW

Adam::Adam(std::vector<NamedTensor> params, AdamOptions o, bool decoupled)
    : Optimizer(std::move(params)), o_(o), decoupled_(decoupled) {
  check_options(o, decoupled ? "AdamW" : "Adam");
  for (size_t i = 0; i < params_.size(); ++i) m_.push_back(add_state("exp_avg", i));
  for (size_t i = 0; i < params_.size(); ++i) v_.push_back(add_state("exp_avg_sq", i));
  if (o.capturable && !params_.empty()) device_step_ = params_[0].second.tape->persistent({1}, DType::F64);
}

void Adam::step() {
  check_options(o_, decoupled_ ? "AdamW" : "Adam");
  // (refused before the count moves: a refused step counted, and every later
  // bias correction and checkpoint with it)
  if (o_.capturable && !params_.empty() && !device_step_.defined())  // step() allocates nothing: the constructor makes the count
    throw Error(std::string(kind()) + ": options().capturable was switched on after construction: construct the "
                "optimizer with capturable = true");
  ++steps_;
  if (!o_.capturable || params_.empty()) {
    for (size_t k = 0; k < params_.size(); ++k) adam_step(params_[k].second, m_[k], v_[k], o_, decoupled_, steps_);
    return;
  }
  if (steps_set_) {  // after set_step_count: the count on the device is written whole
    fill_value(device_step_, double(steps_ - 1));
    steps_set_ = false;
  }
  add_scalar(device_step_, 1);
  for (size_t k = 0; k < params_.size(); ++k) adam_step(params_[k].second, m_[k], v_[k], o_, decoupled_, device_step_);
}

// ---- clip_grad_norm

namespace {

void check_param(const Tensor& p) {
  if (!p.defined() || !p.grad) throw Error("nn::clip_grad_norm: " + (p.defined() ? p.describe() : std::string("an undefined tensor")) + " has no gradient buffer (not a parameter)");
}

// Visits a module's parameters without building a list (no allocation).
template <class F>
void for_each_param(const Module& m, F&& f) {
  m.walk([&](const Module& x, const std::string&) {
    for (const auto& [n, p] : x.own_parameters()) f(p);
  }, false);
}

// clip_coef = max_norm / (total + 1e-6), clamped to 1. PyTorch multiplies
// unconditionally; by 1.0 that changes nothing, and a NaN coefficient (from a
// non-finite norm) still propagates into the gradients as it does there.
bool must_scale(double coef) { return !(coef >= 1.0); }

// A NaN max_norm made every gradient NaN, a negative one flipped their sign.
void check_max_norm(double max_norm) {
  if (!(max_norm >= 0) || std::isnan(max_norm))
    throw Error("nn::clip_grad_norm: max_norm " + std::to_string(max_norm) + " is not a number >= 0");
}

}  // namespace

double clip_grad_norm(std::span<const Tensor> params, double max_norm) {
  check_max_norm(max_norm);
  double sq = 0;
  for (const Tensor& p : params) check_param(p), sq += grad_squared_norm(p);
  const double total = std::sqrt(sq), coef = max_norm / (total + 1e-6);
  if (must_scale(coef))
    for (const Tensor& p : params) segtape::scale_grad(p, coef);
  return total;
}

void clip_grad_norm(std::span<const Tensor> params, double max_norm, const Tensor& total_sq) {
  check_max_norm(max_norm);
  bool first = true;
  for (const Tensor& p : params) check_param(p), add_grad_squares(p, total_sq, first), first = false;
  for (const Tensor& p : params) clip_grad(p, total_sq, max_norm);
}

void grad_squares(const Module& m, const Tensor& total_sq) {
  bool first = true;
  for_each_param(m, [&](const Tensor& p) { add_grad_squares(p, total_sq, first), first = false; });
}

void clip_grad_norm(const Module& m, double max_norm, const Tensor& total_sq) {
  check_max_norm(max_norm);
  grad_squares(m, total_sq);
  for_each_param(m, [&](const Tensor& p) { clip_grad(p, total_sq, max_norm); });
}

double clip_grad_norm(const Module& m, double max_norm) {
  check_max_norm(max_norm);
  const double total = grad_norm(m);
  clip_grads_with_norm(m, max_norm, total);
  return total;
}

double grad_norm(const Module& m) {
  double sq = 0;
  for_each_param(m, [&](const Tensor& p) { sq += grad_squared_norm(p); });
  return std::sqrt(sq);
}

void clip_grads_with_norm(const Module& m, double max_norm, double total) {
  check_max_norm(max_norm);
  const double coef = max_norm / (total + 1e-6);
  if (must_scale(coef)) for_each_param(m, [&](const Tensor& p) { segtape::scale_grad(p, coef); });
}

std::string first_non_finite_grad(const Module& m) {
  for (const auto& [name, p] : m.named_parameters())
    if (p.grad && !std::isfinite(grad_squared_norm(p))) return name + " " + p.shape.str();
  return "";
}

}  // namespace segtape::nn
