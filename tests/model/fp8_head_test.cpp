// model.head_fp8's storage and devices: its GEMM operands are FP8 bytes (one byte an element,
// where they were floats), and on a GPU (cuBLASLt's FP8 GEMMs from sm_89, the TF32 form below
// that or with ENGINE_CUDA_FP8_GEMM=tf32) the FP8 head's forward and backward agree with the
// CPU's (skipped without a device). The head's math against float64 is ModelParity.RecordExact;
// the CPU's FP8 GEMM bit for bit against the f32 GEMM of the rounded values is
// Fp8Gemm.EqualsTheF32GemmOfTheRoundedValuesInTheHeadsProducts.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "tests/model/recipe_config.h"

namespace {

// The record's exact forms with the FP8 head on a model of D = 64 (two heads of 32), a vocabulary
// of 100 padded to 128 and T = 16: with B = 2 every dimension of the head's GEMMs (N = 32, D, Vp)
// is a multiple of 16, as cuBLASLt's FP8 kernels want.
model::ModelConfig fp8_model(model::Precision precision) {
  model::ModelConfig c;
  c.arch = model::Arch::Modern;
  c.n_head = 2;
  c.d_model = 64;
  c.seq_len = 16;
  c.vocab_size = 100;
  c = test_model::with_recipe_keys(c, 30.0f, 1);
  c = test_model::with_record_exact(c, 2, 3, true);
  c.precision = precision;
  return c;
}

std::vector<int32_t> tokens(size_t n, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t)
    x = static_cast<int32_t>(rng.next_below(100));
  return t;
}

// The activation bytes with the FP8 head less those without it: its three byte arrays (each
// rounded up to the plan's 64-byte blocks), plus in bf16 precision its f32 logits where the
// ordinary head keeps bf16 ones. Stored as floats (as before) the arrays would take four times
// as much.
TEST(Fp8Head, OperandScratchIsOneByteAnElement) {
  const int B = 2, T = 16;
  const int64_t N = B * T, D = 64, Vp = 128;
  auto block = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  for (model::Precision precision : {model::Precision::Fp32, model::Precision::Bf16}) {
    model::ModelConfig with = fp8_model(precision), without = with;
    without.head_fp8 = false;
    model::Gpt a(with, core::cpu_backend()), b(without, core::cpu_backend());
    a.init_weights();
    b.init_weights();
    const auto x = tokens(N, 1), y = tokens(N, 2);
    a.forward(x.data(), y.data(), B, T);
    b.forward(x.data(), y.data(), B, T);
    int64_t want = block(N * D) + block(Vp * D) + block(N * Vp);
    // bf16 precision's ordinary head keeps its logits (and the last positions' for sampling) in
    // bf16 only; the FP8 head keeps them in f32.
    if (precision == model::Precision::Bf16)
      want += block(4 * N * Vp) - block(2 * N * Vp) + block(4 * B * Vp) - block(2 * B * Vp);
    EXPECT_EQ(
        static_cast<int64_t>(a.activation_bytes()) - static_cast<int64_t>(b.activation_bytes()),
        want)
        << model::precision_name(precision);
  }
}

// The same weights (drawn wide, so that every path carries gradient) and tokens on the CPU and the
// GPU: the loss within 1e-4 and each gradient within 2e-3 of its norm. The GPU's other kernels
// sum in other orders, which can move an FP8 operand across a rounding midpoint now and then
// (one step of 2^-3 or 2^-2 relative in one element), hence a bound in norm, not per element.
TEST(Fp8Head, ForwardAndBackwardOnTheGpuEqualTheCpu) {
  if (!core::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<core::Backend> gpu = core::make_cuda_backend(0);
  const int B = 2, T = 16;
  const model::ModelConfig c = fp8_model(model::Precision::Fp32);
  model::Gpt on_cpu(c, core::cpu_backend()), on_gpu(c, *gpu);
  std::vector<float> p(static_cast<size_t>(on_cpu.params().numel()));
  for (size_t i = 0; i < on_cpu.table().size(); ++i) {
    const model::ParamInfo& info = on_cpu.table()[i];
    const double fan = info.shape.size() > 1 ? static_cast<double>(info.shape.back()) : 1.0;
    for (int64_t e = 0; e < info.numel; ++e) {
      const double z = core::rng_normal(core::rng_hash(3, i), e);
      p[static_cast<size_t>(info.offset + e)] =
          static_cast<float>(info.shape.size() > 1 ? z / std::sqrt(fan) : 0.6 + 0.4 * z);
    }
  }
  core::cpu_backend().copy_from_host(on_cpu.params().raw_data(), p.data(), p.size() * 4);
  gpu->copy_from_host(on_gpu.params().raw_data(), p.data(), p.size() * 4);
  const auto x = tokens(B * T, 5), y = tokens(B * T, 6);
  float loss[2];
  model::Gpt* models[2] = {&on_cpu, &on_gpu};
  for (int m = 0; m < 2; ++m) {
    models[m]->params_updated();
    models[m]->zero_grad();
    loss[m] = models[m]->forward(x.data(), y.data(), B, T);
    models[m]->backward();
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-4 * std::fabs(loss[0]));
  for (size_t i = 0; i < on_cpu.table().size(); ++i) {
    const std::vector<float> want = on_cpu.grad(i).to_vector(), got = on_gpu.grad(i).to_vector();
    double diff = 0, norm = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      diff += (double(got[e]) - want[e]) * (double(got[e]) - want[e]);
      norm += double(want[e]) * want[e];
    }
    EXPECT_LE(std::sqrt(diff), 2e-3 * std::sqrt(norm)) << on_cpu.table()[i].name;
  }
}

}  // namespace
