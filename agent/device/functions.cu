// The device agent loop's CUDA forms: one thread per element of a body
// (agent/device/bodies.h), on the tape's stream.
#include <cuda_runtime_api.h>

#include "bodies.h"

namespace segtape::agent::device {
namespace {

template <class Body>
__global__ void each(Body body, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) body(i);
}

}  // namespace

template <class Body>
void launch(const Body& body, int64_t n, void* stream) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  each<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(body, n);
}  // (the backend reads the launch's error after the call, naming the function)

template void launch(const Observe<rules::Recall>&, int64_t, void*);
template void launch(const Observe<rules::TMaze>&, int64_t, void*);
template void launch(const Observe<rules::Dialogue>&, int64_t, void*);
template void launch(const EnvStep<rules::Dialogue>&, int64_t, void*);
template void launch(const EnvStep<rules::Recall>&, int64_t, void*);
template void launch(const EnvStep<rules::TMaze>&, int64_t, void*);
template void launch(const Sample&, int64_t, void*);
template void launch(const Store&, int64_t, void*);
template void launch(const Reset&, int64_t, void*);
template void launch(const StoreState&, int64_t, void*);
template void launch(const Advance&, int64_t, void*);
template void launch(const Gae&, int64_t, void*);
template void launch(const GatherRows<int64_t>&, int64_t, void*);
template void launch(const GatherRows<float>&, int64_t, void*);
template void launch(const ResetFactors&, int64_t, void*);
template void launch(const GatherState&, int64_t, void*);
template void launch(const AdvantageStats&, int64_t, void*);
template void launch(const GatherAdvantages&, int64_t, void*);
template void launch(const PpoTerms&, int64_t, void*);
template void launch(const PpoStepSums&, int64_t, void*);
template void launch(const PpoTotals&, int64_t, void*);
template void launch(const KeepSquare&, int64_t, void*);

}  // namespace segtape::agent::device
