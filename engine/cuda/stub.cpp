// A build without CUDA (nvcc was not found when it was configured): a CUDA
// tape cannot be made, and says why. Compiled instead of the rest of this
// folder; see engine/CMakeLists.txt.
#include "backend.h"
#include "fused_gru.h"

namespace segtape {
bool Device::cuda_built() { return false; }
}  // namespace segtape

namespace segtape::detail {
std::unique_ptr<Backend> make_cuda_backend(const Device& device, const TapeOptions&) {
  throw DeviceError("Tape(" + device.str() + "): this build of segtape has no CUDA backend (nvcc was not found when it was "
              "configured, or SEGTAPE_WITH_CUDA was OFF); use Device::cpu(), or rebuild where the CUDA toolkit is installed");
}
}  // namespace segtape::detail

namespace segtape::cuda::fused {
Plan device_plan(int64_t, int64_t, size_t) {
  Plan none;
  none.why_not = "this build of segtape has no CUDA backend";
  return none;
}
}  // namespace segtape::cuda::fused
