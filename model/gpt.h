// The GPT of specs/model.md: forward and backward for arch gpt2 | modern, dense MLP or MoE, and
// the record recipe's mechanisms, on any core::Backend. A model is the list of layers its config
// builds (model/layer.h, one file pair per mechanism in model/layers/): the embeddings, per block
// its connections, attention and MLP, then the head and loss; this class assembles and runs
// them. llm.c style: parameters and gradients each live in one flat buffer with per-parameter
// views (model/param_store.h; ZeRO stage 3 frees the buffers and rebinds the views layer by
// layer), and the activations are planned once per (B, T) (model/activation_plan.h) so a
// training step allocates nothing on the device.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "model/layer.h"
#include "model/layers/attention_mask.h"
#include "model/layers/fp8_mlp.h"
#include "model/layers/lm_head.h"
#include "model/model_config.h"
#include "model/param_store.h"
#include "model/param_table.h"

namespace model {

class Gpt {
 public:
  Gpt(const ModelConfig& config, core::Backend& backend);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParamTable& table() const { return params_.table(); }
  core::Backend& backend() const { return backend_; }

  // Flat buffers of table().total_numel() elements on the backend's device (undefined after
  // release_storage()).
  const core::Tensor& params() const { return params_.params(); }
  const core::Tensor& grads() const { return params_.grads(); }
  // The tensor parameter i (or its gradient) is read from (accumulated into): by default a view
  // of the flat buffer with the table's shape; undefined while unbound after release_storage().
  core::Tensor param(size_t i) const { return params_.param(i); }
  core::Tensor grad(size_t i) const { return params_.grad(i); }
  core::Tensor param(const std::string& name) const { return param(params_.index(name)); }
  core::Tensor grad(const std::string& name) const { return grad(params_.index(name)); }

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

  // The optimizer steps the parameters have had (0 until set): model.mlp_fp8 takes its
  // projections' scales once per step, from the weights' own amax through step 16
  // (model/layers/fp8_mlp.h). The trainer sets it before each step.
  void set_weights_step(int64_t step);
  // model.mlp_fp8's delayed scales, host floats (3 per block; empty without it): what a checkpoint
  // carries per rank and the trainer's warm-up puts back. Setting them makes each block take its
  // projection's scale anew at its next training forward.
  std::vector<float> fp8_mlp_scales() const;
  void set_fp8_mlp_scales(const std::vector<float>& values);

  // The long sliding window (model.window) from the next forward on; the short one is
  // `short_window` when given (record #89's stages set both), else half of it (with
  // model.window_block: a multiple of the block, the short one half its blocks).
  // With model.yarn a change rescales the rotary and the attention scale, unless `rescale` is
  // false (the final validation's window, model/layers/yarn.h).
  void set_attention_window(int window, bool rescale = true, int short_window = 0);
  int attention_window() const { return masks_.window(); }

  // Record #89's training loss from the next training forward on: per position, the weighted
  // cross-entropies of the targets t+1, t+2, ... (`offsets`, one weight each, 1 to 4; a term only
  // while inside the row) and of the next token's prefix token (`prefix`; needs
  // set_prefix_table()). {1} and 0 (the default): the plain cross-entropy. The objective is then
  // the mean over positions of the weighted sums (what ce_loss() and the loss sums report);
  // evaluation (eval_loss) stays the plain mean cross-entropy.
  void set_loss_weights(const std::vector<double>& offsets, double prefix);
  // Each token's prefix token (the longest proper byte prefix that is a token; -1: none),
  // [vocab_size], copied to the device.
  void set_prefix_table(const std::vector<int32_t>& prefix_of);

  // The last forward's mean cross-entropy and MoE auxiliary loss (each a device read).
  float ce_loss() const;
  float aux_loss() const;
  // Bytes of the planned activation buffer (0 before the first forward).
  size_t activation_bytes() const;

 private:
  // The layers of one layer event's span: the embeddings (-1), block l, the head (n_layer).
  struct Stage {
    int event_layer;
    std::vector<std::unique_ptr<Layer>> layers;
    // Appends `layer`; returns it as its own type, for the wiring that reads it later.
    template <typename L>
    L* add(std::unique_ptr<L> layer) {
      L* raw = layer.get();
      layers.push_back(std::move(layer));
      return raw;
    }
  };
  // A new stage at the end of the list (references to earlier ones do not outlive the next).
  Stage& stage(int event_layer) {
    stages_.push_back({event_layer, {}});
    return stages_.back();
  }
  // The list the config builds (the layer files in model/layers/).
  void build();
  // model.mudd's list (model/gpt_mudd.cpp).
  void build_mudd();
  void plan(int B, int T);
  void run_forward(const int32_t* tokens, const int32_t* targets, int B, int T, bool want_grad);
  // {cross-entropy, aux loss} of the last forward, copied from the device.
  std::array<float, 2> read_losses() const;
  void notify(LayerEvent event, int layer) {
    if (hook_) hook_(event, layer);
  }

  ModelConfig config_;
  core::Backend& backend_;
  ParamStore params_;
  Context ctx_;
  AttentionMasks masks_;
  std::vector<Stage> stages_;
  LmHead* head_ = nullptr;
  std::unique_ptr<Fp8MlpScales> fp8_scales_;  // model.mlp_fp8

  // The activation plan: one buffer for the planned (B, T) (0, 0: none yet, or a plan that
  // failed), laid out by plan().
  int planned_B_ = 0, planned_T_ = 0;
  core::Tensor acts_;
  int32_t* tokens_ = nullptr;
  int32_t* targets_ = nullptr;

  // Device loss scalars (one small buffer that outlives re-plans): the float64 loss sum of
  // forward_accumulate(), then the last forward's {cross-entropy, aux loss}.
  core::Tensor loss_state_;
  double* loss_sum_ = nullptr;
  // set_prefix_table()'s int32 table (stored in an F32 tensor of the same size).
  core::Tensor prefix_table_;

  LayerHook hook_;
  bool have_grad_state_ = false;
};

}  // namespace model
