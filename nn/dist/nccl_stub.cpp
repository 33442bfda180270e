// A build without NCCL: GradientAverager averages device gradients through
// host memory (nccl.h).
#include "nccl.h"

namespace segtape::dist::detail {
bool Nccl::built() { return false; }
std::unique_ptr<Nccl> Nccl::make(Communicator&, void*, int) {
  throw Error("dist: this build of segtape has no NCCL (CMake found none with the CUDA toolkit)");
}
}  // namespace segtape::dist::detail
