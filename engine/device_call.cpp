// segtape/device_call.h: the checks, then the tape's backend.
#include "segtape/device_call.h"

#include <string>

#include "backend.h"
#include "segtape/error.h"
#include "segtape/tape.h"
#include "tape_internals.h"

namespace segtape {

using In = detail::TapeInternals;
namespace {

// The call's refusal, its message naming the function. (Built only on
// failure: a call allocates nothing, and a device rollout makes many.)
template <class E = Error>
[[noreturn]] void refuse(const DeviceFunction& fn, const std::string& why) {
  throw E(std::string(fn.name ? fn.name : "device_call") + ": " + why);
}

}  // namespace

void device_call(const DeviceFunction& fn, std::initializer_list<Tensor> in, std::initializer_list<Tensor> out,
                 std::initializer_list<int64_t> ints, std::initializer_list<double> reals) {
  if (!fn.name || !fn.host) refuse(fn, "a device function needs a name and a host form");
  if (in.size() + out.size() == 0) refuse(fn, "no tensors (a call runs on a tape's tensors)");
  if (in.size() + out.size() > size_t(CallArgs::kMaxTensors) || ints.size() > size_t(CallArgs::kMaxInts) ||
      reals.size() > size_t(CallArgs::kMaxReals))
    refuse(fn, "at most " + std::to_string(CallArgs::kMaxTensors) + " tensors, " + std::to_string(CallArgs::kMaxInts) + " integers and " +
           std::to_string(CallArgs::kMaxReals) + " reals");
  CallArgs a;
  Tape* tape = nullptr;
  size_t k = 0;
  for (const auto* list : {&in, &out})
    for (const Tensor& t : *list) {
      if (!t.defined()) refuse(fn, "tensor " + std::to_string(k) + " is undefined");
      t.check_live(fn.name);
      if (tape && t.tape != tape) refuse<TapeError>(fn, "tensor " + std::to_string(k) + " belongs to another tape");
      if (t.requires_grad)
        refuse(fn, "tensor " + std::to_string(k) + " " + t.describe() + " requires a gradient (a device call is not recorded: pass its values, detach())");
      tape = t.tape;
      a.ptr[k] = t.ptr, a.numel[k] = t.numel(), ++k;
    }
  if (!fn.cuda && In::backend(*tape)->native_stream())  // (a GPU's backend; the emulated device runs the host form)
    refuse(fn, "has no CUDA form (this build compiled none), and the tape is on " + tape->device().str());
  k = 0;
  for (const int64_t v : ints) a.i[k++] = v;
  k = 0;
  for (const double v : reals) a.f[k++] = v;
  for (const Tensor& t : out) detail::tensor_written(t, fn.name);
  In::backend(*tape)->device_call(fn, a);
}

}  // namespace segtape
