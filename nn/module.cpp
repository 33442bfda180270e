#include "segtape/nn/module.h"

#include "segtape/nn/safetensors.h"
#include "segtape/update.h"

namespace segtape::nn {

Module::Module(Tape& tape, DType dtype) : tape_(&tape), dtype_(dtype) {
  if (dtype == DType::I64) throw ShapeError("nn::Module: parameters are floating point (F32 or F64), got i64");
}

void Module::check_name(const std::string& name, const char* what) const {
  // state_dict names are joined with '.', so a '.' inside one would make the
  // dotted name ambiguous (PyTorch refuses it for the same reason).
  if (name.empty() || name.find('.') != std::string::npos)
    throw Error(std::string("nn::Module::") + what + ": name '" + name + "' must be non-empty and contain no '.'");
  if (safetensors::utf8_error(name) != std::string::npos)  // (it was accepted, and nn::save failed on the JSON header naming no parameter)
    throw Error(std::string("nn::Module::") + what + ": a name of " + std::to_string(name.size()) +
                " bytes is not valid UTF-8 (checkpoint headers are JSON)");
  if (!names_.contains(name)) return;
  for (const auto& [n, p] : params_)
    if (n == name) throw Error(std::string("nn::Module::") + what + ": '" + name + "' is already a parameter");
  throw Error(std::string("nn::Module::") + what + ": '" + name + "' is already a child module");
}

Tensor Module::register_parameter(const std::string& name, const Shape& shape) {
  check_name(name, "register_parameter");
  Tensor t = tape_->parameter(shape, dtype_);
  params_.emplace_back(name, t);
  names_.insert(name);
  return t;
}

void Module::add_child(const std::string& name, Module& child) {
  check_name(name, "register_module");
  if (&child == this) throw Error("nn::Module::register_module: '" + name + "' is the module itself");
  if (child.tape_ != tape_) throw Error("nn::Module::register_module: '" + name + "' was made on another tape");
  if (child.contains(this))
    throw Error("nn::Module::register_module: '" + name + "' contains this module already (a cycle of modules)");
  children_.emplace_back(name, &child);
  names_.insert(name);
  ++child.parents_;
}

bool Module::contains(const Module* m) const {
  bool found = false;
  walk([&](const Module& x, const std::string&) { found = found || &x == m; }, false);
  return found;
}

std::vector<NamedTensor> Module::named_parameters() const {
  std::vector<NamedTensor> out;
  walk([&](const Module& x, const std::string& prefix) {
    for (const auto& [n, p] : x.params_) out.emplace_back(prefix + n, p);
  });
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  walk([&](const Module& x, const std::string&) {
    for (const auto& [name, p] : x.params_) n += p.numel();
  }, false);
  return n;
}

void Module::train(bool on) {
  // (walk hands out const modules: each is this one or below it, so ours to set)
  walk([on](const Module& x, const std::string&) { const_cast<Module&>(x).training_ = on; }, false);
}

void Module::zero_grad() {
  walk([](const Module& x, const std::string&) {
    for (const auto& [n, p] : x.params_) segtape::zero_grad(p);
  }, false);
}

}  // namespace segtape::nn
