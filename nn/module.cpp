#include "segtape/nn/module.h"

#include "segtape/update.h"

namespace segtape::nn {

Module::Module(Tape& tape, DType dtype) : tape_(&tape), dtype_(dtype) {
  if (dtype == DType::I64) throw ShapeError("nn::Module: parameters are floating point (F32 or F64), got i64");
}

namespace {
// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF): a checkpoint's header is JSON, which takes nothing else.
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b >> 6) != 0x2) return false;
      cp = cp << 6 | (b & 0x3f);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}
}  // namespace

void Module::check_name(const std::string& name, const char* what) const {
  // state_dict names are joined with '.', so a '.' inside one would make the
  // dotted name ambiguous (PyTorch refuses it for the same reason).
  if (name.empty() || name.find('.') != std::string::npos)
    throw Error(std::string("nn::Module::") + what + ": name '" + name + "' must be non-empty and contain no '.'");
  if (!valid_utf8(name))  // (it was accepted, and nn::save failed on the JSON header naming no parameter)
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

void Module::zero_grad() {
  walk([](const Module& x, const std::string&) {
    for (const auto& [n, p] : x.params_) segtape::zero_grad(p);
  }, false);
}

}  // namespace segtape::nn
