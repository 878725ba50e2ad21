// The CPU backend's attention family (core/ops/attention.h). Head layout, rotary positions and
// causal attention, forward and backward (attention_kernels.h).
#include "core/cpu/attention_kernels.h"
#include "core/cpu/cpu_backend.h"

namespace core {

void CpuBackend::split_heads(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T,
                             int64_t H, int64_t hd) {
  cpu::split_heads(q, k, v, qkv, B, T, H, hd);
}

void CpuBackend::split_heads_backward(float* dqkv, const float* dq, const float* dk,
                                      const float* dv, int64_t B, int64_t T, int64_t H,
                                      int64_t hd) {
  cpu::split_heads_backward(dqkv, dq, dk, dv, B, T, H, hd);
}

void CpuBackend::merge_heads(float* out, const float* a, int64_t B, int64_t T, int64_t H,
                             int64_t hd) {
  cpu::merge_heads(out, a, B, T, H, hd);
}

void CpuBackend::split_heads_backward(bf16* dqkv, const float* dq, const float* dk, const float* dv,
                                      int64_t B, int64_t T, int64_t H, int64_t hd) {
  cpu::split_heads_backward(dqkv, dq, dk, dv, B, T, H, hd);
}

void CpuBackend::merge_heads_backward(float* da, const float* dout, int64_t B, int64_t T, int64_t H,
                                      int64_t hd) {
  cpu::merge_heads_backward(da, dout, B, T, H, hd);
}

void CpuBackend::qk_norm_rotary_forward(float* qr, float* kr, float* q, float* k, float* v,
                                        float* q_rstd, float* k_rstd, const float* qkv, int64_t B,
                                        int64_t T, int64_t H, int64_t hd, float eps, float base,
                                        bool truncated, const RotaryVariant& variant) {
  cpu::qk_norm_rotary_forward(qr, kr, q, k, v, q_rstd, k_rstd, qkv, B, T, H, hd, eps, base,
                              truncated, variant);
}

void CpuBackend::qk_norm_rotary_backward(float* dqkv, const float* dqr, const float* dkr,
                                         const float* dv, const float* q, const float* k,
                                         const float* q_rstd, const float* k_rstd, int64_t B,
                                         int64_t T, int64_t H, int64_t hd, float base,
                                         bool truncated, const RotaryVariant& variant) {
  cpu::qk_norm_rotary_backward(dqkv, dqr, dkr, dv, q, k, q_rstd, k_rstd, B, T, H, hd, base,
                               truncated, variant);
}

void CpuBackend::qk_norm_rotary_backward(bf16* dqkv, const float* dqr, const float* dkr,
                                         const float* dv, const float* q, const float* k,
                                         const float* q_rstd, const float* k_rstd, int64_t B,
                                         int64_t T, int64_t H, int64_t hd, float base,
                                         bool truncated, const RotaryVariant& variant) {
  cpu::qk_norm_rotary_backward(dqkv, dqr, dkr, dv, q, k, q_rstd, k_rstd, B, T, H, hd, base,
                               truncated, variant);
}

void CpuBackend::attention_out_forward(float* out, const float* y, const float* v, int64_t B,
                                       int64_t T, int64_t H, int64_t hd, const HeadCoefs& alpha,
                                       const HeadCoefs& gate) {
  cpu::attention_out_forward(out, y, v, B, T, H, hd, alpha, gate);
}

void CpuBackend::attention_out_forward(bf16* out, const bf16* y, const float* v, int64_t B,
                                       int64_t T, int64_t H, int64_t hd, const HeadCoefs& alpha,
                                       const HeadCoefs& gate) {
  cpu::attention_out_forward(out, y, v, B, T, H, hd, alpha, gate);
}

void CpuBackend::attention_out_backward(float* dy, float* dv, const float* dout, const float* y,
                                        const float* v, int64_t B, int64_t T, int64_t H, int64_t hd,
                                        const HeadCoefs& alpha, const HeadCoefs& gate) {
  cpu::attention_out_backward(dy, dv, dout, y, v, B, T, H, hd, alpha, gate);
}

void CpuBackend::attention_out_backward(float* dy, float* dv, const float* dout, const bf16* y,
                                        const float* v, int64_t B, int64_t T, int64_t H, int64_t hd,
                                        const HeadCoefs& alpha, const HeadCoefs& gate) {
  cpu::attention_out_backward(dy, dv, dout, y, v, B, T, H, hd, alpha, gate);
}

void CpuBackend::key_offset_forward(float* out, const float* k, int64_t BH, int64_t T, int64_t hd) {
  cpu::key_offset(out, k, BH, T, hd, false);
}

void CpuBackend::key_offset_backward(float* dk, const float* dout, int64_t BH, int64_t T,
                                     int64_t hd) {
  cpu::key_offset(dk, dout, BH, T, hd, true);
}

void CpuBackend::rotary_forward(float* out, const float* inp, int64_t BH, int64_t T, int64_t hd,
                                float base, bool truncated) {
  cpu::rotary_forward(out, inp, BH, T, hd, base, truncated);
}

void CpuBackend::rotary_backward(float* dinp, const float* dout, int64_t BH, int64_t T, int64_t hd,
                                 float base, bool truncated) {
  cpu::rotary_backward(dinp, dout, BH, T, hd, base, truncated);
}

void CpuBackend::attention_forward(float* out, float* lse, const float* q, const float* k,
                                   const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                                   const AttentionMask& mask, bool /*tf32: no tensor cores*/,
                                   const AttentionLayout& layout) {
  cpu::attention_forward(out, lse, q, k, v, BH, T, hd, scale, cpu::HeadParallel::kAuto, mask,
                         layout);
}

void CpuBackend::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                    const float* out, const float* lse, const float* q,
                                    const float* k, const float* v, int64_t BH, int64_t T,
                                    int64_t hd, float scale, const AttentionMask& mask,
                                    bool /*tf32: no tensor cores*/, const AttentionLayout& layout) {
  cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, BH, T, hd, scale,
                          cpu::HeadParallel::kAuto, mask, layout);
}

void CpuBackend::attention_forward(bf16* out, float* lse, const float* q, const float* k,
                                   const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                                   const AttentionMask& mask, bool /*tf32: no tensor cores*/,
                                   const AttentionLayout& layout) {
  cpu::attention_forward(out, lse, q, k, v, BH, T, hd, scale, cpu::HeadParallel::kAuto, mask,
                         layout);
}

void CpuBackend::attention_backward(bf16* dq, bf16* dk, bf16* dv, const float* dout,
                                    const bf16* out, const float* lse, const float* q,
                                    const float* k, const float* v, int64_t BH, int64_t T,
                                    int64_t hd, float scale, const AttentionMask& mask,
                                    bool /*tf32: no tensor cores*/, const AttentionLayout& layout) {
  cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, BH, T, hd, scale,
                          cpu::HeadParallel::kAuto, mask, layout);
}

void CpuBackend::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                    const bf16* out, const float* lse, const float* q,
                                    const float* k, const float* v, int64_t BH, int64_t T,
                                    int64_t hd, float scale, const AttentionMask& mask,
                                    bool /*tf32: no tensor cores*/, const AttentionLayout& layout) {
  cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, BH, T, hd, scale,
                          cpu::HeadParallel::kAuto, mask, layout);
}

void CpuBackend::attention_softmax(float* s, float* lse, int64_t BH, int64_t T,
                                   const AttentionMask& mask, int64_t head0) {
  cpu::attention_softmax(s, lse, BH, T, mask, head0);
}

void CpuBackend::attention_softmax_backward(float* dp, const float* p, const float* dout,
                                            const float* out, int64_t BH, int64_t T, int64_t hd,
                                            const AttentionMask& mask, int64_t head0,
                                            int64_t head_stride, int64_t row_stride) {
  cpu::attention_softmax_backward(dp, p, dout, out, BH, T, hd, mask, head0, head_stride,
                                  row_stride);
}

}  // namespace core
