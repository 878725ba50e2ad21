#include "model/linear.h"

#include "core/check.h"

namespace model {

void Linear::forward(float* y, Operand x, Operand weight, int64_t N, int64_t in, int64_t out,
                     float beta, float alpha) {
  core::GemmArgs a;
  a.trans_b = true;
  a.m = N, a.n = out, a.k = in, a.beta = beta, a.alpha = alpha;
  if (x.bf16 && weight.bf16) {
    backend_.gemm(a, x.bf16, weight.bf16, y);
  } else {
    ENGINE_CHECK(x.f32,
                 "model: a linear layer with an f32 weight got an input stored only in "
                 "bf16 (widen it first, as the MoE router's input is)");
    a.tf32 = tf32();
    backend_.gemm(a, x.f32, weight.f32, y);
  }
}

void Linear::forward(core::bf16* y, Operand x, Operand weight, int64_t N, int64_t in, int64_t out,
                     float alpha) {
  ENGINE_CHECK(x.bf16 && weight.bf16,
               "model: a linear layer with a bf16 output needs bf16 operands");
  core::GemmArgs a;
  a.trans_b = true;
  a.m = N, a.n = out, a.k = in, a.alpha = alpha;
  backend_.gemm(a, x.bf16, weight.bf16, y);
}

void Linear::forward_epilogue(float* y, Operand x, Operand weight, const float* bias, int64_t N,
                              int64_t in, int64_t out, const float* residual, float* gelu_out) {
  core::GemmArgs a;
  a.trans_b = true;
  a.m = N, a.n = out, a.k = in;
  core::GemmEpilogueArgs ep;
  if (bias) {
    ep.kind = gelu_out ? core::GemmEpilogue::bias_gelu : core::GemmEpilogue::bias;
    ep.bias = bias;
  }
  ENGINE_CHECK(!gelu_out || (bias && !residual),
               "model: the GELU epilogue takes a bias and no residual");
  if (residual) {
    a.beta = 1.0f;
    ep.c = residual;
  }
  float* d = gelu_out ? gelu_out : y;
  float* aux = gelu_out ? y : nullptr;
  if (x.bf16 && weight.bf16) {
    backend_.gemm_epilogue(a, ep, x.bf16, weight.bf16, d, aux);
  } else {
    ENGINE_CHECK(x.f32,
                 "model: a linear layer with an f32 weight got an input stored only in "
                 "bf16 (widen it first, as the MoE router's input is)");
    a.tf32 = tf32();
    backend_.gemm_epilogue(a, ep, x.f32, weight.f32, d, aux);
  }
}

void Linear::residual_forward(Stream y, Operand x, Operand weight, const float* bias, int64_t N,
                              int64_t in, int64_t out, Stream residual) {
  if (!y.bf16) {
    forward_epilogue(y.f32, x, weight, bias, N, in, out, residual.f32);
    return;
  }
  ENGINE_CHECK(x.bf16 && weight.bf16 && residual.bf16,
               "model: the bf16 residual stream's add needs bf16 operands and a bf16 residual");
  core::GemmArgs a;
  a.trans_b = true;
  a.m = N, a.n = out, a.k = in, a.beta = 1.0f;
  core::GemmEpilogueArgs ep;
  if (bias) {
    ep.kind = core::GemmEpilogue::bias;
    ep.bias = bias;
  }
  ep.c_bf16 = residual.bf16;
  backend_.gemm_epilogue(a, ep, x.bf16, weight.bf16, y.bf16, nullptr);
}

void Linear::backward(float* dx, float* dweight, const float* dy, Operand x, Operand weight,
                      int64_t N, int64_t in, int64_t out, float dx_beta,
                      const core::bf16* dy_rounded, float* dbias, float* dx_gelu_pre) {
  core::GemmArgs a;
  a.m = N, a.n = in, a.k = out, a.beta = dx_beta;
  core::GemmArgs b;
  b.trans_a = true;
  b.m = out, b.n = in, b.k = N, b.beta = 1.0f;
  core::GemmEpilogueArgs dx_ep;
  if (dx_gelu_pre) dx_ep.kind = core::GemmEpilogue::dgelu;
  core::GemmEpilogueArgs dw_ep;
  if (dbias) dw_ep = {core::GemmEpilogue::bgrad, nullptr, nullptr, dbias};
  if (x.bf16 && weight.bf16) {
    ENGINE_CHECK(!dx_gelu_pre, "model: the dgelu epilogue (dx_gelu_pre) needs f32 GEMMs");
    if (!dy_rounded) {
      // The bias gradient sums the f32 dy, not its rounding for the GEMMs.
      if (dbias) backend_.bias_backward(dbias, dy, N, out);
      dw_ep = {};
      backend_.f32_to_bf16(dy_bf16_, dy, N * out);
      dy_rounded = dy_bf16_;
    }
    backend_.gemm(a, dy_rounded, weight.bf16, dx);
    backend_.gemm_epilogue(b, dw_ep, dy_rounded, x.bf16, dweight, nullptr);
  } else {
    ENGINE_CHECK(x.f32 && dy,
                 "model: a linear layer with an f32 weight got an input or output "
                 "gradient stored only in bf16");
    a.tf32 = b.tf32 = tf32();
    backend_.gemm_epilogue(a, dx_ep, dy, weight.f32, dx, dx_gelu_pre);
    backend_.gemm_epilogue(b, dw_ep, dy, x.f32, dweight, nullptr);
  }
}

}  // namespace model
