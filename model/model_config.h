// The GPT's shape and switches (YAML `model:`), independent of where the values come from.
#pragma once

#include <cstdint>
#include <string>

namespace model {

enum class Arch { Gpt2, Modern };

const char* arch_name(Arch arch);
Arch parse_arch(const std::string& name);  // "gpt2" | "modern"; anything else throws

// What the matmuls compute in (train.precision; docs/precision.md). Fp32: f32 throughout. Tf32:
// f32 values, GEMMs on TF32 tensor cores (GPUs). Bf16: each matmul weight, the activation it
// multiplies and, in the backward, the gradient it multiplies, rounded to bf16 for the GEMM;
// f32 accumulation and outputs; everything else (norms, softmax, loss, gradients, their
// reduction, the optimizers, the MoE router) f32. The parameters stay f32 in every precision.
enum class Precision { Fp32, Tf32, Bf16 };

const char* precision_name(Precision precision);
Precision parse_precision(const std::string& name);  // "fp32" | "tf32" | "bf16"; else throws

struct ModelConfig {
  int n_layer = 2;
  int n_head = 2;
  int d_model = 64;
  int seq_len = 64;
  int vocab_size = 50257;
  Arch arch = Arch::Modern;
  float softcap = 0.0f;  // logit soft-cap; <= 0 is off
  int moe_experts = 0;   // 0: dense MLP
  int moe_top_k = 2;
  float moe_aux_weight = 0.01f;
  uint64_t seed = 1337;  // initialisation seed
  Precision precision = Precision::Fp32;

  bool moe() const { return moe_experts > 0; }
  int head_dim() const { return d_model / n_head; }
  int d_ff() const { return 4 * d_model; }
  // Vocabulary rounded up to a multiple of 64; the padded logits never enter the softmax.
  int padded_vocab() const { return (vocab_size + 63) / 64 * 64; }
  // Throws core::Error naming the first inconsistent field.
  void validate() const;
};

}  // namespace model
