// The replay driver's boundary check on a GPU (engine/replay_check.h): the
// state's words hashed by one thread each and added with atomics (the sum
// is the same in any order), then one thread settles the boundary.
#include <cuda_runtime.h>

#include "replay_check.h"

namespace segtape::cuda {
namespace {

__global__ void zero_sum(int64_t* checks, int64_t nb) { checks[2 * nb + 3] = 0; }

__global__ void add_words(const uint32_t* words, int64_t n, int64_t* checks, int64_t nb) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n)
    atomicAdd(reinterpret_cast<unsigned long long*>(checks + 2 * nb + 3),
              static_cast<unsigned long long>(replay::check::word_hash(uint64_t(i), words[i])));
}

__global__ void settle_one(int64_t* checks, int64_t nb, int64_t b, int64_t u, int64_t begin, int64_t end) {
  replay::check::settle(checks, nb, b, u, begin, end);
}

__global__ void forget_one(int64_t* checks, int64_t nb, int64_t b) { replay::check::forget(checks, nb, b); }

}  // namespace

// (replay.cpp's device functions unpack their CallArgs into these.)
void replay_check(void* stream, const uint32_t* words, int64_t n, int64_t* checks, int64_t nb, int64_t b, int64_t u, int64_t begin,
                  int64_t end) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  zero_sum<<<1, 1, 0, s>>>(checks, nb);
  if (n > 0) add_words<<<unsigned((n + 255) / 256), 256, 0, s>>>(words, n, checks, nb);
  settle_one<<<1, 1, 0, s>>>(checks, nb, b, u, begin, end);
}

void replay_forget(void* stream, int64_t* checks, int64_t nb, int64_t b) {
  forget_one<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(checks, nb, b);
}

}  // namespace segtape::cuda
