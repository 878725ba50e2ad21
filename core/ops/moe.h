// Op family: Mixture-of-experts routing and the row gather / scatter of its dispatch.
// A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/moe.cpp and core/cuda/moe.cu.
#pragma once

#include <cstdint>

#include "core/device.h"

namespace core {

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

class MoeOps {
 public:
  virtual ~MoeOps() = default;

  // out[i, :] = src[index[i], :] * (weight ? weight[i] : 1) for i < n.
  virtual void gather_rows(float* out, const float* src, const int32_t* index, const float* weight,
                           int64_t n, int64_t D) = 0;
  // out[i, :] = src[index[i], :] for bf16 rows (bf16 precision's stored activations), copied.
  virtual void gather_rows(bf16* out, const bf16* src, const int32_t* index, int64_t n,
                           int64_t D) = 0;
  // dst[index[i], :] += src[i, :] * (weight ? weight[i] : 1); repeated indices add in the order
  // of i on both backends, so the result is the same from run to run.
  virtual void scatter_add_rows(float* dst, const float* src, const int32_t* index,
                                const float* weight, int64_t n, int64_t D) = 0;
  // bf16 precision's residual add of the experts' outputs (the MoE layer's res_out): out[t, :] =
  // base[t, :] + sum of rows[r, :] * gate[r] over token t's K dispatch rows r = slot_row[t, :],
  // added in ascending r from the widened base in f32, each value rounded once (what
  // scatter_add_rows into an f32 copy of base sums, rounded). out may equal base.
  virtual void combine_rows(bf16* out, const bf16* base, const float* rows, const int32_t* slot_row,
                            const float* gate, int64_t N, int64_t K, int64_t D) = 0;
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
};

}  // namespace core
