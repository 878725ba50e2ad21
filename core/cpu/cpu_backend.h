// CPU backend: oneDNN GEMM (OpenBLAS in float64), LAPACKE (OpenBLAS) linear algebra, OpenMP loops
// for the fused ops; the kernels are templates in cpu_gemm.h, <family>_kernels.h and cpu_linalg.h,
// instantiated for float.
#pragma once

#include "core/backend.h"

namespace core {

class CpuBackend final : public Backend {
 public:
  Device device() const override;
  Allocator& allocator() override;
  const char* name() const override;
  void synchronize() override;
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void gemm(const GemmArgs& args, const float* a, const float* b, float* c) override;
  void gemm(const GemmArgs& args, const bf16* a, const bf16* b, float* c) override;
  void gemm(const GemmArgs& args, const bf16* a, const bf16* b, bf16* c) override;
  void gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const float* a,
                     const float* b, float* d, float* aux) override;
  void gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a, const bf16* b,
                     float* d, float* aux) override;
  void gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a, const bf16* b,
                     bf16* d, bf16* aux) override;
  std::string bf16_gemm_slow_reason() const override;
  std::string tf32_gemm_slow_reason() const override;
  void fp8_encode(fp8* out, const float* in, int64_t n, float scale, kmath::Fp8 format) override;
  void fp8_encode(fp8* out, const bf16* in, int64_t n, float scale, kmath::Fp8 format) override;
  void gemm_fp8(const GemmArgs& args, const fp8* a, kmath::Fp8 a_format, const fp8* b,
                kmath::Fp8 b_format, float* c) override;
  void fp8_encode_scaled(fp8* out, const float* in, int64_t n, const float* scale,
                         kmath::Fp8 format) override;
  void fp8_encode_scaled(fp8* out, const bf16* in, int64_t n, const float* scale,
                         kmath::Fp8 format) override;
  void fp8_scale_from_amax(float* scale, const float* amax, int64_t n, float factor) override;
  void gemm_fp8_scaled(const GemmArgs& args, const fp8* a, kmath::Fp8 a_format,
                       const float* scale_a, const fp8* b, kmath::Fp8 b_format,
                       const float* scale_b, float* c) override;
  std::string fp8_gemm_missing_reason() const override;
  void add_bias(float* out, const float* bias, int64_t N, int64_t C) override;
  void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) override;
  void bias_backward(float* dbias, const bf16* dout, int64_t N, int64_t C) override;
  void add(float* out, const float* a, const float* b, int64_t n) override;
  void scale(float* x, float alpha, int64_t n) override;
  void scale_many(std::span<const std::span<float>> xs, float alpha) override;
  void scale_many_by(std::span<const std::span<float>> xs, const float* alpha) override;
  void axpby(float* y, float a, const float* x, float b, int64_t n) override;
  void scalar_mix(float* out, const float* wa, const float* a, const float* wb, const float* b,
                  int64_t n) override;
  void scalar_mix_backward(float* da, float* db, float* dwa, float* dwb, const float* wa,
                           const float* a, const float* wb, const float* b, const float* dout,
                           int64_t n) override;
  void scalar_mix(bf16* out, const float* wa, const bf16* a, const float* wb, const bf16* b,
                  int64_t n) override;
  void scalar_mix_backward(float* da, float* db, float* dwa, float* dwb, const float* wa,
                           const bf16* a, const float* wb, const bf16* b, const float* dout,
                           int64_t n) override;
  void coef_add(float* out, const float* x, const float* c, int64_t c_stride, const float* src,
                int64_t N, int64_t D) override;
  void coef_add(bf16* out, const bf16* x, const float* c, int64_t c_stride, const float* src,
                int64_t N, int64_t D) override;
  void coef_add_backward(float* dsrc, float* dc, const float* c, int64_t c_stride, const float* src,
                         const float* dout, int64_t N, int64_t D) override;
  void f32_to_bf16(bf16* out, const float* in, int64_t n) override;
  void bf16_to_f32(float* out, const bf16* in, int64_t n) override;
  void gelu_forward(float* out, const float* inp, int64_t n) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  void relu2_forward(float* out, const float* inp, int64_t n) override;
  void relu2_backward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  void row_scale_add(float* out, const float* c, int64_t c_stride, const float* a, int64_t rows,
                     int64_t cols, bool accumulate) override;
  void row_scale_add(bf16* out, const float* c, int64_t c_stride, const bf16* a, int64_t rows,
                     int64_t cols, bool accumulate) override;
  void row_scale_add_backward(float* da, float* dc, const float* c, int64_t c_stride,
                              const float* a, const float* dout, int64_t rows,
                              int64_t cols) override;
  void row_scale_add_backward(float* da, float* dc, const float* c, int64_t c_stride, const bf16* a,
                              const float* dout, int64_t rows, int64_t cols) override;
  void sigmoid_forward(float* out, const float* inp, float gain, int64_t n) override;
  void sigmoid_backward(float* dinp, const float* inp, const float* dout, float gain,
                        int64_t n) override;
  void sigmoid_scale(float* out, const float* lambda, const float* c, int64_t c_stride,
                     int64_t n) override;
  void sigmoid_scale_backward(float* dc, float* dlambda, const float* lambda, const float* c,
                              int64_t c_stride, const float* dout, int64_t n) override;
  void gelu_erf_forward(float* out, const float* inp, int64_t n) override;
  void gelu_erf_backward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  void gelu_forward(bf16* out, const float* inp, int64_t n) override;
  void gelu_backward(bf16* dinp, const float* inp, const float* dout, int64_t n) override;
  void relu2_forward(bf16* out, const float* inp, int64_t n) override;
  void relu2_backward(bf16* dinp, const float* inp, const float* dout, int64_t n) override;
  double sum_squares(const float* x, int64_t n) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int64_t N, int64_t C,
                         float eps) override;
  void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int64_t N, int64_t C, float eps) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int64_t N, int64_t C) override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, int64_t N, int64_t C,
                       float eps) override;
  void rmsnorm_forward(bf16* out, float* rstd, const float* inp, int64_t N, int64_t C,
                       float eps) override;
  void rmsnorm_backward(float* dinp, const float* dout, const float* inp, const float* rstd,
                        int64_t N, int64_t C) override;
  void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const float* weight,
                         const float* bias, int64_t N, int64_t C, float eps) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const bf16* inp, const float* weight, const float* mean,
                          const float* rstd, int64_t N, int64_t C) override;
  void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, int64_t N, int64_t C,
                       float eps) override;
  void rmsnorm_backward(float* dinp, const float* dout, const bf16* inp, const float* rstd,
                        int64_t N, int64_t C) override;
  void softmax_forward(float* out, const float* inp, int64_t N, int64_t C) override;
  void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N,
                        int64_t C) override;
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int64_t B, int64_t T, int64_t D) override;
  void embedding_forward(bf16* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int64_t B, int64_t T, int64_t D) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int64_t B, int64_t T, int64_t D) override;
  void bigram_hash(int32_t* ids, const int32_t* tokens, int64_t B, int64_t T,
                   int64_t table_rows) override;
  void bigram_signs(float* x, const int32_t* tokens, const float* signs, int64_t B, int64_t T,
                    int64_t D, int64_t sign_rows) override;
  void smear_forward(float* out, float* gate, const float* x, const float* w, const float* lambda,
                     int64_t B, int64_t T, int64_t D, int64_t K) override;
  void smear_backward(float* dx, float* dw, float* dlambda, const float* x, const float* w,
                      const float* lambda, const float* gate, const float* dout, int64_t B,
                      int64_t T, int64_t D, int64_t K) override;
  void split_heads(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T, int64_t H,
                   int64_t hd) override;
  void split_heads_backward(float* dqkv, const float* dq, const float* dk, const float* dv,
                            int64_t B, int64_t T, int64_t H, int64_t hd) override;
  void split_heads_backward(bf16* dqkv, const float* dq, const float* dk, const float* dv,
                            int64_t B, int64_t T, int64_t H, int64_t hd) override;
  void merge_heads(float* out, const float* a, int64_t B, int64_t T, int64_t H,
                   int64_t hd) override;
  void merge_heads_backward(float* da, const float* dout, int64_t B, int64_t T, int64_t H,
                            int64_t hd) override;
  void qk_norm_rotary_forward(float* qr, float* kr, float* q, float* k, float* v, float* q_rstd,
                              float* k_rstd, const float* qkv, int64_t B, int64_t T, int64_t H,
                              int64_t hd, float eps, float base, bool truncated,
                              const RotaryVariant& variant = {}) override;
  void qk_norm_rotary_backward(float* dqkv, const float* dqr, const float* dkr, const float* dv,
                               const float* q, const float* k, const float* q_rstd,
                               const float* k_rstd, int64_t B, int64_t T, int64_t H, int64_t hd,
                               float base, bool truncated,
                               const RotaryVariant& variant = {}) override;
  void qk_norm_rotary_backward(bf16* dqkv, const float* dqr, const float* dkr, const float* dv,
                               const float* q, const float* k, const float* q_rstd,
                               const float* k_rstd, int64_t B, int64_t T, int64_t H, int64_t hd,
                               float base, bool truncated,
                               const RotaryVariant& variant = {}) override;
  void attention_out_forward(float* out, const float* y, const float* v, int64_t B, int64_t T,
                             int64_t H, int64_t hd, const HeadCoefs& alpha,
                             const HeadCoefs& gate) override;
  void attention_out_forward(bf16* out, const bf16* y, const float* v, int64_t B, int64_t T,
                             int64_t H, int64_t hd, const HeadCoefs& alpha,
                             const HeadCoefs& gate) override;
  void attention_out_backward(float* dy, float* dv, const float* dout, const float* y,
                              const float* v, int64_t B, int64_t T, int64_t H, int64_t hd,
                              const HeadCoefs& alpha, const HeadCoefs& gate) override;
  void attention_out_backward(float* dy, float* dv, const float* dout, const bf16* y,
                              const float* v, int64_t B, int64_t T, int64_t H, int64_t hd,
                              const HeadCoefs& alpha, const HeadCoefs& gate) override;
  void key_offset_forward(float* out, const float* k, int64_t BH, int64_t T, int64_t hd) override;
  void key_offset_backward(float* dk, const float* dout, int64_t BH, int64_t T,
                           int64_t hd) override;
  void rotary_forward(float* out, const float* inp, int64_t BH, int64_t T, int64_t hd, float base,
                      bool truncated = false) override;
  void rotary_backward(float* dinp, const float* dout, int64_t BH, int64_t T, int64_t hd,
                       float base, bool truncated = false) override;
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         int64_t BH, int64_t T, int64_t hd, float scale,
                         const AttentionMask& mask = {}, bool tf32 = false,
                         const AttentionLayout& layout = {}) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          int64_t BH, int64_t T, int64_t hd, float scale,
                          const AttentionMask& mask = {}, bool tf32 = false,
                          const AttentionLayout& layout = {}) override;
  void attention_forward(bf16* out, float* lse, const float* q, const float* k, const float* v,
                         int64_t BH, int64_t T, int64_t hd, float scale,
                         const AttentionMask& mask = {}, bool tf32 = false,
                         const AttentionLayout& layout = {}) override;
  void attention_backward(bf16* dq, bf16* dk, bf16* dv, const float* dout, const bf16* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          int64_t BH, int64_t T, int64_t hd, float scale,
                          const AttentionMask& mask = {}, bool tf32 = false,
                          const AttentionLayout& layout = {}) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const bf16* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          int64_t BH, int64_t T, int64_t hd, float scale,
                          const AttentionMask& mask = {}, bool tf32 = false,
                          const AttentionLayout& layout = {}) override;
  void attention_softmax(float* s, float* lse, int64_t BH, int64_t T, const AttentionMask& mask,
                         int64_t head0) override;
  void attention_softmax_backward(float* dp, const float* p, const float* dout, const float* out,
                                  int64_t BH, int64_t T, int64_t hd, const AttentionMask& mask,
                                  int64_t head0, int64_t head_stride = 0,
                                  int64_t row_stride = 0) override;
  using ClassifierOps::cross_entropy;  // the plain forms
  void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                     int64_t N, int64_t V, int64_t Vp, float softcap, float dloss_scale,
                     const kmath::LossTerms& terms) override;
  void cross_entropy(float* losses, bf16* dlogits, const bf16* logits, const int32_t* targets,
                     int64_t N, int64_t V, int64_t Vp, float softcap, float dloss_scale,
                     const kmath::LossTerms& terms) override;
  void gather_rows(float* out, const float* src, const int32_t* index, const float* weight,
                   int64_t n, int64_t D) override;
  void gather_rows(bf16* out, const bf16* src, const int32_t* index, int64_t n, int64_t D) override;
  void scatter_add_rows(float* dst, const float* src, const int32_t* index, const float* weight,
                        int64_t n, int64_t D) override;
  void combine_rows(bf16* out, const bf16* base, const float* rows, const int32_t* slot_row,
                    const float* gate, int64_t N, int64_t K, int64_t D) override;
  void row_dot(float* out, const float* a, const float* b, int64_t n, int64_t D) override;
  void mean_loss(float* mean, const float* losses, int64_t n) override;
  void accumulate_loss(double* acc, const float* terms, int64_t k) override;
  void moe_route(const MoeRouting& r, float* aux_loss, const float* probs, int64_t N, int64_t E,
                 int64_t K, float aux_weight) override;
  void moe_router_backward(float* dprobs, const MoeRouting& r, const float* dgate, int64_t N,
                           int64_t E, int64_t K, float aux_weight) override;
  void qr(float* q, float* r, const float* a, int64_t m, int64_t n, int64_t batch) override;
  void eigh(float* w, float* v, const float* a, int64_t n, int64_t batch) override;
  void svd(float* u, float* s, float* vt, const float* a, int64_t m, int64_t n,
           int64_t batch) override;
  void eigh_many(std::span<const EighTask> tasks) override;
  void qr_many(std::span<const QrTask> tasks) override;
  void gram_many(std::span<const GramTask> tasks) override;
  double sum_squares_many(std::span<const std::span<const float>> xs) override;
  void sum_squares_many(std::span<const std::span<const float>> xs, double* out) override;
  void grad_clip_scale(float* scale, const double* sum_squares, double mean,
                       double max_norm) override;

  void copy_block_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                     int64_t cols) override;
  void set_identity(float* q, int64_t n) override;
  void lerp(float* a, const float* b, float w, int64_t n) override;
  void add_scaled(float* y, float a, const float* x, int64_t n) override;
  void column_dots(float* out, const float* a, const float* b, int64_t rows, int64_t cols) override;
  void argsort_descending(int32_t* order, const float* x, int64_t n) override;
  void gather_columns(float* out, const float* src, const int32_t* index, int64_t rows,
                      int64_t cols) override;
  void reverse_columns(float* out, const float* src, int64_t rows, int64_t cols) override;
  void canonicalize_column_signs(float* q, int64_t rows, int64_t cols) override;
  double sum_squares_in_order(const float* x, int64_t n) override;
  void abs_max(float* out, const float* x, int64_t n) override;
  void abs_max(float* out, const bf16* x, int64_t n) override;

  TimeMark mark() override;
  double elapsed_ms(const TimeMark& from, const TimeMark& to) override;
};

}  // namespace core
