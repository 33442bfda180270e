// segtape/update.h: the checks, then the tape's backend (update_math.h's
// per-element arithmetic on every device).
#include "segtape/update.h"

#include <initializer_list>
#include <string>

#include "backend.h"
#include "ops/op.h"
#include "segtape/error.h"
#include "segtape/tape.h"
#include "tape_internals.h"

namespace segtape {

using In = detail::TapeInternals;
namespace {

// A parameter: a live persistent floating tensor with a gradient buffer.
// (Error strings are built only on failure: the checks allocate nothing.)
void check_param(const char* op, const Tensor& p) {
  if (!p.defined()) throw Error(std::string(op) + ": the parameter is an undefined tensor");
  p.check_live(op);
  if (p.space != Space::Persistent || !p.grad)
    throw Error(std::string(op) + ": " + p.describe() +
                " is not a parameter (no gradient buffer): make it with tape.parameter() or Module::register_parameter()");
  if (p.dtype == DType::I64) throw ShapeError(std::string(op) + ": " + p.describe() + " is an integer tensor");
}

// Optimizer state: persistent, like the parameter, on its tape.
void check_state(const char* op, const char* what, const Tensor& p, const Tensor& s) {
  if (!s.defined()) throw Error(std::string(op) + ": " + what + " is an undefined tensor");
  s.check_live(op);
  if (s.tape != p.tape) throw TapeError(std::string(op) + ": " + what + " belongs to another tape than the parameter");
  if (s.space != Space::Persistent || !(s.shape == p.shape) || s.dtype != p.dtype)
    throw ShapeError(std::string(op) + ": " + what + " " + s.describe() + " must be a persistent tensor like the parameter " +
                     p.describe());
  if (s.ptr == p.ptr || s.ptr == p.grad)
    throw Error(std::string(op) + ": " + what + " is the parameter's own " + (s.ptr == p.ptr ? "values" : "gradient") +
                ": optimizer state needs a tensor of its own");
}

// A float64 [1] scalar kept where the parameter lives (adam_step's step
// count, clip_grad's sum of squares).
void check_device_scalar(const char* op, const char* what, const Tensor& param, const Tensor& t) {
  if (!t.defined()) throw Error(std::string(op) + ": " + what + " is an undefined tensor");
  t.check_live(op);
  if (t.tape != param.tape) throw TapeError(std::string(op) + ": " + what + " belongs to another tape than the parameter");
  if (t.space != Space::Persistent || t.dtype != DType::F64 || t.numel() != 1)
    throw ShapeError(std::string(op) + ": " + what + " " + t.describe() + " must be a persistent float64 tensor of one element");
}

// Both adam_step forms: the parameter and its two moments.
void check_adam(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  check_param("adam_step", param);
  check_state("adam_step", "exp_avg", param, exp_avg);
  check_state("adam_step", "exp_avg_sq", param, exp_avg_sq);
  if (exp_avg.ptr == exp_avg_sq.ptr) throw Error("adam_step: exp_avg and exp_avg_sq are the same tensor");
}

// add_scalar / fill_value: optimizer state, a persistent floating tensor.
void check_state_scalar(const char* op, const Tensor& t) {
  if (!t.defined()) throw Error(std::string(op) + ": undefined tensor");
  t.check_live(op);
  if (t.space != Space::Persistent) throw Error(std::string(op) + ": " + t.describe() + " is not a persistent tensor");
  if (t.dtype == DType::I64) throw ShapeError(std::string(op) + ": " + t.describe() + " is an integer tensor");
}

// What an Adam step wrote: the parameter and its two moments (detail::tensor_written).
void adam_written(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  for (const Tensor* t : {&param, &exp_avg, &exp_avg_sq}) detail::tensor_written(*t, "adam_step");
}

}  // namespace

void sgd_step(const Tensor& param, const Tensor& momentum_buffer, const SgdOptions& s, bool first) {
  check_param("sgd_step", param);
  const bool has_buf = momentum_buffer.defined();
  if (has_buf) check_state("sgd_step", "the momentum buffer", param, momentum_buffer);
  if (s.momentum != 0 && !has_buf) throw Error("sgd_step: momentum " + std::to_string(s.momentum) + " needs a momentum buffer");
  if (s.momentum == 0 && has_buf) throw Error("sgd_step: a momentum buffer with momentum 0 (pass an undefined buffer)");
  void* buf = has_buf ? momentum_buffer.ptr : nullptr;
  In::backend(*param.tape)->sgd_step(param.dtype, param.numel(), param.ptr, param.grad, buf, s, first);
  detail::tensor_written(param, "sgd_step");  // a packed copy of the old values must not be used again
  if (has_buf) detail::tensor_written(momentum_buffer, "sgd_step");  // (optimizer state an op may read too)
}

void adam_step(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamOptions& s, bool decoupled,
               int64_t step) {
  check_adam(param, exp_avg, exp_avg_sq);
  if (step < 1) throw Error("adam_step: step must be >= 1, got " + std::to_string(step));
  In::backend(*param.tape)->adam_step(param.dtype, param.numel(), param.ptr, param.grad, exp_avg.ptr, exp_avg_sq.ptr, s, decoupled,
                                   step, nullptr);
  adam_written(param, exp_avg, exp_avg_sq);
}

void adam_step(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamOptions& s, bool decoupled,
               const Tensor& step) {
  check_adam(param, exp_avg, exp_avg_sq);
  check_device_scalar("adam_step", "the step count", param, step);
  In::backend(*param.tape)->adam_step(param.dtype, param.numel(), param.ptr, param.grad, exp_avg.ptr, exp_avg_sq.ptr, s, decoupled,
                                   0, static_cast<const double*>(step.ptr));
  adam_written(param, exp_avg, exp_avg_sq);
}

void add_scalar(const Tensor& t, double value) {
  check_state_scalar("add_scalar", t);
  In::backend(*t.tape)->add_scalar(t.ptr, t.numel(), t.dtype, value);
  detail::tensor_written(t, "add_scalar");
}

void fill_value(const Tensor& t, double value) {
  check_state_scalar("fill_value", t);
  In::backend(*t.tape)->fill(t.ptr, t.numel(), t.dtype, value);
  detail::tensor_written(t, "fill_value");
}

void zero_grad(const Tensor& param) {
  check_param("zero_grad", param);
  In::backend(*param.tape)->zero(param.grad, param.nbytes());
}

void scale_grad(const Tensor& param, double factor) {
  check_param("scale_grad", param);
  In::backend(*param.tape)->scale(param.grad, param.numel(), param.dtype, factor);
}

double grad_squared_norm(const Tensor& param) {
  check_param("grad_squared_norm", param);
  In::count_host_read(*param.tape);  // (a value returned to the host: TapeStats::host_reads)
  return In::backend(*param.tape)->sum_squares(param.grad, param.numel(), param.dtype);
}

void add_grad_squares(const Tensor& param, const Tensor& acc, bool first) {
  check_param("add_grad_squares", param);
  check_device_scalar("add_grad_squares", "the sum of squares", param, acc);
  In::backend(*param.tape)->add_sum_squares(param.grad, param.numel(), param.dtype, static_cast<double*>(acc.ptr), first);
}

void clip_grad(const Tensor& param, const Tensor& acc, double max_norm) {
  check_param("clip_grad", param);
  check_device_scalar("clip_grad", "the sum of squares", param, acc);
  In::backend(*param.tape)->clip_scale(param.grad, param.numel(), param.dtype, static_cast<const double*>(acc.ptr), max_norm);
}

}  // namespace segtape
