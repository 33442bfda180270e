// Device-side helpers shared by the .cu files: math in float or double
// (the full-precision functions, no fast-math intrinsics), a grid-stride
// launcher for elementwise lambdas, and a deterministic block reduction.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "check.h"
#include "ops/device_math.h"

namespace segtape::cuda {

template <class T> __device__ __forceinline__ T dexp(T x) {
  if constexpr (sizeof(T) == 4) return expf(x);
  else return exp(x);
}
template <class T> __device__ __forceinline__ T dlog(T x) {
  if constexpr (sizeof(T) == 4) return logf(x);
  else return log(x);
}
template <class T> __device__ __forceinline__ T dtanh(T x) {
  if constexpr (sizeof(T) == 4) return tanhf(x);
  else return tanh(x);
}
template <class T> __device__ __forceinline__ T dmax(T a, T b) {
  if constexpr (sizeof(T) == 4) return fmaxf(a, b);
  else return fmax(a, b);
}
template <class T> __device__ __forceinline__ T dsigmoid(T x) { return T(1) / (T(1) + dexp<T>(-x)); }

// The device's math for the op formulas of ops/elementwise.h (M in a formula),
// shared with a host test that checks it against the CPU's (ops/device_math.h).
using Math = ops::DeviceMath;

inline constexpr int kThreads = 256;
// The reductions' trees halve the lanes: a power of two, or lanes are dropped.
static_assert((kThreads & (kThreads - 1)) == 0, "kThreads must be a power of two");

template <class F>
__global__ void each_kernel(int64_t n, F f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(blockDim.x) * gridDim.x) f(i);
}

// f(i) for i in [0, n), on stream s.
template <class F>
void each(cudaStream_t s, int64_t n, F f, const char* name) {
  if (n <= 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  each_kernel<<<unsigned(blocks < (int64_t(1) << 20) ? blocks : (int64_t(1) << 20)), kThreads, 0, s>>>(n, f);
  check_launch(name);
}

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024) with
// op, in a fixed order; every thread gets the result. Safe to call twice.
template <class T, class Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, off));
  __syncthreads();  // an earlier call may still be reading part[]
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = part[lane < warps ? lane : 0];
    for (int off = 16; off > 0; off >>= 1) {
      const T o = __shfl_down_sync(0xffffffffu, w, off);
      if (lane + off < warps) w = op(w, o);
    }
    if (lane == 0) part[0] = w;
  }
  __syncthreads();
  return part[0];
}

// Threads per row for the row kernels (softmax, cross-entropy): a warp for
// short rows, up to 256.
inline unsigned row_threads(int64_t cols) {
  return cols <= 32 ? 32u : cols <= 64 ? 64u : cols <= 128 ? 128u : 256u;
}

}  // namespace segtape::cuda
