// The precision a run computes in (engine/precision.h): what was asked where the device makes it
// pay, else fp32 and one line naming the key and the reason.
#include "engine/precision.h"

#include <gtest/gtest.h>

#include <string>

#include "core/backend.h"
#include "engine/config.h"
#include "engine/model_loading.h"

namespace {

using model::Precision;

TEST(Precision, Fp32IsAlwaysGranted) {
  const engine::PrecisionChoice c = engine::choose_precision(Precision::Fp32, core::cpu_backend());
  EXPECT_EQ(c.precision, Precision::Fp32);
  EXPECT_EQ(c.warning, "");
}

TEST(Precision, Tf32OnTheCpuRunsFp32SayingWhy) {
  const engine::PrecisionChoice c = engine::choose_precision(Precision::Tf32, core::cpu_backend());
  EXPECT_EQ(c.precision, Precision::Fp32);
  EXPECT_EQ(c.warning,
            "train.precision=tf32: TF32 is a GPU tensor-core format; the CPU computes f32; "
            "running fp32");
}

// bf16 is granted exactly where the CPU has bf16 instructions (and ENGINE_CPU_NO_BF16 is not
// set: bf16_isa_forced_fallback covers that side); without them the warning names the reason.
TEST(Precision, Bf16FollowsTheCpu) {
  const engine::PrecisionChoice c = engine::choose_precision(Precision::Bf16, core::cpu_backend());
  const std::string reason = core::cpu_backend().bf16_gemm_slow_reason();
  if (reason.empty()) {
    EXPECT_EQ(c.precision, Precision::Bf16);
    EXPECT_EQ(c.warning, "");
  } else {
    EXPECT_EQ(c.precision, Precision::Fp32);
    EXPECT_EQ(c.warning, "train.precision=bf16: " + reason + "; running fp32");
  }
}

// model.head_fp8 on a GPU without FP8 tensor cores is refused in one line naming the key, the
// GPU and its compute capability (the trainer throws it as a config error); the CPU rounds to
// FP8 in software and runs it, and the key off is never refused.
TEST(Precision, Fp8HeadIsRefusedOnAGpuWithoutFp8) {
  EXPECT_EQ(engine::fp8_head_refusal(
                true, core::fp8_gemm_missing_reason("cuda:0 (NVIDIA A100-SXM4-80GB)", 80)),
            "key 'model.head_fp8' = true: cuda:0 (NVIDIA A100-SXM4-80GB) has compute capability "
            "8.0; FP8 tensor cores need 8.9 or later (set model.head_fp8: false here)");
  EXPECT_EQ(engine::fp8_head_refusal(true, core::fp8_gemm_missing_reason("cuda:0 (H100)", 90)), "");
  EXPECT_EQ(engine::fp8_head_refusal(false, core::fp8_gemm_missing_reason("cuda:0 (T4)", 75)), "");
  EXPECT_EQ(engine::fp8_head_refusal(true, core::cpu_backend().fp8_gemm_missing_reason()), "");
}

// model.mlp_fp8 likewise, naming its own key; and the key reaches the model config.
TEST(Precision, Fp8MlpIsRefusedOnAGpuWithoutFp8) {
  EXPECT_EQ(engine::fp8_key_refusal("model.mlp_fp8", true,
                                    core::fp8_gemm_missing_reason("cuda:0 (T4)", 75)),
            "key 'model.mlp_fp8' = true: cuda:0 (T4) has compute capability 7.5; FP8 tensor "
            "cores need 8.9 or later (set model.mlp_fp8: false here)");
  EXPECT_EQ(engine::fp8_key_refusal("model.mlp_fp8", false,
                                    core::fp8_gemm_missing_reason("cuda:0 (T4)", 75)),
            "");
  EXPECT_EQ(
      engine::fp8_key_refusal("model.mlp_fp8", true, core::cpu_backend().fp8_gemm_missing_reason()),
      "");
  const std::string yaml = "data: {train: a, val: b}\noptim: [{params: ['*'], optimizer: adamw}]\n";
  EXPECT_TRUE(engine::model_config_of(engine::parse_config(yaml, "p.yaml", {"model.mlp_fp8=true"}))
                  .mlp_fp8);
}

TEST(Precision, TheConfigKeyReachesTheModelConfig) {
  const std::string yaml = "data: {train: a, val: b}\noptim: [{params: ['*'], optimizer: adamw}]\n";
  EXPECT_EQ(engine::model_config_of(engine::parse_config(yaml, "p.yaml")).precision,
            Precision::Fp32);
  EXPECT_EQ(engine::model_config_of(engine::parse_config(yaml, "p.yaml", {"train.precision=bf16"}))
                .precision,
            Precision::Bf16);
  EXPECT_EQ(model::parse_precision("tf32"), Precision::Tf32);
  EXPECT_STREQ(model::precision_name(Precision::Bf16), "bf16");
}

}  // namespace
