#include "engine/precision.h"

namespace engine {

PrecisionChoice choose_precision(model::Precision requested, const core::Backend& backend) {
  std::string reason;
  if (requested == model::Precision::Bf16) reason = backend.bf16_gemm_slow_reason();
  if (requested == model::Precision::Tf32) reason = backend.tf32_gemm_slow_reason();
  if (reason.empty()) return {requested, ""};
  return {model::Precision::Fp32, std::string("train.precision=") +
                                      model::precision_name(requested) + ": " + reason +
                                      "; running fp32"};
}

std::string fp8_head_refusal(bool head_fp8, const std::string& fp8_missing) {
  return fp8_key_refusal("model.head_fp8", head_fp8, fp8_missing);
}

std::string fp8_key_refusal(const std::string& key, bool on, const std::string& fp8_missing) {
  if (!on || fp8_missing.empty()) return "";
  return "key '" + key + "' = true: " + fp8_missing + " (set " + key + ": false here)";
}

}  // namespace engine
