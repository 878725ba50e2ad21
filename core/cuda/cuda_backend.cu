#include "core/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/cuda/cublaslt_gemm.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_launch.cuh"

namespace core {

using cuda_detail::DeviceBuffer;
using cuda_detail::to_int;

namespace {

// Describes why no device can be used, or returns an empty string when `device_index` is usable.
std::string device_problem(int device_index) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // reset the runtime's last-error state
    return std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorName(status) +
           ", " + cudaGetErrorString(status) + ")";
  }
  if (count == 0) return "no CUDA device present";
  if (device_index < 0 || device_index >= count) {
    return "device index out of range: " + std::to_string(count) + " device(s) present";
  }
  return {};
}

// `device_index` when it names a usable device, else an error saying why. Runs before any member
// (the allocator) touches the device, so a bad index leaves no error behind in the runtime.
int usable_device_index(int device_index) {
  std::string problem = device_problem(device_index);
  if (!problem.empty()) ENGINE_FAIL("cuda:" + std::to_string(device_index) + ": " + problem);
  return device_index;
}

}  // namespace

bool cuda_available() {
  return cuda_device_count() > 0;
}

bool cuda_built() {
  return true;
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for the next checked call
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  return std::make_unique<CudaBackend>(device_index);
}

CudaBackend::CudaBackend(int device_index)
    : device_index_(usable_device_index(device_index)), allocator_(device_index_) {
  // One rank drives one device: the device stays current for this thread from here on.
  ENGINE_CUDA_CALL(cudaSetDevice(device_index));
  cudaDeviceProp prop{};
  ENGINE_CUDA_CALL(cudaGetDeviceProperties(&prop, device_index));
  name_ = "cuda:" + std::to_string(device_index) + " (" + prop.name + ")";
  compute_capability_ = 10 * prop.major + prop.minor;
  max_smem_per_block_ = prop.sharedMemPerBlockOptin;
  try {
    ENGINE_CUDA_CALL(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    allocator_.set_stream(stream_);
    for (UploadSlot& slot : upload_)
      ENGINE_CUDA_CALL(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    ENGINE_CUDA_CALL(cublasCreate(&cublas_));
    ENGINE_CUDA_CALL(cublasSetStream(cublas_, stream_));
    // Default math keeps f32 GEMMs in full f32; TF32 per call (GemmArgs::tf32, gemm.cu). A bf16
    // C is each f32 result rounded once (core/ops/gemm.h): split-K partial sums are reduced in
    // f32, never stored in bf16 between (cuBLAS allows that unless this flag forbids it).
    ENGINE_CUDA_CALL(cublasSetMathMode(
        cublas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    ENGINE_CUDA_CALL(cublasLtCreate(&cublaslt_));
    lt_ = std::make_unique<CublasLtGemm>(cublaslt_, stream_);
    fused_epilogues_ = fused_epilogues_enabled();
    fused_bf16_c_ = fused_bf16_c_enabled();
    ENGINE_CUDA_CALL(cusolverDnCreate(&cusolver_));
    ENGINE_CUDA_CALL(cusolverDnSetStream(cusolver_, stream_));
    // Backend bookkeeping memory bypasses the allocator so live_bytes() counts tensors only.
    ENGINE_CUDA_CALL(cudaMalloc(&status_, 2 * sizeof(int)));
    ENGINE_CUDA_CALL(cudaMemsetAsync(status_, 0, 2 * sizeof(int), stream_));
    ENGINE_CUDA_CALL(cudaMalloc(&reduce_scratch_, sizeof(double)));
    ENGINE_CUDA_CALL(cudaStreamSynchronize(stream_));
  } catch (...) {
    release();
    throw;
  }
}

CudaBackend::~CudaBackend() {
  release();
}

void CudaBackend::release() {
  // Teardown must not throw; errors here have nothing left to protect.
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (UploadSlot& slot : upload_) {
    if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
    if (slot.host != nullptr) cudaFreeHost(slot.host);
    slot = UploadSlot{};
  }
  if (reduce_scratch_ != nullptr) cudaFree(reduce_scratch_);
  if (status_ != nullptr) cudaFree(status_);
  if (cusolver_ != nullptr) cusolverDnDestroy(cusolver_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  lt_.reset();  // its plans and workspace, before the handle they were made with
  if (cublaslt_ != nullptr) cublasLtDestroy(cublaslt_);
  // Blocks still cached for the stream go back to the driver before the stream does.
  try {
    allocator_.release_cached();
  } catch (const Error&) {
    // The driver is failing; the allocator's destructor tries once more.
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  reduce_scratch_ = nullptr;
  status_ = nullptr;
  cusolver_ = nullptr;
  cublas_ = nullptr;
  cublaslt_ = nullptr;
  stream_ = nullptr;
}

void CudaBackend::synchronize() {
  ENGINE_CUDA_CALL(cudaStreamSynchronize(stream_));
  check_status();
}

void CudaBackend::check_status(const char* op) {
  int host[2] = {0, 0};
  ENGINE_CUDA_CALL(cudaMemcpyAsync(host, status_, sizeof(host), cudaMemcpyDeviceToHost, stream_));
  ENGINE_CUDA_CALL(cudaStreamSynchronize(stream_));
  if (host[0] == cuda_detail::kStatusOk) return;
  ENGINE_CUDA_CALL(cudaMemsetAsync(status_, 0, 2 * sizeof(int), stream_));
  switch (host[0]) {
    case cuda_detail::kStatusTargetOutOfRange:
      ENGINE_FAIL(name_ + ": cross_entropy: the target of row " + std::to_string(host[1]) +
                  " is outside [0, V)");
    case cuda_detail::kStatusNegativeTokenId:
      ENGINE_FAIL(name_ + ": embedding: negative token id at position " + std::to_string(host[1]));
    case cuda_detail::kStatusNegativeRowIndex:
      ENGINE_FAIL(name_ +
                  ": gather_rows/scatter_add_rows/combine_rows: negative (combine_rows: or "
                  "repeated) row index at position " +
                  std::to_string(host[1]));
    case cuda_detail::kStatusColumnIndexOutOfRange:
      ENGINE_FAIL(name_ + ": gather_columns: column index out of range at position " +
                  std::to_string(host[1]));
    case cuda_detail::kStatusNonFiniteInput:
      ENGINE_FAIL(name_ + ": " + (op != nullptr ? op : "linear algebra") +
                  ": input has a non-finite value in batch member " + std::to_string(host[1]));
    default:
      ENGINE_FAIL(name_ + ": a kernel raised status " + std::to_string(host[0]));
  }
}

void CudaBackend::check_solver_info(const int* dev_info, int64_t batch, const char* op) {
  std::vector<int> info(static_cast<size_t>(batch));
  ENGINE_CUDA_CALL(cudaMemcpyAsync(info.data(), dev_info, info.size() * sizeof(int),
                                   cudaMemcpyDeviceToHost, stream_));
  ENGINE_CUDA_CALL(cudaStreamSynchronize(stream_));
  check_status(op);  // a non-finite input explains a solver failure better than its info
  for (int64_t i = 0; i < batch; ++i) {
    if (info[i] == 0) continue;
    // LAPACK convention: info < 0 names a bad argument, info > 0 a numerical failure (e.g. an
    // eigen solver that did not converge).
    ENGINE_FAIL(name_ + ": " + op + " failed for batch member " + std::to_string(i) +
                ": devInfo = " + std::to_string(info[i]) +
                (info[i] < 0 ? " (invalid argument)" : " (did not converge)"));
  }
}

}  // namespace core
