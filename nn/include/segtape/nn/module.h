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
  // (recursively) in registration order, named "child.param".
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t parameter_count() const;  // elements, like sum(p.numel())
  void zero_grad();                 // this module's parameters only

  Tape& tape() const { return *tape_; }
  DType dtype() const { return dtype_; }
  const std::vector<NamedTensor>& own_parameters() const { return params_; }
  const std::vector<std::pair<std::string, Module*>>& children() const { return children_; }

 private:
  void add_child(const std::string& name, Module& child);
  bool contains(const Module* m) const;  // m is this module or in its subtree
  void check_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, std::vector<NamedTensor>& out) const;

  Tape* tape_;
  DType dtype_;
  std::vector<NamedTensor> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  // Each name in params_ or children_ (which of the two: check_name looks),
  // so registering n names is not O(n^2): nn::GRU's 4 per layer.
  std::unordered_set<std::string> names_;
};

}  // namespace segtape::nn
