// Engine-internal, CUDA builds only: what the op families' CUDA sections
// (engine/ops/<family>.cpp under SEGTAPE_HAVE_CUDA) share.
#pragma once
#include "cuda/check.h"
#include "cuda/cuda_backend.h"

namespace segtape::cuda {

template <class T> const T* in(const Tensor& t) { return static_cast<const T*>(t.ptr); }
template <class T> T* out(const Tensor& t) { return static_cast<T*>(t.ptr); }

// Row-strided device copy: `rows` rows of `width` bytes.
inline void copy_rows(cudaStream_t s, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  if (!width || !rows) return;
  SEGTAPE_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, s));
}

}  // namespace segtape::cuda
