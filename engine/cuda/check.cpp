#include "check.h"

#include <string>

namespace segtape::cuda {

// The statuses that mean the memory or the device, as segtape's typed errors
// (OutOfMemoryError's pool is the call; DeviceError's GPU is there when the
// device exists but cannot be used); every other status is an Error.
void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  const std::string m =
      std::string("CUDA: ") + call + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
  if (status == cudaErrorMemoryAllocation) throw OutOfMemoryError(m, call);
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) throw DeviceError(m);
  if (status == cudaErrorInvalidDevice || status == cudaErrorDevicesUnavailable) throw DeviceError(m, true);
  throw Error(m);
}

void check(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const std::string m =
      std::string("cuBLAS: ") + call + " failed: " + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")";
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemoryError(m, call);
  throw Error(m);
}

void check(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);  // cuDNN 9: what exactly it objected to
  const std::string m = std::string("cuDNN: ") + call + " failed: " + cudnnGetErrorString(status) +
                        (detail[0] ? std::string(" (") + detail + ")" : std::string());
  if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED || status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    throw OutOfMemoryError(m, call);
  throw Error(m);
}

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  throw Error(std::string("CUDA: kernel ") + kernel + " failed to launch: " + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ")");
}

}  // namespace segtape::cuda
