// The precision a run computes in: train.precision where the device makes it pay, otherwise fp32
// and one line saying why (docs/precision.md). bf16 needs bf16 dot-product instructions on a CPU
// (AVX512_BF16 or AMX-BF16; ENGINE_CPU_NO_BF16=1 pretends they are absent) or tensor cores on a
// GPU; tf32 needs a GPU from sm_80. Falling back changes nothing saved: checkpoints hold the f32
// parameters and optimizer state in every precision.
#pragma once

#include <string>

#include "core/backend.h"
#include "model/model_config.h"

namespace engine {

struct PrecisionChoice {
  model::Precision precision = model::Precision::Fp32;
  std::string warning;  // empty unless the request was not granted
};

PrecisionChoice choose_precision(model::Precision requested, const core::Backend& backend);

// Why model.head_fp8 cannot run on this device, in one line naming the key and the device (a GPU
// without FP8 tensor cores: core::fp8_gemm_missing_reason); empty when it can (a GPU from sm_89,
// or the CPU, which rounds to FP8 in software) or the key is off. `fp8_missing` is the backend's
// fp8_gemm_missing_reason().
std::string fp8_head_refusal(bool head_fp8, const std::string& fp8_missing);
// The same for any FP8 key (model.head_fp8, model.mlp_fp8) that is `on`.
std::string fp8_key_refusal(const std::string& key, bool on, const std::string& fp8_missing);

}  // namespace engine
