#include "check.h"

#include <string>

namespace segtape::cuda {

void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  throw Error(std::string("CUDA: ") + call + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
              ")");
}

void check(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string("cuBLAS: ") + call + " failed: " + cublasGetStatusName(status) + " (" +
              cublasGetStatusString(status) + ")");
}

void check(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof detail);  // cuDNN 9: what exactly it objected to
  throw Error(std::string("cuDNN: ") + call + " failed: " + cudnnGetErrorString(status) +
              (detail[0] ? std::string(" (") + detail + ")" : std::string()));
}

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  throw Error(std::string("CUDA: kernel ") + kernel + " failed to launch: " + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ")");
}

}  // namespace segtape::cuda
