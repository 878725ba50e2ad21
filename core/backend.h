// The compute floor: coarse, fused operations in the style of llm.c, general ones only, grouped
// by op family (memory, GEMM, elementwise, norms, embeddings, attention, classifier, MoE routing,
// reductions, linear algebra); one implementation per device (cpu/cpu_backend, cuda/cuda_backend)
// with one file per family. Everything above (model, optimizers) calls these and never touches a
// device API directly; an optimizer's own kernels live in its folder (optim/<family>/).
//
// Conventions
// - Pointers are device pointers of this backend; matrices are row-major, f32.
// - Shapes: N rows (N = B*T tokens), C or D columns; attention tensors are [B, H, T, hd]
//   ("BH" = B*H independent heads); logits are [N, Vp] with only the first V columns real.
// - Forward ops overwrite their outputs. Backward ops ACCUMULATE (+=) into every gradient they
//   produce (dinp, dweight, ...), so residual branches and tied weights sum naturally; zero the
//   gradient buffers once per step. Where an op says "in place allowed", out may equal inp.
// - Ops run in stream order; synchronize() waits for everything issued.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/allocator.h"
#include "core/device.h"

namespace core {

// C = alpha * op(A) @ op(B) + beta * C for `batch` matrices at fixed strides.
// op(A) is [m, k], op(B) is [k, n], C is [m, n]; leading dimensions default to the packed ones
// (lda = trans_a ? m : k, ldb = trans_b ? k : n, ldc = n) when left at 0.
struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;  // 1.0f accumulates into C (gradients)
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch members
};

// GemmArgs with the packed leading dimensions filled in, after checking that every dimension,
// leading dimension and stride is consistent (errors name the call's sizes). Both backends
// resolve their arguments here, so they accept and refuse the same calls.
GemmArgs resolve_gemm_args(const GemmArgs& args);

// One symmetric eigendecomposition of a list solved together (eigh_many): a [n, n] -> w [n]
// ascending, eigenvectors as the columns of v [n, n], exactly as eigh() lays them out.
struct EighTask {
  const float* a = nullptr;
  float* w = nullptr;
  float* v = nullptr;
  int64_t n = 0;
};

// One thin QR of a list solved together (qr_many): the Q factor q [m, min(m, n)] of a [m, n],
// bit for bit the q that qr() returns (R is not kept).
struct QrTask {
  const float* a = nullptr;
  float* q = nullptr;
  int64_t m = 0;
  int64_t n = 0;
};

// The device arrays of one MoE layer's routing (N tokens, E experts, K experts per token):
// written by Backend::moe_route, read by the dispatch (row_token, row_gate, offset) and by
// Backend::moe_router_backward. The caller owns the memory. The backends use the float
// instance; the CPU kernel tests also run the double one.
template <typename T>
struct MoeRoutingOf {
  int32_t* chosen = nullptr;     // [N, K] experts of each token, most probable first
  int32_t* slot_row = nullptr;   // [N, K] dispatch row of each (token, slot)
  int32_t* row_token = nullptr;  // [N*K] token of each row (by expert, then by token)
  T* row_gate = nullptr;         // [N*K] renormalised gate of each row
  T* sel_sum = nullptr;          // [N] sum of each token's chosen probabilities
  T* frac = nullptr;             // [E] fraction of the tokens routed to each expert
  int32_t* offset = nullptr;     // [E + 1] first row of each expert; offset[E] = N*K
  double* mass = nullptr;        // [E] scratch: sum over tokens of each expert's probability
};
using MoeRouting = MoeRoutingOf<float>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  virtual const char* name() const = 0;  // "cpu (OpenBLAS, 2 threads)", "cuda:0 (H100)"
  virtual void synchronize() = 0;

  // ---- memory and copies ------------------------------------------------------------------------
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // dst [rows, cols] (row stride dst_ld) <- src [rows, cols] (row stride src_ld): a block of a
  // matrix, or a matrix into a block (a stack of matrices, a gathered part). dst and src must not
  // overlap.
  virtual void copy_block_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld,
                             int64_t rows, int64_t cols) = 0;
  // q [n, n] <- the identity.
  virtual void set_identity(float* q, int64_t n) = 0;

  // ---- GEMM -------------------------------------------------------------------------------------
  virtual void gemm(const GemmArgs& args, const float* a, const float* b, float* c) = 0;
  // out[N, C] += bias[C] broadcast over rows; dbias[C] += column sums of dout[N, C].
  virtual void add_bias(float* out, const float* bias, int64_t N, int64_t C) = 0;
  virtual void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) = 0;

  // ---- elementwise and activations --------------------------------------------------------------
  virtual void add(float* out, const float* a, const float* b, int64_t n) = 0;    // in place ok
  virtual void scale(float* x, float alpha, int64_t n) = 0;                       // x *= alpha
  virtual void axpby(float* y, float a, const float* x, float b, int64_t n) = 0;  // y = a x + b y
  // a <- torch.lerp(a, b, w) over n elements, in float (kmath::lerp).
  virtual void lerp(float* a, const float* b, float w, int64_t n) = 0;
  // y <- y + a x over n elements, in float (kmath::add_scaled); x may equal y.
  virtual void add_scaled(float* y, float a, const float* x, int64_t n) = 0;
  // GELU, tanh form: 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))).
  virtual void gelu_forward(float* out, const float* inp, int64_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;
  // ReLU^2: max(u, 0)^2.
  virtual void relu2_forward(float* out, const float* inp, int64_t n) = 0;
  virtual void relu2_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;

  // ---- norms: normalisation over the last dimension of [N, C] -----------------------------------
  // LayerNorm with weight and bias; saves mean[N], rstd[N] for the backward.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int64_t N, int64_t C,
                                 float eps) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int64_t N, int64_t C) = 0;
  // RMSNorm without weight: out = inp / sqrt(mean(inp^2) + eps); saves rstd[N].
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, int64_t N, int64_t C,
                               float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, const float* dout, const float* inp, const float* rstd,
                                int64_t N, int64_t C) = 0;
  // Row softmax of [N, C] (router probabilities); backward from the saved output.
  virtual void softmax_forward(float* out, const float* inp, int64_t N, int64_t C) = 0;
  virtual void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N,
                                int64_t C) = 0;

  // ---- embeddings -------------------------------------------------------------------------------
  // out[b, t, :] = wte[tokens[b, t], :] (+ wpe[t, :] when wpe is not null).
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int64_t B, int64_t T, int64_t D) = 0;
  // dwte[tokens[b, t], :] += dout[b, t, :]; dwpe[t, :] += sum_b dout[b, t, :] when dwpe not null.
  // A repeated token's rows add in position order on both backends (deterministic).
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int64_t B, int64_t T, int64_t D) = 0;

  // ---- attention (causal, multi-head) -----------------------------------------------------------
  // qkv [B, T, 3, H, hd] (the output of the fused QKV projection) -> q, k, v each [B, H, T, hd].
  virtual void split_heads(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T,
                           int64_t H, int64_t hd) = 0;
  virtual void split_heads_backward(float* dqkv, const float* dq, const float* dk, const float* dv,
                                    int64_t B, int64_t T, int64_t H, int64_t hd) = 0;
  // a [B, H, T, hd] -> out [B, T, H*hd], and back.
  virtual void merge_heads(float* out, const float* a, int64_t B, int64_t T, int64_t H,
                           int64_t hd) = 0;
  virtual void merge_heads_backward(float* da, const float* dout, int64_t B, int64_t T, int64_t H,
                                    int64_t hd) = 0;
  // Rotary embedding on x [BH, T, hd], in place allowed: for position t, half = hd/2,
  // inv_j = base^(-j/half), pairs (x_j, x_{j+half}) rotated by angle t*inv_j:
  // x_j' = x_j cos + x_{j+half} sin, x_{j+half}' = -x_j sin + x_{j+half} cos.
  // The backward applies the transposed rotation to dout and accumulates into dinp.
  virtual void rotary_forward(float* out, const float* inp, int64_t BH, int64_t T, int64_t hd,
                              float base) = 0;
  virtual void rotary_backward(float* dinp, const float* dout, int64_t BH, int64_t T, int64_t hd,
                               float base) = 0;
  // out = softmax(q k^T * scale + causal mask) v for BH heads of [T, hd]; saves the
  // probabilities att [BH, T, T] (entries above the diagonal are zero).
  virtual void attention_forward(float* out, float* att, const float* q, const float* k,
                                 const float* v, int64_t BH, int64_t T, int64_t hd,
                                 float scale) = 0;
  // datt is scratch [BH, T, T]; dq, dk, dv accumulate.
  virtual void attention_backward(float* dq, float* dk, float* dv, float* datt, const float* dout,
                                  const float* att, const float* q, const float* k, const float* v,
                                  int64_t BH, int64_t T, int64_t hd, float scale) = 0;

  // ---- classifier and loss ----------------------------------------------------------------------
  // Fused softmax cross-entropy over the first V of Vp columns, with optional logit soft-cap
  // z' = softcap * tanh(z / softcap) (softcap <= 0: off). losses[N] gets each row's loss.
  // When dlogits is not null it is OVERWRITTEN (not accumulated) with dloss_scale * d loss_row /
  // d logits (the chain through the soft-cap included) and zeros in the padded columns; dlogits
  // may alias logits. dloss_scale is 1/N for a mean loss.
  virtual void cross_entropy(float* losses, float* dlogits, const float* logits,
                             const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                             float softcap, float dloss_scale) = 0;
  // mean[0] = float(sum_i losses[i] / n) with the sum in float64: in index order on the CPU, in a
  // fixed tree order on CUDA (deterministic, equal to the CPU up to float64 rounding).
  virtual void mean_loss(float* mean, const float* losses, int64_t n) = 0;
  // acc[0] += double(terms[0] + ... + terms[k - 1]), the terms added in float in order: one
  // micro-step's objective (cross-entropy + auxiliary loss) into the step's float64 loss sum,
  // which stays on the device until the step reads it once.
  virtual void accumulate_loss(double* acc, const float* terms, int64_t k) = 0;

  // ---- MoE routing, row gather / scatter --------------------------------------------------------
  // out[i, :] = src[index[i], :] * (weight ? weight[i] : 1) for i < n.
  virtual void gather_rows(float* out, const float* src, const int32_t* index, const float* weight,
                           int64_t n, int64_t D) = 0;
  // dst[index[i], :] += src[i, :] * (weight ? weight[i] : 1); repeated indices add in the order
  // of i on both backends, so the result is the same from run to run.
  virtual void scatter_add_rows(float* dst, const float* src, const int32_t* index,
                                const float* weight, int64_t n, int64_t D) = 0;
  // out[i] = dot(a[i, :], b[i, :]) for i < n (the gradient of a per-row weight).
  virtual void row_dot(float* out, const float* a, const float* b, int64_t n, int64_t D) = 0;
  // Top-k routing of probs [N, E] (softmax rows) into r: each token's K most probable experts
  // (ties to the lower expert index), gates renormalised over them (p / sum of the chosen p),
  // the dispatch order (rows grouped by expert, tokens ascending within an expert) and the
  // expert offsets. Adds the load-balancing loss aux_weight * E * sum_e f_e P_e (f_e: fraction
  // of the tokens routed to e, P_e: mean probability of e) to aux_loss[0].
  virtual void moe_route(const MoeRouting& r, float* aux_loss, const float* probs, int64_t N,
                         int64_t E, int64_t K, float aux_weight) = 0;
  // dprobs [N, E] += the gradient through the renormalised gates, from dgate [N*K] (one value
  // per dispatch row), plus the aux loss's aux_weight * E * f_e / N (f_e held constant).
  virtual void moe_router_backward(float* dprobs, const MoeRouting& r, const float* dgate,
                                   int64_t N, int64_t E, int64_t K, float aux_weight) = 0;

  // ---- reductions (float64 sums) ----------------------------------------------------------------
  // sum of x^2 in float64 (gradient norms, Frobenius norms); returns to the host.
  virtual double sum_squares(const float* x, int64_t n) = 0;
  // The sum over the list of sum_squares(x), added in list order from 0 (so bit for bit the host
  // loop over sum_squares), with a single read back to the host.
  virtual double sum_squares_many(std::span<const std::span<const float>> xs) = 0;
  // The sum of x^2 in float64 in one pass, read back to the host. CPU: in index order (the bits
  // of a host loop); CUDA: in a fixed tree order.
  virtual double sum_squares_in_order(const float* x, int64_t n) = 0;
  // out[j] = sum_i a[i, j] b[i, j] for a, b [rows, cols] (kmath::column_dot: float64, row order);
  // with a = Q and b = K Q, the Rayleigh quotients q_j^T K q_j.
  virtual void column_dots(float* out, const float* a, const float* b, int64_t rows,
                           int64_t cols) = 0;

  // ---- linear algebra (one matrix, or `batch` of equal shape; lists of any shapes) --------------
  // Thin QR of a [m, n]: q [m, r], r [r, n], r = min(m, n); Householder (LAPACK geqrf order).
  virtual void qr(float* q, float* r, const float* a, int64_t m, int64_t n, int64_t batch = 1) = 0;
  // Symmetric eigendecomposition of a [n, n]: eigenvalues w [n] ascending, eigenvectors as the
  // columns of v [n, n] (v[i * n + j] is component i of vector j).
  virtual void eigh(float* w, float* v, const float* a, int64_t n, int64_t batch = 1) = 0;
  // Thin SVD of a [m, n]: u [m, r], s [r] descending, vt [r, n], r = min(m, n).
  virtual void svd(float* u, float* s, float* vt, const float* a, int64_t m, int64_t n,
                   int64_t batch = 1) = 0;
  // Many independent solves of possibly different sizes, as one phase (a batched refresh of
  // many eigenbases). A task's result does not depend on the other tasks of the
  // list, so batching never changes a trajectory: a list gives bit for bit what the same tasks
  // give one per call. CPU: the tasks are spread over the threads, largest first, one
  // single-threaded LAPACK call each (also for a single task, so the bits do not depend on the
  // thread count either; they may differ from eigh()/qr(), whose one matrix uses threaded
  // LAPACK). CUDA: one solver call per task in stream order, the same as eigh()/qr().
  virtual void eigh_many(std::span<const EighTask> tasks) = 0;
  virtual void qr_many(std::span<const QrTask> tasks) = 0;
  // order [n]: the indices that sort x descending, stably, NaN last
  // (kmath::sorts_before_descending); order[j] is the old index of new position j.
  virtual void argsort_descending(int32_t* order, const float* x, int64_t n) = 0;
  // out[i, j] = src[i, index[j]] for [rows, cols] (out must not alias src).
  virtual void gather_columns(float* out, const float* src, const int32_t* index, int64_t rows,
                              int64_t cols) = 0;
  // out[i, j] = src[i, cols - 1 - j] (the solver's ascending eigen order to descending; out must
  // not alias src).
  virtual void reverse_columns(float* out, const float* src, int64_t rows, int64_t cols) = 0;
  // Negates, in place, every column j of q [rows, cols] whose entry of largest magnitude (the
  // lowest row on ties) is negative (kmath::column_sign_flips): one sign for each eigenvector,
  // whichever solver produced it, so a basis recomputed on another device matches.
  virtual void canonicalize_column_signs(float* q, int64_t rows, int64_t cols) = 0;
};

// The process-wide CPU backend (OpenMP threads from OMP_NUM_THREADS).
Backend& cpu_backend();

// True when this build has the CUDA backend and a device is present.
bool cuda_available();
// True when this build has the CUDA backend (whether or not a device is present).
bool cuda_built();
// The number of CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied); 0 without the
// CUDA backend, a driver or a device.
int cuda_device_count();
// The CUDA backend for one device; throws core::Error naming the reason when the build has no
// CUDA support or no device is present.
std::unique_ptr<Backend> make_cuda_backend(int device_index);

}  // namespace core
