// Every CUDA runtime, cuBLAS and cuDNN call of the backend goes through
// SEGTAPE_CHECK: a failure becomes a segtape::Error naming the call, the
// status code and the library's description of it (an OutOfMemoryError for
// an allocation status, a DeviceError for no device or driver).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "segtape/error.h"

namespace segtape::cuda {

void check(cudaError_t status, const char* call);
void check(cublasStatus_t status, const char* call);
void check(cudnnStatus_t status, const char* call);

// The last error of a kernel launch (bad configuration, or an earlier
// asynchronous fault surfacing here).
void check_launch(const char* kernel);

}  // namespace segtape::cuda

#define SEGTAPE_CHECK(call) ::segtape::cuda::check((call), #call)
