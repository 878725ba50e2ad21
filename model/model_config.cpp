#include "model/model_config.h"

#include "core/check.h"

namespace model {

const char* arch_name(Arch arch) {
  return arch == Arch::Gpt2 ? "gpt2" : "modern";
}

Arch parse_arch(const std::string& name) {
  if (name == "gpt2") return Arch::Gpt2;
  if (name == "modern") return Arch::Modern;
  ENGINE_FAIL("model.arch: unknown architecture '" + name + "' (expected gpt2 or modern)");
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::Fp32:
      return "fp32";
    case Precision::Tf32:
      return "tf32";
    case Precision::Bf16:
      return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::Fp32;
  if (name == "tf32") return Precision::Tf32;
  if (name == "bf16") return Precision::Bf16;
  ENGINE_FAIL("train.precision: unknown precision '" + name + "' (expected fp32, tf32 or bf16)");
}

void ModelConfig::validate() const {
  auto positive = [](int value, const char* key) {
    ENGINE_CHECK(value > 0,
                 std::string("model.") + key + " must be positive, got " + std::to_string(value));
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(d_model, "d_model");
  positive(seq_len, "seq_len");
  positive(vocab_size, "vocab_size");
  ENGINE_CHECK(d_model % n_head == 0, "model.d_model (" + std::to_string(d_model) +
                                          ") must be a multiple of model.n_head (" +
                                          std::to_string(n_head) + ")");
  ENGINE_CHECK(
      head_dim() % 2 == 0 || arch != Arch::Modern,
      "model: rotary positions need an even head dimension, got " + std::to_string(head_dim()));
  ENGINE_CHECK(moe_experts >= 0, "model.moe.experts must be >= 0");
  if (moe()) {
    ENGINE_CHECK(moe_top_k >= 1 && moe_top_k <= moe_experts,
                 "model.moe.top_k must be in [1, experts=" + std::to_string(moe_experts) +
                     "], got " + std::to_string(moe_top_k));
    ENGINE_CHECK(moe_aux_weight >= 0.0f, "model.moe.aux_weight must be >= 0");
  }
}

}  // namespace model
