// The CPU backend: each op forwards to the float instantiation of the templated kernels in
// cpu_kernels.h, cpu_gemm.h and cpu_linalg.h (which the tests also run in float64).
#include "core/cpu/cpu_backend.h"

#include <omp.h>

#include <cstring>
#include <string>

#include "core/check.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/cpu_kernels.h"
#include "core/cpu/cpu_linalg.h"

namespace core {

Device CpuBackend::device() const {
  return Device::cpu();
}

Allocator& CpuBackend::allocator() {
  return cpu_allocator();
}

const char* CpuBackend::name() const {
  thread_local std::string name;
  name = "cpu (OpenBLAS, " + std::to_string(omp_get_max_threads()) + " threads)";
  return name.c_str();
}

void CpuBackend::synchronize() {}

void CpuBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
}

void CpuBackend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) std::memmove(dst, src, bytes);
}

void CpuBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

void CpuBackend::gemm(const GemmArgs& args, const float* a, const float* b, float* c) {
  cpu::gemm(args, a, b, c);
}

void CpuBackend::add_bias(float* out, const float* bias, int64_t N, int64_t C) {
  cpu::add_bias(out, bias, N, C);
}

void CpuBackend::bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  cpu::bias_backward(dbias, dout, N, C);
}

void CpuBackend::add(float* out, const float* a, const float* b, int64_t n) {
  cpu::add(out, a, b, n);
}

void CpuBackend::scale(float* x, float alpha, int64_t n) {
  cpu::scale(x, alpha, n);
}

void CpuBackend::axpby(float* y, float a, const float* x, float b, int64_t n) {
  cpu::axpby(y, a, x, b, n);
}

void CpuBackend::gelu_forward(float* out, const float* inp, int64_t n) {
  cpu::gelu_forward(out, inp, n);
}

void CpuBackend::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  cpu::gelu_backward(dinp, inp, dout, n);
}

void CpuBackend::relu2_forward(float* out, const float* inp, int64_t n) {
  cpu::relu2_forward(out, inp, n);
}

void CpuBackend::relu2_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  cpu::relu2_backward(dinp, inp, dout, n);
}

double CpuBackend::sum_squares(const float* x, int64_t n) {
  return cpu::sum_squares(x, n);
}

void CpuBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int64_t N, int64_t C,
                                   float eps) {
  cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
}

void CpuBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, const float* mean,
                                    const float* rstd, int64_t N, int64_t C) {
  cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void CpuBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, int64_t N, int64_t C,
                                 float eps) {
  cpu::rmsnorm_forward(out, rstd, inp, N, C, eps);
}

void CpuBackend::rmsnorm_backward(float* dinp, const float* dout, const float* inp,
                                  const float* rstd, int64_t N, int64_t C) {
  cpu::rmsnorm_backward(dinp, dout, inp, rstd, N, C);
}

void CpuBackend::softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  cpu::softmax_forward(out, inp, N, C);
}

void CpuBackend::softmax_backward(float* dinp, const float* dout, const float* out, int64_t N,
                                  int64_t C) {
  cpu::softmax_backward(dinp, dout, out, N, C);
}

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int64_t B, int64_t T, int64_t D) {
  cpu::embedding_forward(out, tokens, wte, wpe, B, T, D);
}

void CpuBackend::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, int64_t B, int64_t T, int64_t D) {
  cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, D);
}

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

void CpuBackend::merge_heads_backward(float* da, const float* dout, int64_t B, int64_t T, int64_t H,
                                      int64_t hd) {
  cpu::merge_heads_backward(da, dout, B, T, H, hd);
}

void CpuBackend::rotary_forward(float* out, const float* inp, int64_t BH, int64_t T, int64_t hd,
                                float base) {
  cpu::rotary_forward(out, inp, BH, T, hd, base);
}

void CpuBackend::rotary_backward(float* dinp, const float* dout, int64_t BH, int64_t T, int64_t hd,
                                 float base) {
  cpu::rotary_backward(dinp, dout, BH, T, hd, base);
}

void CpuBackend::attention_forward(float* out, float* att, const float* q, const float* k,
                                   const float* v, int64_t BH, int64_t T, int64_t hd, float scale) {
  cpu::attention_forward(out, att, q, k, v, BH, T, hd, scale);
}

void CpuBackend::attention_backward(float* dq, float* dk, float* dv, float* datt, const float* dout,
                                    const float* att, const float* q, const float* k,
                                    const float* v, int64_t BH, int64_t T, int64_t hd,
                                    float scale) {
  cpu::attention_backward(dq, dk, dv, datt, dout, att, q, k, v, BH, T, hd, scale);
}

void CpuBackend::cross_entropy(float* losses, float* dlogits, const float* logits,
                               const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                               float softcap, float dloss_scale) {
  cpu::cross_entropy(losses, dlogits, logits, targets, N, V, Vp, softcap, dloss_scale);
}

void CpuBackend::gather_rows(float* out, const float* src, const int32_t* index,
                             const float* weight, int64_t n, int64_t D) {
  cpu::gather_rows(out, src, index, weight, n, D);
}

void CpuBackend::scatter_add_rows(float* dst, const float* src, const int32_t* index,
                                  const float* weight, int64_t n, int64_t D) {
  cpu::scatter_add_rows(dst, src, index, weight, n, D);
}

void CpuBackend::row_dot(float* out, const float* a, const float* b, int64_t n, int64_t D) {
  cpu::row_dot(out, a, b, n, D);
}

// ---- model: loss reduction, MoE routing ---------------------------------------------------------

void CpuBackend::mean_loss(float* mean, const float* losses, int64_t n) {
  cpu::mean_loss(mean, losses, n);
}

void CpuBackend::accumulate_loss(double* acc, const float* terms, int64_t k) {
  cpu::accumulate_loss(acc, terms, k);
}

void CpuBackend::moe_route(const MoeRouting& r, float* aux_loss, const float* probs, int64_t N,
                           int64_t E, int64_t K, float aux_weight) {
  cpu::moe_route(r, aux_loss, probs, N, E, K, aux_weight);
}

void CpuBackend::moe_router_backward(float* dprobs, const MoeRouting& r, const float* dgate,
                                     int64_t N, int64_t E, int64_t K, float aux_weight) {
  cpu::moe_router_backward(dprobs, r, dgate, N, E, K, aux_weight);
}

void CpuBackend::qr(float* q, float* r, const float* a, int64_t m, int64_t n, int64_t batch) {
  cpu::qr(q, r, a, m, n, batch);
}

void CpuBackend::eigh(float* w, float* v, const float* a, int64_t n, int64_t batch) {
  cpu::eigh(w, v, a, n, batch);
}

void CpuBackend::eigh_many(std::span<const EighTask> tasks) {
  cpu::eigh_many(tasks);
}

void CpuBackend::qr_many(std::span<const QrTask> tasks) {
  cpu::qr_many(tasks);
}

void CpuBackend::svd(float* u, float* s, float* vt, const float* a, int64_t m, int64_t n,
                     int64_t batch) {
  cpu::svd(u, s, vt, a, m, n, batch);
}

double CpuBackend::sum_squares_many(std::span<const std::span<const float>> xs) {
  double total = 0;
  for (std::span<const float> x : xs)
    total += cpu::sum_squares(x.data(), static_cast<int64_t>(x.size()));
  return total;
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace core
