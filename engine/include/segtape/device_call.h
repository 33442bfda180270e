// Device functions of a library above the engine, run where a tape's
// tensors live, in the tape's order: a host function on the CPU and the
// host-emulated device, a CUDA launch on the tape's stream on a GPU. The
// agent's device envs, sampler and GAE (agent/device/) are built on it; the
// engine knows nothing of what they compute, as it knows nothing of envs.
//
// A call is like the optimizers' updates (segtape/update.h): not recorded (no
// node, no gradient), in place on the tensors it is given, asynchronous on
// CUDA, and part of a CUDA-graph segment like any other device call: it is
// signed with its function, its tensors' addresses and shapes and its
// scalars, captured, and replayed (a replayed segment must issue the same
// calls: scalars that change from step to step belong in a tensor, as the
// capturable adam_step's step count does).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>

#include "segtape/tensor.h"

namespace segtape {

// What a device function gets: its tensors' first elements (device pointers
// on CUDA) and sizes, in the order the call named them (inputs, then
// outputs), and up to 8 integers and 4 reals.
struct CallArgs {
  static constexpr int kMaxTensors = 16, kMaxInts = 8, kMaxReals = 4;
  std::array<void*, kMaxTensors> ptr{};
  std::array<int64_t, kMaxTensors> numel{};
  std::array<int64_t, kMaxInts> i{};
  std::array<double, kMaxReals> f{};
  template <class T> T* at(int k) const { return static_cast<T*>(ptr[size_t(k)]); }
};

// One device function: its name (for messages and the call's signature: it
// must outlive every tape that calls it, a string literal), its host form
// and its CUDA form (nullptr: not built for CUDA, and a CUDA tape refuses
// the call naming it). The CUDA form launches on `stream` (a cudaStream_t)
// and returns without waiting.
struct DeviceFunction {
  const char* name = nullptr;
  void (*host)(const CallArgs&) = nullptr;
  void (*cuda)(const CallArgs&, void* stream) = nullptr;
};

// Runs fn on a tape's tensors: `in` are read, `out` written in place (each
// counts as written: segtape/tensor.h's data<T>() rule). Every tensor live,
// of one tape, none requiring a gradient; ints and reals at most
// kMaxInts / kMaxReals. Throws Error naming the function otherwise, and a
// CUDA tape without the function's CUDA form.
void device_call(const DeviceFunction& fn, std::initializer_list<Tensor> in, std::initializer_list<Tensor> out,
                 std::initializer_list<int64_t> ints = {}, std::initializer_list<double> reals = {});

}  // namespace segtape
