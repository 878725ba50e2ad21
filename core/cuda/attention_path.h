// Which kernels the CUDA backend runs an attention with (attention.cu), decided from the call
// and the device alone, so tests check the rule without a device (tests/core/
// cuda_backend_test.cpp, AttentionPath.*).
#pragma once

#include <cstddef>
#include <cstdint>

namespace core::cuda_detail {

enum class AttentionPath {
  kFlashTf32,   // the flash kernels on tensor cores (attention_mma.cu): TF32, or bf16 operands
                // in bf16 precision
  kFlash,       // the flash kernels on FMA units (attention.cu)
  kByGemmTf32,  // batched TF32 GEMMs over a scratch of scores (core/attention_by_gemm.h)
  kByGemm,      // the same in full f32
};

struct AttentionDevice {
  int compute_capability;     // 10 major + minor
  size_t max_smem_per_block;  // the opt-in limit of dynamic shared memory
};

// Shared memory the flash kernels take (the larger of forward and backward) at a padded head
// dimension of 32, 64 or 128: on FMA units (attention.cu) and on TF32 tensor cores
// (attention_mma.cu; the same tiles for TF32 and bf16 operands).
size_t flash_smem(int padded_hd);
size_t flash_mma_smem(int padded_hd);

// With tf32, the flash kernels on tensor cores (sm_80 and later, head dims up to 128, their
// tiles within the device's shared memory), else the TF32 GEMMs where their scratch holds one
// head's scores; otherwise, and where neither applies, the FMA flash kernels, or where their tiles
// do not fit the device (head dim 128 on sm_86/89 GPUs' 99 KB) the f32 GEMMs. A head dim outside
// [1, 128] the GEMMs cannot take goes to the flash kernels, which refuse it by name.
AttentionPath attention_path(bool tf32, int64_t hd, int64_t T, const AttentionDevice& device);

}  // namespace core::cuda_detail
