#include "model/gpt.h"

#include <cmath>
#include <utility>

#include "core/check.h"
#include "model/layers/bigram_embedding.h"
#include "model/layers/causal_attention.h"
#include "model/layers/fp8_head.h"
#include "model/layers/fp8_mlp.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/layers/rotary_attention.h"
#include "model/layers/stream_mix.h"
#include "model/layers/stream_tap.h"
#include "model/layers/token_embedding.h"
#include "model/layers/unet_skip.h"
#include "model/layers/value_embeddings.h"
#include "model/layers/x0_lambdas.h"

namespace model {

Gpt::Gpt(const ModelConfig& config, core::Backend& backend)
    : config_(config),
      backend_(backend),
      params_(config_, backend),
      ctx_(config_, backend, params_),
      masks_(config_) {
  // Loss scalars on the device: the step's float64 loss sum, then cross-entropy and aux loss.
  loss_state_ = core::Tensor::empty({4}, core::DType::F32, backend_.allocator());
  backend_.fill_zero(loss_state_.raw_data(), loss_state_.nbytes());
  loss_sum_ = reinterpret_cast<double*>(loss_state_.data<float>());
  ctx_.losses = loss_state_.data<float>() + 2;
  build();
}

Gpt::~Gpt() = default;

void Gpt::build() {
  const ModelConfig& c = config_;
  if (c.mlp_fp8) fp8_scales_ = std::make_unique<Fp8MlpScales>(c.n_layer, backend_);
  if (c.mudd) {
    build_mudd();
    return;
  }

  // The embeddings: the stream's start, the value tables, x0 for the x0 lambdas.
  Stage& embeddings = stage(-1);
  embeddings.add(std::make_unique<TokenEmbedding>(ctx_));
  ValueEmbeddings* tables = nullptr;
  if (c.value_embeds > 0) tables = embeddings.add(std::make_unique<ValueEmbeddings>(ctx_));
  StreamTap* x0 = nullptr;
  if (c.x0_lambdas) x0 = embeddings.add(std::make_unique<StreamTap>());
  BigramSource* bigram = nullptr;
  if (c.bigram_rows > 0) bigram = embeddings.add(std::make_unique<BigramSource>(ctx_));

  // The blocks: the bigram injection at block 0's start, the U-net skip and the x0 mix on the
  // input, attention (and after it the bigram injection of a later block), the MLP or MoE, and
  // the output kept when a later block's skip reads it.
  std::vector<StreamTap*> skip_sources(static_cast<size_t>(c.unet_count()), nullptr);
  StreamTap* sublayer_input = nullptr;
  for (int l = 0; l < c.n_layer; ++l) {
    Stage& block = stage(l);
    if (bigram && l == 0) block.add(std::make_unique<BigramInject>(ctx_, l, *bigram));
    const int src = c.skip_source(l);
    if (src >= 0) {
      const int i = l - (c.n_layer - c.unet_count());
      block.add(std::make_unique<SkipAdd>(ctx_, i, *skip_sources.at(src)));
    }
    if (x0) block.add(std::make_unique<X0Lambdas>(ctx_, l, *x0));
    // model.sublayer_lambdas: a tap on the sublayer's input, the branch's output alone, then
    // x = resid_lambdas[k] x + post_lambdas[k] y (k: 0 attention, 1 MLP).
    const bool mixes = c.sublayer_lambdas;
    auto begin_sublayer = [&]() -> BranchWiring {
      if (!mixes) return {};
      sublayer_input = block.add(std::make_unique<StreamTap>());
      return {true, nullptr};
    };
    auto end_sublayer = [&](int k) {
      if (!mixes) return;
      const std::string p = "blocks." + std::to_string(l) + ".";
      block.add(std::make_unique<StreamMix>(std::vector<MixTerm>{
          {scalar_param(params_.index(p + "resid_lambdas"), k), sublayer_input},
          {scalar_param(params_.index(p + "post_lambdas"), k), nullptr}}));
    };
    if (c.has_attention(l) && c.arch == Arch::Gpt2) {
      block.add(std::make_unique<CausalAttention>(ctx_, l, masks_));
    } else if (c.has_attention(l)) {
      const BranchWiring wiring = begin_sublayer();
      block.add(std::make_unique<RotaryAttention>(ctx_, l, masks_, tables, wiring));
      end_sublayer(0);
    }
    if (bigram && l > 0 && c.has_attention(l))
      block.add(std::make_unique<BigramInject>(ctx_, l, *bigram));
    if (c.moe()) {
      block.add(std::make_unique<Moe>(ctx_, l));
    } else {
      const BranchWiring wiring = begin_sublayer();
      if (fp8_scales_) {
        block.add(std::make_unique<Fp8Mlp>(ctx_, l, *fp8_scales_, wiring));
      } else {
        block.add(std::make_unique<Mlp>(ctx_, l, wiring));
      }
      end_sublayer(1);
    }
    if (l < c.unet_count()) skip_sources[l] = block.add(std::make_unique<StreamTap>());
  }

  // The head and the loss.
  Stage& head = stage(c.n_layer);
  if (c.head_fp8) {
    head_ = head.add(std::make_unique<Fp8Head>(ctx_));
  } else {
    head_ = head.add(std::make_unique<LmHead>(ctx_));
  }
}

void Gpt::release_storage() {
  params_.release_storage();
}

void Gpt::bind_param(size_t i, core::Tensor value) {
  params_.bind_param(i, std::move(value));
}

void Gpt::bind_grad(size_t i, core::Tensor grad) {
  params_.bind_grad(i, std::move(grad));
}

void Gpt::init_weights() {
  params_.init_weights(config_.seed);
}

void Gpt::params_updated() {
  params_.params_updated();
}

void Gpt::set_weights_step(int64_t step) {
  if (fp8_scales_) fp8_scales_->set_weights_step(step);
}

std::vector<float> Gpt::fp8_mlp_scales() const {
  return fp8_scales_ ? fp8_scales_->values() : std::vector<float>();
}

void Gpt::set_fp8_mlp_scales(const std::vector<float>& values) {
  ENGINE_CHECK(fp8_scales_ || values.empty(),
               "model: FP8 MLP scales given to a model without model.mlp_fp8");
  if (fp8_scales_) fp8_scales_->set_values(values);
}

void Gpt::zero_grad() {
  params_.zero_grad();
}

size_t Gpt::activation_bytes() const {
  return acts_.defined() ? acts_.nbytes() : 0;
}

void Gpt::plan(int B, int T) {
  if (B == planned_B_ && T == planned_T_) return;
  ENGINE_CHECK(B > 0 && T > 0, "model: batch and sequence length must be positive");
  ENGINE_CHECK(T <= config_.seq_len, "model: sequence length " + std::to_string(T) +
                                         " exceeds model.seq_len " +
                                         std::to_string(config_.seq_len));
  planned_B_ = planned_T_ = 0;
  ctx_.B = B;
  ctx_.T = T;
  const int64_t N = ctx_.N(), D = config_.d_model;
  ActivationPlan plan(config_.precision == Precision::Bf16);
  // Two passes over the same layout: the first counts, the second hands out pointers.
  auto layout = [&]() {
    tokens_ = plan.i32(N);
    targets_ = plan.i32(N);
    masks_.plan(plan, ctx_);
    for (Stage& s : stages_)
      for (auto& layer : s.layers)
        layer->plan(plan, ctx_);
    // The residual stream's gradient and the backward's scratch of its size; the GEMMs' bf16
    // rounding of an f32 output gradient.
    ctx_.dres = plan.shared("stream.dres", N * D);
    ctx_.dln = plan.shared("stream.dln", N * D);
    ctx_.dmix = plan.shared("stream.dmix", N * D);
    ctx_.linear.set_dy_scratch(plan.shared_bf16("linear.dy_bf16", N * D));
  };
  plan.begin(nullptr);
  layout();
  const int64_t used = plan.finish_count();
  // A smaller shape (sampling with a growing prefix, a short last batch) reuses the buffer.
  if (!acts_.defined() || acts_.numel() < used) {
    acts_ = core::Tensor();  // free the previous plan before allocating the new one
    acts_ = core::Tensor::empty({used}, core::DType::F32, backend_.allocator());
    backend_.fill_zero(acts_.raw_data(), acts_.nbytes());
  }
  plan.begin(acts_.data<float>());
  layout();
  planned_B_ = B;
  planned_T_ = T;
}

void Gpt::run_forward(const int32_t* tokens, const int32_t* targets, int B, int T, bool want_grad) {
  plan(B, T);
  const int64_t N = ctx_.N(), V = config_.vocab_size;
  for (int64_t i = 0; i < N; ++i) {
    ENGINE_CHECK(tokens[i] >= 0 && tokens[i] < V,
                 "model: input token " + std::to_string(tokens[i]) + " at position " +
                     std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) +
                     ")");
    ENGINE_CHECK(!targets || (targets[i] >= 0 && targets[i] < V),
                 "model: target token " + std::to_string(targets ? targets[i] : 0) +
                     " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
                     std::to_string(V) + ")");
  }
  backend_.copy_from_host(tokens_, tokens, N * sizeof(int32_t));
  ctx_.tokens = tokens_;
  masks_.set_tokens(ctx_, tokens);
  if (targets) backend_.copy_from_host(targets_, targets, N * sizeof(int32_t));
  ctx_.targets = targets ? targets_ : nullptr;
  ctx_.want_grad = want_grad && targets;
  have_grad_state_ = false;
  backend_.fill_zero(ctx_.losses, 2 * sizeof(float));  // cross-entropy, aux loss

  Stream x;
  for (Stage& s : stages_) {
    notify(LayerEvent::kBeforeForward, s.event_layer);
    for (auto& layer : s.layers)
      x = layer->forward(ctx_, x);
    notify(LayerEvent::kAfterForward, s.event_layer);
  }
  have_grad_state_ = ctx_.want_grad;
}

std::array<float, 2> Gpt::read_losses() const {
  std::array<float, 2> host{};
  backend_.copy_to_host(host.data(), ctx_.losses, sizeof(host));
  return host;
}

float Gpt::ce_loss() const {
  return read_losses()[0];
}

float Gpt::aux_loss() const {
  return read_losses()[1];
}

float Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  ENGINE_CHECK(targets != nullptr, "model: forward needs targets (last_logits() samples)");
  run_forward(tokens, targets, B, T, true);
  const std::array<float, 2> losses = read_losses();
  return losses[0] + losses[1];
}

void Gpt::forward_accumulate(const int32_t* tokens, const int32_t* targets, int B, int T) {
  ENGINE_CHECK(targets != nullptr, "model: forward_accumulate needs targets");
  run_forward(tokens, targets, B, T, true);
  backend_.accumulate_loss(loss_sum_, ctx_.losses, 2);
}

std::vector<int64_t> Gpt::take_expert_rows() {
  std::vector<int64_t> rows = std::move(ctx_.expert_rows);
  ctx_.expert_rows.clear();
  return rows;
}

double Gpt::take_loss_sum() {
  double sum = 0.0;
  backend_.copy_to_host(&sum, loss_sum_, sizeof(double));
  backend_.fill_zero(loss_sum_, sizeof(double));
  return sum;
}

void Gpt::take_loss_sum(double* out) {
  backend_.copy(out, loss_sum_, sizeof(double));
  backend_.fill_zero(loss_sum_, sizeof(double));
}

float Gpt::eval_loss(const int32_t* tokens, const int32_t* targets, int B, int T) {
  ENGINE_CHECK(targets != nullptr, "model: eval_loss needs targets");
  run_forward(tokens, targets, B, T, false);
  return read_losses()[0];
}

std::vector<float> Gpt::last_logits(const int32_t* tokens, int B, int T) {
  run_forward(tokens, nullptr, B, T, false);
  return head_->last_logits(ctx_);
}

void Gpt::set_attention_window(int window, bool rescale, int short_window) {
  masks_.set_window(window, rescale, short_window);
}

void Gpt::set_loss_weights(const std::vector<double>& offsets, double prefix) {
  const int most = core::kmath::LossTerms::kMaxOffsets;
  ENGINE_CHECK(!offsets.empty() && static_cast<int>(offsets.size()) <= most,
               "model: loss weights: " + std::to_string(offsets.size()) +
                   " multi-token weights (1 to " + std::to_string(most) + ")");
  for (double w : offsets) {
    ENGINE_CHECK(std::isfinite(w) && w >= 0.0,
                 "model: loss weights: multi-token weight " + std::to_string(w) + " is not >= 0");
  }
  ENGINE_CHECK(std::isfinite(prefix) && prefix >= 0.0,
               "model: loss weights: prefix weight " + std::to_string(prefix) + " is not >= 0");
  ENGINE_CHECK(prefix == 0.0 || prefix_table_.defined(),
               "model: loss weights: a prefix weight needs the prefix table (set_prefix_table)");
  core::kmath::LossTerms terms;
  terms.offsets = static_cast<int>(offsets.size());
  for (size_t k = 0; k < offsets.size(); ++k)
    terms.weight[k] = static_cast<float>(offsets[k]);
  if (prefix > 0.0) {
    terms.prefix_of = reinterpret_cast<const int32_t*>(prefix_table_.data<float>());
    terms.prefix_weight = static_cast<float>(prefix);
  }
  ctx_.loss_terms = terms;
}

void Gpt::set_prefix_table(const std::vector<int32_t>& prefix_of) {
  const int64_t V = config_.vocab_size;
  ENGINE_CHECK(static_cast<int64_t>(prefix_of.size()) == V,
               "model: prefix table: " + std::to_string(prefix_of.size()) +
                   " entries for a vocabulary of " + std::to_string(V));
  for (int64_t v = 0; v < V; ++v) {
    ENGINE_CHECK(prefix_of[v] >= -1 && prefix_of[v] < V && prefix_of[v] != v,
                 "model: prefix table: token " + std::to_string(v) + "'s prefix " +
                     std::to_string(prefix_of[v]) + " is not -1 or another token");
  }
  static_assert(sizeof(float) == sizeof(int32_t));
  if (!prefix_table_.defined())
    prefix_table_ = core::Tensor::empty({V}, core::DType::F32, backend_.allocator());
  backend_.copy_from_host(prefix_table_.raw_data(), prefix_of.data(), V * sizeof(int32_t));
}

void Gpt::backward() {
  ENGINE_CHECK(have_grad_state_, "model: backward() needs a forward() with targets before it");
  have_grad_state_ = false;
  backend_.fill_zero(ctx_.dres, ctx_.N() * config_.d_model * sizeof(float));
  for (Stage& s : stages_)
    for (auto& layer : s.layers)
      layer->begin_backward(ctx_);
  // The embeddings are used from the start of forward to the end of backward: no
  // kBeforeBackward for them.
  for (auto s = stages_.rbegin(); s != stages_.rend(); ++s) {
    if (s->event_layer >= 0) notify(LayerEvent::kBeforeBackward, s->event_layer);
    for (auto layer = s->layers.rbegin(); layer != s->layers.rend(); ++layer)
      (*layer)->backward(ctx_);
    notify(LayerEvent::kAfterBackward, s->event_layer);
  }
}

}  // namespace model
