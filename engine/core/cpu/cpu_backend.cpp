#include "engine/core/cpu/cpu_backend.h"

#include <cblas.h>
#include <cstring>

#include "engine/core/check.h"

namespace core {

Device CpuBackend::device() const {
  return Device::cpu();
}

Allocator& CpuBackend::allocator() {
  return cpu_allocator();
}

const char* CpuBackend::name() const {
  return "cpu";
}

void CpuBackend::synchronize() {
}

void CpuBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  std::memcpy(host_dst, src, bytes);
}

void CpuBackend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  std::memcpy(dst, host_src, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void CpuBackend::fill_zero(void* dst, size_t bytes) {
  std::memset(dst, 0, bytes);
}

void CpuBackend::gemm(const GemmArgs& args, const float* a, const float* b, float* c) {
  int64_t lda = args.lda ? args.lda : (args.trans_a ? args.m : args.k);
  int64_t ldb = args.ldb ? args.ldb : (args.trans_b ? args.k : args.n);
  int64_t ldc = args.ldc ? args.ldc : args.n;
  for (int64_t i = 0; i < args.batch; ++i) {
    cblas_sgemm(CblasRowMajor, args.trans_a ? CblasTrans : CblasNoTrans,
                args.trans_b ? CblasTrans : CblasNoTrans, args.m, args.n, args.k, args.alpha,
                a + i * args.stride_a, lda, b + i * args.stride_b, ldb, args.beta,
                c + i * args.stride_c, ldc);
  }
}

void CpuBackend::add_bias(float* out, const float* bias, int64_t N, int64_t C) {
  ENGINE_FAIL("cpu backend: add_bias is missing");
}

void CpuBackend::bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  ENGINE_FAIL("cpu backend: bias_backward is missing");
}

void CpuBackend::add(float* out, const float* a, const float* b, int64_t n) {
  ENGINE_FAIL("cpu backend: add is missing");
}

void CpuBackend::accumulate(float* dst, const float* src, int64_t n) {
  ENGINE_FAIL("cpu backend: accumulate is missing");
}

void CpuBackend::scale(float* x, float alpha, int64_t n) {
  ENGINE_FAIL("cpu backend: scale is missing");
}

void CpuBackend::axpby(float* y, float a, const float* x, float b, int64_t n) {
  ENGINE_FAIL("cpu backend: axpby is missing");
}

void CpuBackend::gelu_forward(float* out, const float* inp, int64_t n) {
  ENGINE_FAIL("cpu backend: gelu_forward is missing");
}

void CpuBackend::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  ENGINE_FAIL("cpu backend: gelu_backward is missing");
}

void CpuBackend::relu2_forward(float* out, const float* inp, int64_t n) {
  ENGINE_FAIL("cpu backend: relu2_forward is missing");
}

void CpuBackend::relu2_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  ENGINE_FAIL("cpu backend: relu2_backward is missing");
}

double CpuBackend::sum_squares(const float* x, int64_t n) {
  ENGINE_FAIL("cpu backend: sum_squares is missing");
}

void CpuBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C, float eps) {
  ENGINE_FAIL("cpu backend: layernorm_forward is missing");
}

void CpuBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  ENGINE_FAIL("cpu backend: layernorm_backward is missing");
}

void CpuBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, int64_t N, int64_t C, float eps) {
  ENGINE_FAIL("cpu backend: rmsnorm_forward is missing");
}

void CpuBackend::rmsnorm_backward(float* dinp, const float* dout, const float* inp, const float* rstd, int64_t N, int64_t C) {
  ENGINE_FAIL("cpu backend: rmsnorm_backward is missing");
}

void CpuBackend::softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  ENGINE_FAIL("cpu backend: softmax_forward is missing");
}

void CpuBackend::softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C) {
  ENGINE_FAIL("cpu backend: softmax_backward is missing");
}

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T, int64_t D) {
  ENGINE_FAIL("cpu backend: embedding_forward is missing");
}

void CpuBackend::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T, int64_t D) {
  ENGINE_FAIL("cpu backend: embedding_backward is missing");
}

void CpuBackend::split_heads(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t hd) {
  ENGINE_FAIL("cpu backend: split_heads is missing");
}

void CpuBackend::split_heads_backward(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t B, int64_t T, int64_t H, int64_t hd) {
  ENGINE_FAIL("cpu backend: split_heads_backward is missing");
}

void CpuBackend::merge_heads(float* out, const float* a, int64_t B, int64_t T, int64_t H, int64_t hd) {
  ENGINE_FAIL("cpu backend: merge_heads is missing");
}

void CpuBackend::merge_heads_backward(float* da, const float* dout, int64_t B, int64_t T, int64_t H, int64_t hd) {
  ENGINE_FAIL("cpu backend: merge_heads_backward is missing");
}

void CpuBackend::rotary_forward(float* out, const float* inp, int64_t BH, int64_t T, int64_t hd, float base) {
  ENGINE_FAIL("cpu backend: rotary_forward is missing");
}

void CpuBackend::rotary_backward(float* dinp, const float* dout, int64_t BH, int64_t T, int64_t hd, float base) {
  ENGINE_FAIL("cpu backend: rotary_backward is missing");
}

void CpuBackend::attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int64_t BH, int64_t T, int64_t hd, float scale) {
  ENGINE_FAIL("cpu backend: attention_forward is missing");
}

void CpuBackend::attention_backward(float* dq, float* dk, float* dv, float* datt, const float* dout, const float* att, const float* q, const float* k, const float* v, int64_t BH, int64_t T, int64_t hd, float scale) {
  ENGINE_FAIL("cpu backend: attention_backward is missing");
}

void CpuBackend::cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V, int64_t Vp, float softcap, float dloss_scale) {
  ENGINE_FAIL("cpu backend: cross_entropy is missing");
}

void CpuBackend::gather_rows(float* out, const float* src, const int32_t* index, const float* weight, int64_t n, int64_t D) {
  ENGINE_FAIL("cpu backend: gather_rows is missing");
}

void CpuBackend::scatter_add_rows(float* dst, const float* src, const int32_t* index, const float* weight, int64_t n, int64_t D) {
  ENGINE_FAIL("cpu backend: scatter_add_rows is missing");
}

void CpuBackend::row_dot(float* out, const float* a, const float* b, int64_t n, int64_t D) {
  ENGINE_FAIL("cpu backend: row_dot is missing");
}

void CpuBackend::qr(float* q, float* r, const float* a, int64_t m, int64_t n, int64_t batch) {
  ENGINE_FAIL("cpu backend: qr is missing");
}

void CpuBackend::eigh(float* w, float* v, const float* a, int64_t n, int64_t batch) {
  ENGINE_FAIL("cpu backend: eigh is missing");
}

void CpuBackend::svd(float* u, float* s, float* vt, const float* a, int64_t m, int64_t n, int64_t batch) {
  ENGINE_FAIL("cpu backend: svd is missing");
}

void CpuBackend::newton_schulz(float* x, int64_t m, int64_t n, const NewtonSchulzSchedule& schedule, int64_t batch) {
  ENGINE_FAIL("cpu backend: newton_schulz is missing");
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace core
