// The fused GRU sequence's two persistent kernels (fused_gru.h has the
// design and the per-thread work, shared with the host simulation). One
// thread-block cluster; the blocks exchange h' (forward) and dgh (backward)
// each step through distributed shared memory, one cluster barrier per step.
// Thread-block clusters need sm_90: built for an older architecture the
// kernels are empty, and plan() (Limits::sm90) never chooses them there.
#include <cooperative_groups.h>

#include <atomic>

#include "device_math.cuh"
#include "fused_gru.h"
#include "kernels.h"

namespace segtape::cuda {
namespace cg = cooperative_groups;
namespace {

// Lane 0 of each S-lane group gets the group's sum (every lane does): the
// butterfly of fused_gru.h, in its order.
template <class T>
__device__ __forceinline__ T group_sum(T v, int S) {
  for (int o = S / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__global__ void __launch_bounds__(1024) fused_gru_forward_kernel(fused::Args<T> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char raw[];
  T* sm = reinterpret_cast<T*>(raw);
  cg::cluster_group cl = cg::this_cluster();
  const int c = int(cl.block_rank()), tid = int(threadIdx.x), n = int(blockDim.x);
  const bool active = tid < a.B * a.Hs * a.S;  // the block is rounded up to whole warps
  const fused::Who w = fused::who(a, c, tid);
  auto remote = [&](int rank) -> const T* { return cl.map_shared_rank(sm, rank); };
  fused::fwd_load(a, sm, c, tid, n);
  __syncthreads();
  int buf = 0;
  for (int64_t t = 0; t < a.steps; ++t) {
    T acc[3] = {T(0), T(0), T(0)};
    if (active) fused::fwd_partial(a, sm, w, acc);
    for (int g = 0; g < 3; ++g) acc[g] = group_sum(acc[g], a.S);
    if (active && w.lane == 0) fused::fwd_finish(a, sm, w, t, acc, buf);
    cl.sync();  // every block's h' published
    fused::fwd_gather(a, sm, tid, n, buf, remote);
    __syncthreads();
    buf ^= 1;
  }
  cl.sync();  // no block leaves while another reads its shared memory
#endif
}

template <class T>
__global__ void __launch_bounds__(1024) fused_gru_backward_kernel(fused::Args<T> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char raw[];
  T* sm = reinterpret_cast<T*>(raw);
  cg::cluster_group cl = cg::this_cluster();
  const int c = int(cl.block_rank()), tid = int(threadIdx.x), n = int(blockDim.x);
  const bool active = tid < a.B * a.Hs * a.S;
  const fused::Who w = fused::who(a, c, tid);
  auto remote = [&](int rank) -> const T* { return cl.map_shared_rank(sm, rank); };
  fused::bwd_load(a, sm, c, tid, n);
  __syncthreads();
  T carry = 0;  // dL/dh of (b, j) from the steps after t
  int buf = 0;
  for (int64_t t = a.steps - 1; t >= 0; --t) {
    T direct = 0;
    if (active && w.lane == 0) direct = fused::bwd_gates(a, sm, w, t, carry, buf);
    cl.sync();  // every block's dgh published
    fused::bwd_gather(a, sm, tid, n, buf, remote);
    __syncthreads();
    const T p = group_sum(active ? fused::bwd_partial(a, sm, w) : T(0), a.S);
    carry = direct + p;
    buf ^= 1;
  }
  if (active && w.lane == 0) a.dh0[w.b * a.H + w.j] = carry;
  cl.sync();
#endif
}

template <class T>
void launch(cudaStream_t s, const fused::Plan& p, const fused::Args<T>& a, bool backward) {
  void (*k)(fused::Args<T>) = backward ? fused_gru_backward_kernel<T> : fused_gru_forward_kernel<T>;
  const size_t smem = backward ? p.bwd_smem : p.fwd_smem;
  // Raised once per kernel to the largest size asked for so far (so a graph
  // segment, which repeats its warm-up's shapes, makes no such call while captured).
  static std::atomic<size_t> allowed[2] = {0, 0};
  std::atomic<size_t>& now = allowed[backward ? 1 : 0];
  if (smem > now.load()) {
    SEGTAPE_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    now.store(smem);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(p.C));
  cfg.blockDim = dim3(unsigned((p.threads + 31) / 32 * 32));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(p.C);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  SEGTAPE_CHECK(cudaLaunchKernelEx(&cfg, k, a));
  check_launch(backward ? "fused_gru_backward" : "fused_gru_forward");
}

}  // namespace

template <class T> void fused_gru_forward(cudaStream_t s, const fused::Plan& p, const fused::Args<T>& a) { launch(s, p, a, false); }
template <class T> void fused_gru_backward(cudaStream_t s, const fused::Plan& p, const fused::Args<T>& a) { launch(s, p, a, true); }

template void fused_gru_forward<float>(cudaStream_t, const fused::Plan&, const fused::Args<float>&);
template void fused_gru_forward<double>(cudaStream_t, const fused::Plan&, const fused::Args<double>&);
template void fused_gru_backward<float>(cudaStream_t, const fused::Plan&, const fused::Args<float>&);
template void fused_gru_backward<double>(cudaStream_t, const fused::Plan&, const fused::Args<double>&);

}  // namespace segtape::cuda
