// The GPT of specs/model.md: forward and backward for arch gpt2 | modern, dense MLP or MoE, on
// any core::Backend. llm.c style: parameters and gradients each live in one flat buffer with
// per-parameter views (the order of the ParamTable; ZeRO stage 3 frees the buffers and rebinds
// the views layer by layer), and the activations are planned once per (B, T) so a training step
// allocates nothing on the device.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "model/model_config.h"
#include "model/param_table.h"

namespace model {

class Gpt {
 public:
  Gpt(const ModelConfig& config, core::Backend& backend);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParamTable& table() const { return table_; }
  core::Backend& backend() const { return backend_; }

  // Flat buffers of table().total_numel() elements on the backend's device (undefined after
  // release_storage()).
  const core::Tensor& params() const { return params_; }
  const core::Tensor& grads() const { return grads_; }
  // The tensor parameter i (or its gradient) is read from (accumulated into): by default a view
  // of the flat buffer with the table's shape; undefined while unbound after release_storage().
  core::Tensor param(size_t i) const { return param_view_.at(i); }
  core::Tensor grad(size_t i) const { return grad_view_.at(i); }
  core::Tensor param(const std::string& name) const { return param(index(name)); }
  core::Tensor grad(const std::string& name) const { return grad(index(name)); }

  // Rebindable parameter storage (ZeRO stage 3). release_storage() frees the flat buffers and
  // unbinds every parameter; bind_param / bind_grad point parameter i at a full-shape tensor
  // (an undefined tensor unbinds it). The hook binds a layer before it is used.
  void release_storage();
  void bind_param(size_t i, core::Tensor value);
  void bind_grad(size_t i, core::Tensor grad);

  // Seeded initialisation of every parameter (config().seed, the table's init rules).
  void init_weights();
  // Says the parameters were written in place (an optimizer step, a load): in bf16 precision
  // the bf16 copies of the matmul weights are remade from them before their next use. The
  // trainer calls it once per step, after publishing the updated parameters; bind_param,
  // release_storage, init_weights and model::load_weights need no call.
  void params_updated();
  // Zeroes the flat gradient buffer (after release_storage(): every bound gradient).
  void zero_grad();

  // Training forward. tokens and targets are host arrays [B, T] (row-major), ids in [0, V).
  // Returns the objective that backward() differentiates: mean cross-entropy plus the MoE
  // auxiliary losses (ce_loss() and aux_loss() separately). T may be below model.seq_len.
  // The losses are computed on the device; returning the objective reads it (one small copy).
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  // The same forward without reading the loss back: the objective is added (in float64) to a
  // loss sum that stays on the device, so a step of many micro-batches reads its loss once.
  void forward_accumulate(const int32_t* tokens, const int32_t* targets, int B, int T);
  // The sum of the objectives of the forward_accumulate() calls since the last take (one
  // device read); resets the sum to zero.
  double take_loss_sum();
  // The same sum moved to *out, a float64 in the backend's memory, with no read back (the
  // trainer reduces it on the device with the gradient's sum of squares).
  void take_loss_sum(double* out);
  // MoE: the dispatch rows (token, slot pairs) routed to each expert, [n_layer * experts]
  // (layer-major), summed over the forwards since the last take; resets the counts. Empty
  // without MoE. A world-size comparison sees a top-k tie that broke the other way here.
  std::vector<int64_t> take_expert_rows();
  // Accumulates d objective / d params into grads(); needs a forward() with targets first.
  void backward();
  // Loss-only evaluation: the mean cross-entropy, no gradient bookkeeping.
  float eval_loss(const int32_t* tokens, const int32_t* targets, int B, int T);
  // Logits of the last position of each row for sampling: host [B, V] (soft-cap applied,
  // padding dropped).
  std::vector<float> last_logits(const int32_t* tokens, int B, int T);

  // Layer events for the sharding layer (ZeRO-3 gathers a block's parameters just before use;
  // gradient reduction starts as soon as a block's gradients are final). `layer` is the block
  // index; n_layer for the final norm and head (forward after the last block, backward first);
  // -1 for the embeddings, which are used from the start of forward until the end of backward
  // (a tied head reads and accumulates into embed.weight during layer n_layer's backward).
  // kAfterForward marks the end of a layer's forward work (for timelines: engine/run_trace.h).
  enum class LayerEvent { kBeforeForward, kAfterForward, kBeforeBackward, kAfterBackward };
  using LayerHook = std::function<void(LayerEvent event, int layer)>;
  void set_layer_hook(LayerHook hook) { hook_ = std::move(hook); }

  // The long sliding window (model.window) from the next forward on; the short one is half of it
  // (with model.window_block: a multiple of the block, the short one half its blocks).
  void set_attention_window(int window);
  int attention_window() const { return window_; }

  // The last forward's mean cross-entropy and MoE auxiliary loss (each a device read).
  float ce_loss() const;
  float aux_loss() const;
  // Bytes of the planned activation buffer (0 before the first forward).
  size_t activation_bytes() const;

 private:
  struct LayerActs;
  size_t index(const std::string& name) const;
  const float* w(size_t i) const;
  float* g(size_t i) const;
  void plan(int B, int T);
  void run_forward(const int32_t* tokens, const int32_t* targets, int B, int T, bool want_grad);
  // {cross-entropy, aux loss} of the last forward, copied from the device.
  std::array<float, 2> read_losses() const;
  void mlp_forward(int l);
  void moe_forward(int l);
  void mlp_backward(int l);
  void moe_backward(int l);
  void attn_forward(int l);
  void attn_backward(int l);
  // Where attention's q, k, v and output live (core::AttentionLayout): GPT-2's q, k, v in place
  // in qkv [B, T, 3, H, hd], the modern blocks' in their heads [B, H, T, hd]; the output [B, T, D].
  core::AttentionLayout attention_layout() const;
  // The recipe's block input: the U-net skip and the x0 lambdas applied to the previous output.
  void input_forward(int l);
  void input_backward(int l);
  // One GEMM operand: a weight's f32 values and, in bf16 precision, its bf16 copy (null in f32
  // precision and for weights kept in f32, the MoE router's); an activation or output gradient
  // as stored: f32, or in bf16 precision bf16 only (docs/precision.md). A GEMM runs in bf16 when
  // both of its operands have bf16.
  struct Operand {
    const float* f32 = nullptr;
    const core::bf16* bf16 = nullptr;
    Operand at(int64_t offset) const;
  };
  // An array of the residual stream (the embedding output, each block's res_mid and res_out, the
  // recipe's skip and x0 mixes): f32, or in bf16 precision bf16 only (docs/precision.md); exactly
  // one of the two is set once planned.
  struct Stream {
    float* f32 = nullptr;
    core::bf16* bf16 = nullptr;
  };
  // The residual stream's producers and readers for either dtype.
  void copy_stream(Stream dst, Stream src);
  void mix_stream(Stream out, const float* wa, Stream a, const float* wb, Stream b);
  void mix_stream_backward(float* da, float* db, float* dwa, float* dwb, const float* wa, Stream a,
                           const float* wb, Stream b, const float* dout);
  // Parameter i as a GEMM operand (its bf16 copy remade first if stale).
  Operand weight(size_t i);
  // ln2 of layer l as the MoE router's f32 input: in bf16 precision widened from the stored
  // bf16 into a scratch (the router's GEMM stays f32).
  const float* router_input(int l);
  // y[N, out] (+)= x[N, in] @ W[out, in]^T.
  void linear(float* y, Operand x, Operand weight, int64_t N, int64_t in, int64_t out,
              float beta = 0.0f, float alpha = 1.0f);
  // y[N, out] = alpha x[N, in] @ W[out, in]^T stored in bf16 (each f32 sum rounded once): the
  // bf16 head's logits. Both operands must have bf16.
  void linear(core::bf16* y, Operand x, Operand weight, int64_t N, int64_t in, int64_t out,
              float alpha);
  // y[N, out] = x[N, in] @ W[out, in]^T + bias (parameter `bias`; none: no bias) + residual
  // (when given: y written fresh from it, C != D), in one GEMM with an epilogue
  // (core::GemmEpilogue). With gelu_out (f32), y is the pre-activation and gelu_out = gelu(y),
  // also in the epilogue.
  void linear_epilogue(float* y, Operand x, Operand weight, size_t bias, int64_t N, int64_t in,
                       int64_t out, const float* residual = nullptr, float* gelu_out = nullptr);
  // The residual add of a projection: y = residual + x[N, in] @ W[out, in]^T (+ bias) in one GEMM
  // with the residual as C, both streams f32 or both bf16 (then each sum rounded once).
  void residual_linear(Stream y, Operand x, Operand weight, size_t bias, int64_t N, int64_t in,
                       int64_t out, Stream residual);
  // dx[N, in] (+)= dy[N, out] @ W[out, in];  dW[out, in] += dy^T @ x. When the GEMMs run in
  // bf16, dy is given as stored in bf16 by its producer (dy_rounded: d logits, d pre, d qkv) or
  // rounded here from f32 (the residual stream's gradient, the MoE rows'). dbias (when not null)
  // += the column sums of dy as the bias gradient reads it: fused into the dW GEMM (bgrad) when
  // that GEMM multiplies the same values, else from the f32 dy before its rounding. With
  // dx_gelu_pre (f32 GEMMs only), dx is d pre = gelu'(pre) (dy W), the activation's backward in
  // the dx GEMM's epilogue (dgelu).
  void linear_backward(float* dx, float* dweight, const float* dy, Operand x, Operand weight,
                       int64_t N, int64_t in, int64_t out, float dx_beta,
                       const core::bf16* dy_rounded = nullptr, float* dbias = nullptr,
                       float* dx_gelu_pre = nullptr);
  // LayerNorm (gpt2, with weight and bias parameters) or RMSNorm (modern, none) over [N, D];
  // the output stored f32 (out) or bf16 (out_bf16, bf16 precision), whichever is not null.
  // The input is the residual stream (f32, or bf16 in bf16 precision; the statistics f32).
  void norm_forward(float* out, core::bf16* out_bf16, float* mean, float* rstd, Stream inp,
                    size_t weight, size_t bias);
  void norm_backward(float* dinp, const float* dout, Stream inp, const float* mean,
                     const float* rstd, size_t weight, size_t bias);
  // The MLP activation of pre [n] into out or out_bf16 (whichever is not null).
  void act_forward(float* out, core::bf16* out_bf16, const float* inp, int64_t n);
  // d pre [n] from dout: accumulated into the zeroed f32 scratch dpre_, or in bf16 precision
  // written as bf16 into dpre_bf16_; returns the one written, as the next GEMMs' output gradient.
  Operand act_backward(const float* inp, const float* dout, int64_t n);
  // Whether layer l's MLP runs GELU in its GEMMs' epilogues (bias_gelu forward, dgelu backward).
  bool fused_gelu(int l) const;
  // The gradient of parameter `bias`, or null for none.
  float* bias_grad(size_t bias);
  // model.head_fp8 (train_gpt.py's mm_op and mm_backward_op): z = (x_s w_s) Xq Wq^T with
  // Xq = e4m3(lnf / x_s), Wq = e4m3(W / w_s); the backward rounds g = e5m2(dz / grad_s) and
  // takes d lnf = (grad_s w_s) g Wq, dW += (grad_s x_s) g^T Xq: the record's straight-through
  // rule (the roundings pass gradients unchanged, the GEMMs see the rounded operands). The
  // scales: x_s = sqrt(D) / 448 (a normed row never saturates), w_s = 24 / 448, grad_s = 1 / 448.
  // Xq, Wq and g are stored as FP8 bytes (fp8_encode) and multiplied by the backend's gemm_fp8
  // (cuBLASLt's FP8 kernels on sm_89+; the CPU decodes them exactly and runs its f32 GEMM).
  struct Fp8Scales {
    float x, w, grad;
  };
  Fp8Scales fp8_scales() const;
  void head_fp8_forward(float gain);
  void head_fp8_backward();
  // From block l's d qkv (f32 or bf16) on: the QKV bias and weight gradients, d ln1, and through
  // the norm into dres_.
  void qkv_backward(int l, Operand dqkv);
  void notify(LayerEvent event, int layer) {
    if (hook_) hook_(event, layer);
  }

  ModelConfig config_;
  ParamTable table_;
  core::Backend& backend_;
  core::Tensor params_;
  core::Tensor grads_;
  std::vector<core::Tensor> param_view_;
  std::vector<core::Tensor> grad_view_;
  // bf16 precision: the bf16 copy of each matmul weight (undefined for the others, and until
  // first used), and whether it matches the parameter's current values.
  bool bf16_ = false;
  std::vector<bool> has_bf16_copy_;
  std::vector<core::Tensor> bf16_copy_;
  std::vector<bool> bf16_copy_fresh_;

  // Parameter indices per block (SIZE_MAX when the arch lacks that parameter).
  struct LayerParams {
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b;
    size_t fc_w, fc_b, fcproj_w, fcproj_b, router_w, efc_w, eproj_w, lambdas, v_lambdas;
  };
  std::vector<LayerParams> lp_;
  size_t embed_ = 0, pos_ = 0, lnf_w_ = 0, lnf_b_ = 0, head_ = 0, skip_w_ = 0;
  std::vector<size_t> value_embed_;  // the value-embedding tables

  // Activation plan.
  int B_ = 0, T_ = 0;
  core::Tensor acts_;
  std::vector<LayerActs> layers_;
  Stream encoded_;
  // model.x0_norm: the embedding rows before the norm (encoded_ holds rmsnorm of them) and the
  // norm's rstd [N].
  float *embed_raw_ = nullptr, *embed_rstd_ = nullptr;
  // Value embeddings: each table's rows for the tokens in the heads' layout [B, H, T, hd]
  // (forward) and their gradient (backward), and a [B, T, D] scratch for the lookups.
  std::vector<float*> ve_heads_, dve_heads_;
  float* ve_rows_ = nullptr;
  // Recipe backward: d x0 summed over the blocks, d (block output) of each U-net skip source,
  // and a scratch that the mixes' backward writes into before it is swapped with dres_ or dv_.
  float* dx0_ = nullptr;
  std::vector<float*> dskip_;
  float* dmix_ = nullptr;
  float *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  // model.head_fp8: the GEMM operands as FP8 bytes: e4m3 lnf and W, e5m2 d logits.
  core::fp8 *head_xq_ = nullptr, *head_wq_ = nullptr, *head_gq_ = nullptr;
  // The logits [N, Vp]: f32 (fp32 and tf32, and the FP8 head's), or in bf16 precision with the
  // ordinary head bf16 only (logits_bf16_, logits_ null), which the cross-entropy overwrites in
  // place with d loss / d logits for the head's GEMMs.
  float* logits_ = nullptr;
  core::bf16* logits_bf16_ = nullptr;
  float* losses_ = nullptr;
  int32_t* tokens_ = nullptr;
  int32_t* targets_ = nullptr;
  int32_t* last_index_ = nullptr;
  // Masked attention: each position's first visible key for the long and the short window
  // ([B, T], core::AttentionMask), from the tokens of each forward; window_ the long window.
  int32_t *key_begin_long_ = nullptr, *key_begin_short_ = nullptr;
  int window_ = 0;
  void set_key_begins(const int32_t* tokens, int B, int T);
  // The first key the window leaves position t (counted from its row's start), long or short.
  int32_t window_begin(int32_t t, bool short_window) const;
  core::AttentionMask mask_of(int l) const;
  float* last_hidden_ = nullptr;
  // The last positions' logits [B, Vp] for sampling, stored as the head's logits are: f32, or
  // bf16 (last_logits_bf16_) where the loss reads bf16 logits, so sampling sees what it scores.
  float* last_logits_ = nullptr;
  core::bf16* last_logits_bf16_ = nullptr;
  // bf16 precision: lnf and the last positions stored as bf16 (lnf_ and last_hidden_ are null),
  // the output gradients that the backward's producers store as
  // bf16 (d pre, d qkv), the rounding of the f32 ones (the residual stream's gradient, the MoE
  // rows') for their GEMMs, and the MoE router's widened input.
  core::bf16 *lnf_bf16_ = nullptr, *last_hidden_bf16_ = nullptr, *dy_bf16_ = nullptr,
             *dpre_bf16_ = nullptr, *dqkv_bf16_ = nullptr;
  float* router_in_ = nullptr;
  // Backward scratch, shared by all layers.
  float *dres_ = nullptr, *dln_ = nullptr, *dqkv_ = nullptr, *dq_ = nullptr, *dk_ = nullptr,
        *dv_ = nullptr, *datty_ = nullptr, *dact_ = nullptr, *dpre_ = nullptr;
  float *dxe_raw_ = nullptr, *dye_ = nullptr, *dxe_ = nullptr, *dgate_ = nullptr,
        *dprobs_ = nullptr, *drouter_ = nullptr;

  // Device loss scalars (one small buffer that outlives re-plans): the float64 loss sum of
  // forward_accumulate(), then the last forward's {cross-entropy, aux loss}.
  core::Tensor loss_state_;
  double* loss_sum_ = nullptr;
  std::vector<int64_t> expert_rows_;  // MoE: the counts take_expert_rows() returns
  float* losses_now_ = nullptr;

  LayerHook hook_;
  bool have_grad_state_ = false;
};

}  // namespace model
