#include "segtape/nn/optim.h"

#include <cmath>
#include <cstring>

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
  for (const auto& [name, p] : params_) std::memset(p.grad, 0, p.nbytes());
}

void Optimizer::set_step_count(int64_t n) {
  if (n < 0) throw Error("nn optimizer: step count must be >= 0, got " + std::to_string(n));
  steps_ = n;
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

template <class F>
void dispatch(const Tensor& p, F&& f) {
  if (p.dtype == DType::F64) f.template operator()<double>();
  else f.template operator()<float>();
}

}  // namespace

// ---- SGD

SGD::SGD(std::vector<NamedTensor> params, SGDOptions o) : Optimizer(std::move(params)), o_(o) {
  require(o.lr >= 0, "SGD", "lr " + std::to_string(o.lr) + " < 0");
  require(o.momentum >= 0, "SGD", "momentum " + std::to_string(o.momentum) + " < 0");
  require(o.weight_decay >= 0, "SGD", "weight_decay " + std::to_string(o.weight_decay) + " < 0");
  require(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD",
          "Nesterov momentum requires a momentum and zero dampening");
  if (o.momentum != 0)
    for (size_t i = 0; i < params_.size(); ++i) buf_.push_back(add_state("momentum_buffer", i));
}

void SGD::step() {
  // PyTorch creates the buffer as a clone of the first step's gradient.
  const bool first = steps_ == 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    const Tensor& pt = params_[k].second;
    dispatch(pt, [&]<class T>() {
      T* p = static_cast<T*>(pt.ptr);
      const T* g = static_cast<const T*>(pt.grad);
      T* buf = o_.momentum != 0 ? static_cast<T*>(buf_[k].ptr) : nullptr;
      // Scalars rounded to T once, as PyTorch's kernels take them.
      const T wd = T(o_.weight_decay), mom = T(o_.momentum), keep = T(1 - o_.dampening), neg_lr = T(-o_.lr);
      for (int64_t i = 0, n = pt.numel(); i < n; ++i) {
        T d = g[i];
        if (o_.weight_decay != 0) d = d + wd * p[i];
        if (buf) {
          buf[i] = first ? d : buf[i] * mom + keep * d;
          d = o_.nesterov ? d + mom * buf[i] : buf[i];
        }
        p[i] = p[i] + neg_lr * d;
      }
    });
  }
  ++steps_;
}

// ---- Adam / AdamW

Adam::Adam(std::vector<NamedTensor> params, AdamOptions o, bool decoupled)
    : Optimizer(std::move(params)), o_(o), decoupled_(decoupled) {
  const char* me = decoupled ? "AdamW" : "Adam";
  require(o.lr >= 0, me, "lr " + std::to_string(o.lr) + " < 0");
  require(o.eps >= 0, me, "eps " + std::to_string(o.eps) + " < 0");
  require(o.beta1 >= 0 && o.beta1 < 1, me, "beta1 " + std::to_string(o.beta1) + " outside [0, 1)");
  require(o.beta2 >= 0 && o.beta2 < 1, me, "beta2 " + std::to_string(o.beta2) + " outside [0, 1)");
  require(o.weight_decay >= 0, me, "weight_decay " + std::to_string(o.weight_decay) + " < 0");
  for (size_t i = 0; i < params_.size(); ++i) m_.push_back(add_state("exp_avg", i));
  for (size_t i = 0; i < params_.size(); ++i) v_.push_back(add_state("exp_avg_sq", i));
}

void Adam::step() {
  ++steps_;
  // Bias corrections in double, as PyTorch computes them on Python floats.
  const double t = double(steps_);
  const double bc1 = 1 - std::pow(o_.beta1, t), bc2 = 1 - std::pow(o_.beta2, t);
  const double step_size = o_.lr / bc1, bc2_sqrt = std::sqrt(bc2);
  for (size_t k = 0; k < params_.size(); ++k) {
    const Tensor& pt = params_[k].second;
    dispatch(pt, [&]<class T>() {
      T* p = static_cast<T*>(pt.ptr);
      const T* g = static_cast<const T*>(pt.grad);
      T* m = static_cast<T*>(m_[k].ptr);
      T* v = static_cast<T*>(v_[k].ptr);
      const T decay = T(1 - o_.lr * o_.weight_decay), wd = T(o_.weight_decay);
      const T b1 = T(o_.beta1), b2 = T(o_.beta2), c1 = T(1 - o_.beta1), c2 = T(1 - o_.beta2);
      const T s2 = T(bc2_sqrt), eps = T(o_.eps), neg_step = T(-step_size);
      const bool coupled = !decoupled_ && o_.weight_decay != 0;
      for (int64_t i = 0, n = pt.numel(); i < n; ++i) {
        if (decoupled_) p[i] = p[i] * decay;  // param.mul_(1 - lr * weight_decay)
        T d = g[i];
        if (coupled) d = d + wd * p[i];         // grad.add(param, alpha=weight_decay)
        m[i] = m[i] * b1 + c1 * d;              // exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        v[i] = v[i] * b2 + c2 * d * d;          // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        const T denom = std::sqrt(v[i]) / s2 + eps;  // (exp_avg_sq.sqrt() / sqrt(bc2)).add_(eps)
        p[i] = p[i] + neg_step * m[i] / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
      }
    });
  }
}

// ---- clip_grad_norm

namespace {

double grad_sq(const Tensor& p) {
  double s = 0;
  dispatch(p, [&]<class T>() {
    const T* g = static_cast<const T*>(p.grad);
    for (int64_t i = 0, n = p.numel(); i < n; ++i) s += double(g[i]) * double(g[i]);
  });
  return s;
}

void scale_grad(const Tensor& p, double c) {
  dispatch(p, [&]<class T>() {
    T* g = static_cast<T*>(p.grad);
    const T k = T(c);
    for (int64_t i = 0, n = p.numel(); i < n; ++i) g[i] = g[i] * k;
  });
}

void check_param(const Tensor& p) {
  if (!p.defined() || !p.grad) throw Error("nn::clip_grad_norm: " + (p.defined() ? p.describe() : std::string("an undefined tensor")) + " has no gradient buffer (not a parameter)");
}

// Visits a module's parameters without building a list (no allocation).
template <class F>
void for_each_param(const Module& m, F&& f) {
  for (const auto& [n, p] : m.own_parameters()) f(p);
  for (const auto& [n, c] : m.children()) for_each_param(*c, f);
}

// clip_coef = max_norm / (total + 1e-6), clamped to 1. PyTorch multiplies
// unconditionally; by 1.0 that changes nothing, and a NaN coefficient (from a
// non-finite norm) still propagates into the gradients as it does there.
bool must_scale(double coef) { return !(coef >= 1.0); }

}  // namespace

double clip_grad_norm(std::span<const Tensor> params, double max_norm) {
  double sq = 0;
  for (const Tensor& p : params) check_param(p), sq += grad_sq(p);
  const double total = std::sqrt(sq), coef = max_norm / (total + 1e-6);
  if (must_scale(coef))
    for (const Tensor& p : params) scale_grad(p, coef);
  return total;
}

double clip_grad_norm(const Module& m, double max_norm) {
  double sq = 0;
  for_each_param(m, [&](const Tensor& p) { sq += grad_sq(p); });
  const double total = std::sqrt(sq), coef = max_norm / (total + 1e-6);
  if (must_scale(coef)) for_each_param(m, [&](const Tensor& p) { scale_grad(p, coef); });
  return total;
}

}  // namespace segtape::nn
