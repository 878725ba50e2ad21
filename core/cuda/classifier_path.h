// Which kernel the CUDA backend's cross-entropy on bf16 logits runs (classifier.cu), decided from
// the call and the device alone, so tests check the rule without a device (tests/core/
// cuda_backend_test.cpp, ClassifierPath.*).
#pragma once

#include <cstddef>
#include <cstdint>

namespace core::cuda_detail {

// ENGINE_CUDA_CLASSIFIER_TWO_PASS=1 runs the two-pass kernel (each row read from HBM twice, as
// the f32 cross-entropy does) for every row: the fallback, and the baseline a GPU run times the
// one-read kernel against.
inline constexpr const char* kClassifierTwoPassEnv = "ENGINE_CUDA_CLASSIFIER_TWO_PASS";
bool classifier_two_pass_forced();

// The dynamic shared memory of the one-read kernel for rows whose softmax covers V columns (the
// V bf16 logits, in whole 16-byte packs), or 0 where it and the kernel's reduction buffer do not
// fit max_smem_per_block (then the two-pass kernel runs) or the two-pass kernel is forced.
size_t classifier_row_smem(int64_t V, size_t max_smem_per_block);

}  // namespace core::cuda_detail
