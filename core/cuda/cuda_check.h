// ENGINE_CUDA_CALL: every CUDA runtime, cuBLAS and cuSOLVER call goes through this one macro, which
// throws core::Error naming the call, the file, the line and the library's own error string.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <string>

#include "core/check.h"

namespace core::cuda_detail {

inline void check_status(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw_error(file, line,
              std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
                  cudaGetErrorString(status) + ")");
}

inline void check_status(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw_error(file, line, std::string(call) + " failed: " + cublasGetStatusString(status));
}

// cuSOLVER has no status-to-string function; name the documented statuses ourselves.
inline const char* cusolver_status_name(cusolverStatus_t status) {
  switch (status) {
    case CUSOLVER_STATUS_NOT_INITIALIZED:
      return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case CUSOLVER_STATUS_ALLOC_FAILED:
      return "CUSOLVER_STATUS_ALLOC_FAILED";
    case CUSOLVER_STATUS_INVALID_VALUE:
      return "CUSOLVER_STATUS_INVALID_VALUE";
    case CUSOLVER_STATUS_ARCH_MISMATCH:
      return "CUSOLVER_STATUS_ARCH_MISMATCH";
    case CUSOLVER_STATUS_MAPPING_ERROR:
      return "CUSOLVER_STATUS_MAPPING_ERROR";
    case CUSOLVER_STATUS_EXECUTION_FAILED:
      return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case CUSOLVER_STATUS_INTERNAL_ERROR:
      return "CUSOLVER_STATUS_INTERNAL_ERROR";
    case CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED:
      return "CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED";
    case CUSOLVER_STATUS_NOT_SUPPORTED:
      return "CUSOLVER_STATUS_NOT_SUPPORTED";
    case CUSOLVER_STATUS_INVALID_WORKSPACE:
      return "CUSOLVER_STATUS_INVALID_WORKSPACE";
    default:
      return "cusolverStatus_t";
  }
}

inline void check_status(cusolverStatus_t status, const char* call, const char* file, int line) {
  if (status == CUSOLVER_STATUS_SUCCESS) return;
  throw_error(file, line,
              std::string(call) + " failed: " + cusolver_status_name(status) + " (" +
                  std::to_string(static_cast<int>(status)) + ")");
}

}  // namespace core::cuda_detail

#define ENGINE_CUDA_CALL(expr) ::core::cuda_detail::check_status((expr), #expr, __FILE__, __LINE__)
