// Module: named parameters in PyTorch's dotted state_dict style.
//
//   struct Policy : nn::Module {
//     nn::Linear encoder;
//     nn::GRUCell gru;
//     Policy(Tape& t, nn::Rng& r) : Module(t), encoder(t, r, 6, 8), gru(t, r, 8, 8) {
//       register_module("encoder", encoder);   // encoder.weight, encoder.bias
//       register_module("gru", gru);           // gru.weight_ih, gru.weight_hh, ...
//     }
//   };
//
// Parameters are persistent tensors from tape.parameter() (gradient buffer
// attached). Children are registered by name and point at members, so a
// module can be neither copied nor moved.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "segtape/tape.h"

namespace segtape::nn {

using NamedTensor = std::pair<std::string, Tensor>;

class Module {
 public:
  explicit Module(Tape& tape, DType dtype = DType::F32);
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // A new parameter of this module's dtype, zero-filled; name has no '.'.
  // Returned by value: the handle aliases the registered one.
  Tensor register_parameter(const std::string& name, const Shape& shape);
  // child must outlive this module (normally: it is a member of it).
  template <class M>
  M& register_module(const std::string& name, M& child) {
    add_child(name, child);
    return child;
  }

  // PyTorch's order: own parameters in registration order, then each child's
  // (recursively) in registration order, named "child.param". A module
  // registered in more than one place (shared, as tied layers are) is listed
  // once, under its first name, as PyTorch's named_parameters() does: counted
  // once, clipped once, and stepped once by an optimizer.
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t parameter_count() const;  // elements, like sum(p.numel())
  void zero_grad();                 // this module's parameters only
  // Training or evaluation mode, PyTorch's module.train() / module.eval():
  // sets this module and every module below it. What Dropout, and LSTM's and
  // GRU's dropout between layers, read; a new module is in training mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  Tape& tape() const { return *tape_; }
  DType dtype() const { return dtype_; }
  const std::vector<NamedTensor>& own_parameters() const { return params_; }
  const std::vector<std::pair<std::string, Module*>>& children() const { return children_; }

  // f(module, prefix) for this module and every module below it, in
  // named_parameters()' order, a shared module once (its first place);
  // prefix: what the module's parameters are
  // named under ("" here, "gru." for a child gru), built only with
  // want_prefix (else ""). Without recursion: a chain of modules as deep as
  // memory allows (recursion overflowed the stack at about 45,000 levels).
  // Up to 32 levels, with short names and no shared module nothing is
  // allocated (clip_grad_norm walks every update).
  template <class F>
  void walk(F&& f, bool want_prefix = true) const;

 private:
  void add_child(const std::string& name, Module& child);
  bool contains(const Module* m) const;  // m is this module or in its subtree
  void check_name(const std::string& name, const char* what) const;

  Tape* tape_;
  DType dtype_;
  std::vector<NamedTensor> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  // Each name in params_ or children_ (which of the two: check_name looks),
  // so registering n names is not O(n^2): nn::GRU's 4 per layer.
  std::unordered_set<std::string> names_;
  int parents_ = 0;  // the places it is registered in (more than one: walk() visits it once)
  bool training_ = true;
};

template <class F>
void Module::walk(F&& f, bool want_prefix) const {
  struct Frame {
    const Module* m;
    size_t next, len;  // the next child to visit; the length of the module's prefix
  };
  constexpr size_t kInline = 32;
  Frame inline_frames[kInline];
  std::vector<Frame> deeper;  // frames past kInline
  std::vector<const Module*> shared;  // the shared modules visited (parents_ > 1: few)
  size_t depth = 0;
  auto at = [&](size_t i) -> Frame& { return i < kInline ? inline_frames[i] : deeper[i - kInline]; };
  auto push = [&](const Frame& fr) {
    if (depth < kInline) inline_frames[depth] = fr;
    else if (depth - kInline < deeper.size()) deeper[depth - kInline] = fr;
    else deeper.push_back(fr);
    ++depth;
  };
  std::string prefix;
  f(*this, prefix);
  push({this, 0, 0});
  while (depth > 0) {
    Frame& top = at(depth - 1);
    if (top.next == top.m->children_.size()) {
      --depth;
      continue;
    }
    const auto& [name, child] = top.m->children_[top.next++];
    if (child->parents_ > 1) {
      if (std::find(shared.begin(), shared.end(), child) != shared.end()) continue;
      shared.push_back(child);
    }
    if (want_prefix) prefix.resize(top.len), prefix += name, prefix += '.';
    f(*child, prefix);
    push({child, 0, prefix.size()});  // (top is not used past here: push may move the frames)
  }
}

}  // namespace segtape::nn
