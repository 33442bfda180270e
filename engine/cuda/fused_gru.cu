// The fused GRU sequence's two persistent kernels (fused_gru.h has the
// design and the per-thread work, shared with the host simulation). G
// thread-block clusters, one per group of rows, independent of each other;
// within one the blocks exchange h' (forward) and dgh (backward) each step
// through distributed shared memory, one cluster barrier per step.
// Thread-block clusters need sm_90: built for an older architecture the
// kernels are empty, and plan() (Limits::sm90) never chooses them there.
// The grid plan's two kernels (fused::grid_plan) have no cluster: one
// cooperative launch of G C blocks, a grid barrier per step, the step's
// vector read from global memory in tiles.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "device_math.cuh"
#include "fused_gru.h"
#include "kernels.h"

namespace segtape::cuda {
namespace cg = cooperative_groups;
namespace {

// Lane 0 of each S-lane group gets the group's sum (every lane does): the
// butterfly of fused_gru.h, in its order; three at once, interleaved (each
// in its own order: the same sums), so their shuffles' latencies overlap.
template <class T>
__device__ __forceinline__ T group_sum(T v, int S) {
  for (int o = S / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class T>
__device__ __forceinline__ void group_sum3(T v[3], int S) {
  for (int o = S / 2; o > 0; o >>= 1) {
    const T a = __shfl_xor_sync(0xffffffffu, v[0], o), b = __shfl_xor_sync(0xffffffffu, v[1], o),
            c = __shfl_xor_sync(0xffffffffu, v[2], o);
    v[0] += a, v[1] += b, v[2] += c;
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
extern __shared__ __align__(16) unsigned char fused_smem[];

// A thread's place in the cluster, as both kernels see it: its block's shared
// memory, block rank c, thread tid of n, whether it has an output (the block
// is rounded up to whole warps), that output, and another block's memory.
template <class T>
struct Thread {
  T* sm = reinterpret_cast<T*>(fused_smem);
  cg::cluster_group cl = cg::this_cluster();
  int c = int(cl.block_rank()), tid = int(threadIdx.x), n = int(blockDim.x);
  bool active;
  fused::Who w;
  __device__ explicit Thread(const fused::Args<T>& a) : active(tid < a.B * a.Hs * a.S), w(fused::who(a, c, tid)) {}
  __device__ const T* remote(int rank) { return cl.map_shared_rank(sm, rank); }
};
#endif

// This block's cluster's arguments: its group of rows (fused::group_args).
template <class T>
__device__ fused::Args<T> cluster_args(const fused::Args<T>& all) {
  return fused::group_args(all, int64_t(blockIdx.x / cg::this_cluster().num_blocks()));
}

template <class T>
__global__ void __launch_bounds__(1024) fused_gru_forward_kernel(fused::Args<T> all) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const fused::Args<T> a = cluster_args(all);
  Thread<T> th(a);
  auto remote = [&](int rank) { return th.remote(rank); };
  fused::fwd_load(a, th.sm, th.c, th.tid, th.n);
  const bool first = th.active && th.w.lane == 0;  // (the lane that finishes its output)
  fused::FwdIn<T> in{}, bias{};
  if (first) in = fused::fwd_inputs(a, th.w, 0), bias = fused::fwd_bias(a, th.w);
  __syncthreads();
  int buf = 0;
  for (int64_t t = 0; t < a.steps; ++t) {
    T acc[3] = {T(0), T(0), T(0)};
    if (th.active) fused::fwd_partial(a, th.sm, th.w, acc);
    group_sum3(acc, a.S);
    if (first) {
      fused::fwd_finish(a, th.sm, th.w, t, acc, buf, in, bias);
      if (t + 1 < a.steps) in = fused::fwd_inputs(a, th.w, t + 1);  // read while the barrier and the gather run
    }
    fused::fwd_stage_keep(a, th.sm, t, th.tid, th.n);
    th.cl.sync();  // every block's h' published
    fused::fwd_gather(a, th.sm, th.tid, th.n, buf, remote);
    __syncthreads();
    buf ^= 1;
  }
  th.cl.sync();  // no block leaves while another reads its shared memory
#elif defined(__CUDA_ARCH__)
  __trap();  // never chosen without sm_90 code (fused_gru_unusable), loud if it were
#endif
}

template <class T>
__global__ void __launch_bounds__(1024) fused_gru_backward_kernel(fused::Args<T> all) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const fused::Args<T> a = cluster_args(all);
  Thread<T> th(a);
  auto remote = [&](int rank) { return th.remote(rank); };
  fused::bwd_load(a, th.sm, th.c, th.tid, th.n);
  const bool first = th.active && th.w.lane == 0;
  fused::BwdIn<T> in{};
  if (first) in = fused::bwd_inputs(a, th.w, a.steps - 1);
  __syncthreads();
  T carry = 0;  // dL/dh of (b, j) from the steps after t
  int buf = 0;
  for (int64_t t = a.steps - 1; t >= 0; --t) {
    T direct = 0, k = 0;
    if (first) {
      direct = fused::bwd_gates(a, th.sm, th.w, t, carry, buf, in);
      k = in.k;
      if (t > 0) in = fused::bwd_inputs(a, th.w, t - 1);  // read while the barrier, the gather and the sums run
    }
    th.cl.sync();  // every block's dgh published
    fused::bwd_gather(a, th.sm, th.tid, th.n, buf, remote);
    __syncthreads();
    const T p = group_sum(th.active ? fused::bwd_partial(a, th.sm, th.w) : T(0), a.S);
    carry = first ? fused::bwd_carry(a, direct, p, k) : T(0);  // (only lane 0's carry is read)
    buf ^= 1;
  }
  if (th.active && th.w.lane == 0) a.dh0[th.w.b * a.H + th.w.j] = carry;
  th.cl.sync();
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// ---- the grid plan
//
// Block blockIdx.x = g C + c: group of rows g, units of block c.
template <class T>
struct GridThread {
  T* sm;
  int c, tid = int(threadIdx.x), n = int(blockDim.x);
  bool active;
  fused::Who w;
  fused::Args<T> a;
  __device__ GridThread(const fused::Args<T>& all, int C, T* smem)
      : sm(smem), c(int(blockIdx.x) % C), a(fused::group_args(all, int64_t(blockIdx.x) / C)) {
    active = tid < a.B * a.Hs * a.S;
    w = fused::who(a, c, tid);
  }
};

template <class T>
__global__ void __launch_bounds__(1024) fused_gru_grid_forward_kernel(fused::Args<T> all, int C, int64_t kt) {
  extern __shared__ __align__(16) unsigned char grid_smem[];
  GridThread<T> th(all, C, reinterpret_cast<T*>(grid_smem));
  const fused::Args<T>& a = th.a;
  cg::grid_group grid = cg::this_grid();
  fused::fwd_load_w(a, th.sm, th.c, th.tid, th.n);
  const bool first = th.active && th.w.lane == 0;
  fused::FwdIn<T> in{}, bias{};
  if (first) bias = fused::fwd_bias(a, th.w);
  for (int64_t t = 0; t < a.steps; ++t) {
    if (first) in = fused::fwd_inputs(a, th.w, t);
    T acc[3] = {T(0), T(0), T(0)};
    for (int64_t k0 = 0; k0 < a.H; k0 += kt) {
      __syncthreads();  // (the tile before is read; W loaded)
      fused::grid_fwd_tile(a, th.sm, kt, t, k0, th.tid, th.n);
      __syncthreads();
      if (th.active) fused::grid_fwd_partial(a, th.sm, kt, th.w, k0, acc);
    }
    group_sum3(acc, a.S);
    if (first) fused::grid_fwd_finish(a, th.w, t, acc, in, bias);
    grid.sync();  // y[t] complete: step t + 1's state
  }
}

template <class T>
__global__ void __launch_bounds__(1024) fused_gru_grid_backward_kernel(fused::Args<T> all, int C, int64_t kt) {
  extern __shared__ __align__(16) unsigned char grid_smem[];
  GridThread<T> th(all, C, reinterpret_cast<T*>(grid_smem));
  const fused::Args<T>& a = th.a;
  cg::grid_group grid = cg::this_grid();
  fused::bwd_load(a, th.sm, th.c, th.tid, th.n);
  const bool first = th.active && th.w.lane == 0;
  T carry = 0;  // dL/dh of (b, j) from the steps after t
  for (int64_t t = a.steps - 1; t >= 0; --t) {
    T direct = 0, k = 0;
    if (first) {
      const fused::BwdIn<T> in = fused::bwd_inputs(a, th.w, t);
      direct = fused::grid_bwd_gates(a, th.w, t, carry, in);
      k = in.k;
    }
    grid.sync();  // dgh[t] complete
    T p = 0;
    for (int64_t r0 = 0; r0 < 3 * a.H; r0 += kt) {
      __syncthreads();
      fused::grid_bwd_tile(a, th.sm, kt, t, r0, th.tid, th.n);
      __syncthreads();
      if (th.active) p = fused::grid_bwd_partial(a, th.sm, kt, th.w, r0, p);
    }
    p = group_sum(p, a.S);
    carry = first ? fused::bwd_carry(a, direct, p, k) : T(0);
  }
  if (first) a.dh0[th.w.b * a.H + th.w.j] = carry;
}

template <class T>
using Kernel = void (*)(fused::Args<T>);
template <class T>
Kernel<T> kernel(bool backward) {
  return backward ? fused_gru_backward_kernel<T> : fused_gru_forward_kernel<T>;
}
template <class T>
using GridKernel = void (*)(fused::Args<T>, int, int64_t);
template <class T>
GridKernel<T> grid_kernel(bool backward) {
  return backward ? fused_gru_grid_backward_kernel<T> : fused_gru_grid_forward_kernel<T>;
}

// Allows kernel k `smem` bytes of dynamic shared memory on the current
// device: once per kernel and device, raised to the largest size asked for
// (so a graph segment, which repeats its warm-up's shapes, makes no such
// call while it is captured).
template <class K>
void allow_smem(K k, int which, size_t smem) {  // which: 0 forward, 1 backward, 2 and 3 the grid plan's
  constexpr int kDevices = 64;
  static std::atomic<size_t> allowed[4][kDevices] = {};
  int dev = 0;
  SEGTAPE_CHECK(cudaGetDevice(&dev));
  std::atomic<size_t>* now = dev < kDevices ? &allowed[which][dev] : nullptr;
  if (now && smem <= now->load()) return;
  SEGTAPE_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if (now) now->store(smem);
}

// A block's threads: the plan's, rounded up to whole warps.
unsigned block_threads(const fused::Plan& p) { return unsigned((p.threads + 31) / 32 * 32); }

// The launch of p.G clusters of p.C blocks.
struct Launch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1]{};
  Launch(const fused::Plan& p, size_t smem, cudaStream_t s) {
    cfg.gridDim = dim3(unsigned(p.G * p.C));
    cfg.blockDim = dim3(block_threads(p));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(p.C);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
};

template <class T>
void launch(cudaStream_t s, const fused::Plan& p, const fused::Args<T>& a, bool backward) {
  const size_t smem = backward ? p.bwd_smem : p.fwd_smem;
  if (p.grid) {  // one cooperative launch of G C blocks (capturable in a graph: a cooperative kernel node)
    const GridKernel<T> k = grid_kernel<T>(backward);
    allow_smem(k, backward ? 3 : 2, smem);
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr[1]{};
    cfg.gridDim = dim3(unsigned(p.G * p.C));
    cfg.blockDim = dim3(block_threads(p));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    SEGTAPE_CHECK(cudaLaunchKernelEx(&cfg, k, a, p.C, p.kt));
    check_launch(backward ? "fused_gru_grid_backward" : "fused_gru_grid_forward");
    return;
  }
  const Kernel<T> k = kernel<T>(backward);
  allow_smem(k, backward ? 1 : 0, smem);
  Launch l(p, smem, s);
  SEGTAPE_CHECK(cudaLaunchKernelEx(&l.cfg, k, a));
  check_launch(backward ? "fused_gru_backward" : "fused_gru_forward");
}

// Whether all G C blocks of the grid plan p are resident at once on the
// current device (cooperative launches require it), or why not.
template <class T>
std::string grid_unusable(const fused::Plan& p) {
  int dev = 0, sms = 0;  // (cooperative launches: grid_plan asks Limits::coop, which device_plan read)
  SEGTAPE_CHECK(cudaGetDevice(&dev));
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return "the CUDA device cannot be queried";
  }
  for (const bool backward : {false, true}) {
    const GridKernel<T> k = grid_kernel<T>(backward);
    const size_t smem = backward ? p.bwd_smem : p.fwd_smem;
    allow_smem(k, backward ? 3 : 2, smem);
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, int(block_threads(p)), smem) != cudaSuccess) {
      (void)cudaGetLastError();
      per_sm = 0;
    }
    if (int64_t(per_sm) * sms < int64_t(p.G) * p.C)
      return "the grid plan's " + std::to_string(p.G * p.C) + " blocks of " + std::to_string(block_threads(p)) + " threads and " +
             std::to_string(smem) + " bytes of shared memory cannot all be resident on this device (" + std::to_string(per_sm) +
             " per multiprocessor, " + std::to_string(sms) + " multiprocessors)";
  }
  return {};
}

// How many clusters of plan p the current device holds at once for one
// kernel (cudaOccupancyMaxActiveClusters), or -1 when it cannot say.
template <class T>
int active_clusters(const fused::Plan& p, bool backward) {
  const Kernel<T> k = kernel<T>(backward);
  const size_t smem = backward ? p.bwd_smem : p.fwd_smem;
  allow_smem(k, backward ? 1 : 0, smem);
  Launch l(p, smem, nullptr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, k, &l.cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return clusters;
}

}  // namespace

template <class T> void fused_gru_forward(cudaStream_t s, const fused::Plan& p, const fused::Args<T>& a) { launch(s, p, a, false); }
template <class T> void fused_gru_backward(cudaStream_t s, const fused::Plan& p, const fused::Args<T>& a) { launch(s, p, a, true); }

std::string fused_gru_unusable(const fused::Plan& p, size_t elem) {
  auto check = [&](auto tag) -> std::string {
    using T = decltype(tag);
    if (p.grid) return grid_unusable<T>(p);
    for (const bool backward : {false, true}) {
      // Built without sm_90 code (CMAKE_CUDA_ARCHITECTURES below 90), the kernels are empty.
      cudaFuncAttributes fa{};
      if (cudaFuncGetAttributes(&fa, kernel<T>(backward)) != cudaSuccess || fa.binaryVersion < 90) {
        (void)cudaGetLastError();
        return "this build has no sm_90 code for the fused kernels (CMAKE_CUDA_ARCHITECTURES)";
      }
      if (active_clusters<T>(p, backward) < 1)
        return "a cluster of " + std::to_string(p.C) + " blocks of " + std::to_string(block_threads(p)) + " threads and " +
               std::to_string(backward ? p.bwd_smem : p.fwd_smem) + " bytes of shared memory cannot be resident on this device";
    }
    return {};
  };
  return elem == sizeof(double) ? check(double{}) : check(float{});
}

int fused_gru_resident_clusters(const fused::Plan& p, size_t elem) {
  auto count = [&](auto tag) {
    using T = decltype(tag);
    return std::max(0, std::min(active_clusters<T>(p, false), active_clusters<T>(p, true)));
  };
  return elem == sizeof(double) ? count(double{}) : count(float{});
}

template void fused_gru_forward<float>(cudaStream_t, const fused::Plan&, const fused::Args<float>&);
template void fused_gru_forward<double>(cudaStream_t, const fused::Plan&, const fused::Args<double>&);
template void fused_gru_backward<float>(cudaStream_t, const fused::Plan&, const fused::Args<float>&);
template void fused_gru_backward<double>(cudaStream_t, const fused::Plan&, const fused::Args<double>&);

}  // namespace segtape::cuda
