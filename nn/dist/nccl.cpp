// NCCL for CUDA tapes (nccl.h).
#include "nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace segtape::dist::detail {

namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("dist: NCCL failed in ") + what + ": " + ncclGetErrorString(r));
}

class NcclComm final : public Nccl {
 public:
  NcclComm(Communicator& c, void* stream, int device) : stream_(static_cast<cudaStream_t>(stream)) {
    ncclUniqueId id{};
    if (c.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    c.broadcast(&id, sizeof id, 0, "the broadcast of NCCL's unique id");
    if (cudaSetDevice(device) != cudaSuccess) throw Error("dist: cudaSetDevice(" + std::to_string(device) + ") failed");
    check(ncclCommInitRank(&comm_, c.size(), id, c.rank()), "ncclCommInitRank");
  }
  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  void sum(std::span<float* const> buffers, std::span<const size_t> counts) override {
    check(ncclGroupStart(), "ncclGroupStart");
    for (size_t i = 0; i < buffers.size(); ++i)
      check(ncclAllReduce(buffers[i], buffers[i], counts[i], ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

 private:
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool Nccl::built() { return true; }

std::unique_ptr<Nccl> Nccl::make(Communicator& c, void* stream, int device) {
  return std::make_unique<NcclComm>(c, stream, device);
}

}  // namespace segtape::dist::detail
