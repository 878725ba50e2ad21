#include "model/gpt.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "core/check.h"
#include "core/kernel_math.h"
#include "core/transfer.h"

namespace model {

namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();
constexpr float kLayerNormEps = 1e-5f;

}  // namespace

Gpt::Operand Gpt::Operand::at(int64_t offset) const {
  return {f32 ? f32 + offset : nullptr, bf16 ? bf16 + offset : nullptr};
}

void Gpt::linear(float* y, Operand x, Operand weight, int64_t N, int64_t in, int64_t out,
                 float beta, float alpha) {
  core::GemmArgs a;
  a.trans_b = true;
  a.m = N, a.n = out, a.k = in, a.beta = beta, a.alpha = alpha;
  if (x.bf16 && weight.bf16) {
    backend_.gemm(a, x.bf16, weight.bf16, y);
  } else {
    ENGINE_CHECK(x.f32,
                 "model: a linear layer with an f32 weight got an input stored only in "
                 "bf16 (widen it first, as router_input does)");
    a.tf32 = config_.precision == Precision::Tf32;
    backend_.gemm(a, x.f32, weight.f32, y);
  }
}

void Gpt::linear(core::bf16* y, Operand x, Operand weight, int64_t N, int64_t in, int64_t out,
                 float alpha) {
  ENGINE_CHECK(x.bf16 && weight.bf16,
               "model: a linear layer with a bf16 output needs bf16 operands");
  core::GemmArgs a;
  a.trans_b = true;
  a.m = N, a.n = out, a.k = in, a.alpha = alpha;
  backend_.gemm(a, x.bf16, weight.bf16, y);
}

void Gpt::linear_epilogue(float* y, Operand x, Operand weight, size_t bias, int64_t N, int64_t in,
                          int64_t out, const float* residual, float* gelu_out) {
  core::GemmArgs a;
  a.trans_b = true;
  a.m = N, a.n = out, a.k = in;
  core::GemmEpilogueArgs ep;
  if (bias != kNone) {
    ep.kind = gelu_out ? core::GemmEpilogue::bias_gelu : core::GemmEpilogue::bias;
    ep.bias = w(bias);
  }
  ENGINE_CHECK(!gelu_out || (bias != kNone && !residual),
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
                 "bf16 (widen it first, as router_input does)");
    a.tf32 = config_.precision == Precision::Tf32;
    backend_.gemm_epilogue(a, ep, x.f32, weight.f32, d, aux);
  }
}

void Gpt::residual_linear(Stream y, Operand x, Operand weight, size_t bias, int64_t N, int64_t in,
                          int64_t out, Stream residual) {
  if (!y.bf16) {
    linear_epilogue(y.f32, x, weight, bias, N, in, out, residual.f32);
    return;
  }
  ENGINE_CHECK(x.bf16 && weight.bf16 && residual.bf16,
               "model: the bf16 residual stream's add needs bf16 operands and a bf16 residual");
  core::GemmArgs a;
  a.trans_b = true;
  a.m = N, a.n = out, a.k = in, a.beta = 1.0f;
  core::GemmEpilogueArgs ep;
  if (bias != kNone) {
    ep.kind = core::GemmEpilogue::bias;
    ep.bias = w(bias);
  }
  ep.c_bf16 = residual.bf16;
  backend_.gemm_epilogue(a, ep, x.bf16, weight.bf16, y.bf16, nullptr);
}

void Gpt::copy_stream(Stream dst, Stream src) {
  const int64_t n = int64_t(B_) * T_ * config_.d_model;
  if (dst.bf16) {
    backend_.copy(dst.bf16, src.bf16, n * sizeof(core::bf16));
  } else {
    backend_.copy(dst.f32, src.f32, n * sizeof(float));
  }
}

void Gpt::mix_stream(Stream out, const float* wa, Stream a, const float* wb, Stream b) {
  const int64_t n = int64_t(B_) * T_ * config_.d_model;
  if (out.bf16) {
    backend_.scalar_mix(out.bf16, wa, a.bf16, wb, b.bf16, n);
  } else {
    backend_.scalar_mix(out.f32, wa, a.f32, wb, b.f32, n);
  }
}

void Gpt::mix_stream_backward(float* da, float* db, float* dwa, float* dwb, const float* wa,
                              Stream a, const float* wb, Stream b, const float* dout) {
  const int64_t n = int64_t(B_) * T_ * config_.d_model;
  if (a.bf16) {
    backend_.scalar_mix_backward(da, db, dwa, dwb, wa, a.bf16, wb, b.bf16, dout, n);
  } else {
    backend_.scalar_mix_backward(da, db, dwa, dwb, wa, a.f32, wb, b.f32, dout, n);
  }
}

void Gpt::linear_backward(float* dx, float* dweight, const float* dy, Operand x, Operand weight,
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
    a.tf32 = b.tf32 = config_.precision == Precision::Tf32;
    backend_.gemm_epilogue(a, dx_ep, dy, weight.f32, dx, dx_gelu_pre);
    backend_.gemm_epilogue(b, dw_ep, dy, x.f32, dweight, nullptr);
  }
}

Gpt::Operand Gpt::weight(size_t i) {
  if (!bf16_ || !has_bf16_copy_[i]) return {w(i), nullptr};
  const float* value = w(i);
  const core::Tensor& p = param_view_[i];
  core::Tensor& copy = bf16_copy_[i];
  if (!bf16_copy_fresh_[i]) {
    if (!copy.defined())
      copy = core::Tensor::empty(p.shape(), core::DType::BF16, backend_.allocator());
    backend_.f32_to_bf16(copy.data<core::bf16>(), value, p.numel());
    bf16_copy_fresh_[i] = true;
  }
  return {value, copy.data<core::bf16>()};
}

// Saved activations of one block (pointers into acts_).
struct Gpt::LayerActs {
  // The GEMM inputs (ln1, atty, ln2, act, xe) are stored in one dtype: f32, or in bf16
  // precision bf16 (the f32 pointer null), which the forward's GEMMs and the weight gradients
  // read, and attention's backward (atty: its own output, written bf16 by the attention).
  core::bf16 *ln1_bf16 = nullptr, *atty_bf16 = nullptr, *ln2_bf16 = nullptr, *act_bf16 = nullptr,
             *xe_bf16 = nullptr;
  float *ln1 = nullptr, *ln1_mean = nullptr, *ln1_rstd = nullptr;
  // qkv [B, T, 3, H, hd]: GPT-2's attention reads its q, k and v in place; the modern blocks
  // split them into heads [B, H, T, hd] (q, k, v) for the QK-norm and rotary.
  float* qkv = nullptr;
  float *q = nullptr, *k = nullptr, *v = nullptr;                            // modern only
  float *q_rstd = nullptr, *k_rstd = nullptr, *qr = nullptr, *kr = nullptr;  // modern only
  float* vmix = nullptr;  // value embeddings: v after the mix (a.v keeps the projection's v)
  // The block's input (the previous output, or the recipe's mixes of it: after the U-net skip,
  // after the x0 lambdas). These and res_mid, res_out are the residual stream (Stream).
  Stream input, skipped, mixed;
  // atty: attention's output [B, T, H hd] (the heads merged), lse [B*H, T].
  float *lse = nullptr, *atty = nullptr;
  Stream res_mid;
  float *ln2 = nullptr, *ln2_mean = nullptr, *ln2_rstd = nullptr;
  float *pre = nullptr, *act = nullptr;                  // MLP hidden [N, F], or MoE [N*k, F]
  float *probs = nullptr, *xe = nullptr, *ye = nullptr;  // MoE
  core::MoeRouting route;                                // MoE: top-k, gates, dispatch rows
  std::vector<int32_t> expert_rows;                      // MoE: host copy of route.offset
  Stream res_out;
};

const float* Gpt::router_input(int l) {
  const LayerActs& a = layers_[l];
  if (!a.ln2_bf16) return a.ln2;
  backend_.bf16_to_f32(router_in_, a.ln2_bf16, int64_t(B_) * T_ * config_.d_model);
  return router_in_;
}

Gpt::Gpt(const ModelConfig& config, core::Backend& backend)
    : config_(config),
      table_(config),
      backend_(backend),
      bf16_(config.precision == Precision::Bf16),
      window_(config.window) {
  // Loss scalars on the device: the step's float64 loss sum, then cross-entropy and aux loss.
  loss_state_ = core::Tensor::empty({4}, core::DType::F32, backend_.allocator());
  backend_.fill_zero(loss_state_.raw_data(), loss_state_.nbytes());
  loss_sum_ = reinterpret_cast<double*>(loss_state_.data<float>());
  losses_now_ = loss_state_.data<float>() + 2;
  params_ = core::Tensor::empty({table_.total_numel()}, core::DType::F32, backend_.allocator());
  grads_ = core::Tensor::empty({table_.total_numel()}, core::DType::F32, backend_.allocator());
  backend_.fill_zero(params_.raw_data(), params_.nbytes());
  backend_.fill_zero(grads_.raw_data(), grads_.nbytes());
  for (size_t i = 0; i < table_.size(); ++i) {
    const ParamInfo& p = table_[i];
    param_view_.push_back(params_.slice(0, p.offset, p.numel).view(p.shape));
    grad_view_.push_back(grads_.slice(0, p.offset, p.numel).view(p.shape));
  }

  auto opt = [&](const std::string& name) { return table_.find(name).value_or(kNone); };
  embed_ = index("embed.weight");
  pos_ = opt("pos_embed.weight");
  lnf_w_ = opt("ln_f.weight");
  lnf_b_ = opt("ln_f.bias");
  head_ = config_.arch == Arch::Gpt2 ? embed_ : index("lm_head.weight");
  for (int l = 0; l < config_.n_layer; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    LayerParams q;
    q.ln1_w = opt(p + "ln1.weight");
    q.ln1_b = opt(p + "ln1.bias");
    q.qkv_w = opt(p + "attn.qkv.weight");
    q.qkv_b = opt(p + "attn.qkv.bias");
    q.proj_w = opt(p + "attn.proj.weight");
    q.proj_b = opt(p + "attn.proj.bias");
    q.ln2_w = opt(p + "ln2.weight");
    q.ln2_b = opt(p + "ln2.bias");
    q.fc_w = opt(p + "mlp.fc.weight");
    q.fc_b = opt(p + "mlp.fc.bias");
    q.fcproj_w = opt(p + "mlp.proj.weight");
    q.fcproj_b = opt(p + "mlp.proj.bias");
    q.router_w = opt(p + "moe.router.weight");
    q.efc_w = opt(p + "moe.fc.weight");
    q.eproj_w = opt(p + "moe.proj.weight");
    q.lambdas = opt(p + "lambdas");
    q.v_lambdas = opt(p + "attn.v_lambdas");
    lp_.push_back(q);
  }
  skip_w_ = opt("skip_weights");
  for (int i = 0; i < config_.value_embeds; ++i)
    value_embed_.push_back(index("value_embeds." + std::to_string(i) + ".weight"));
  // The matmul weights get bf16 copies; the router stays f32 (its top-k picks discrete
  // experts), the embeddings are lookups (gpt2's doubles as the head: that use gets one).
  has_bf16_copy_.assign(table_.size(), false);
  for (const LayerParams& q : lp_)
    for (size_t i : {q.qkv_w, q.proj_w, q.fc_w, q.fcproj_w, q.efc_w, q.eproj_w})
      if (i != kNone) has_bf16_copy_[i] = true;
  has_bf16_copy_[head_] = true;
  bf16_copy_.resize(table_.size());
  bf16_copy_fresh_.assign(table_.size(), false);
}

Gpt::~Gpt() = default;

size_t Gpt::index(const std::string& name) const {
  auto i = table_.find(name);
  ENGINE_CHECK(i.has_value(), "model has no parameter named '" + name + "'");
  return *i;
}

void Gpt::release_storage() {
  for (size_t i = 0; i < table_.size(); ++i) {
    param_view_[i] = core::Tensor();
    grad_view_[i] = core::Tensor();
    bf16_copy_[i] = core::Tensor();
    bf16_copy_fresh_[i] = false;
  }
  params_ = core::Tensor();
  grads_ = core::Tensor();
}

void Gpt::bind_param(size_t i, core::Tensor value) {
  ENGINE_CHECK(!value.defined() || value.shape() == table_[i].shape,
               "model: binding " + table_[i].name + " to a tensor of shape " +
                   core::shape_str(value.shape()));
  // A new binding (ZeRO stage 3 gathers a layer before use) needs a new bf16 copy; an unbound
  // parameter's copy is freed with it.
  if (!value.defined()) bf16_copy_.at(i) = core::Tensor();
  bf16_copy_fresh_.at(i) = false;
  param_view_.at(i) = std::move(value);
}

void Gpt::bind_grad(size_t i, core::Tensor grad) {
  ENGINE_CHECK(!grad.defined() || grad.shape() == table_[i].shape,
               "model: binding the gradient of " + table_[i].name + " to a tensor of shape " +
                   core::shape_str(grad.shape()));
  grad_view_.at(i) = std::move(grad);
}

const float* Gpt::w(size_t i) const {
  if (i == kNone) return nullptr;
  ENGINE_CHECK(param_view_[i].defined(), "model: parameter " + table_[i].name + " is not bound");
  return param_view_[i].data<float>();
}

float* Gpt::g(size_t i) const {
  if (i == kNone) return nullptr;
  ENGINE_CHECK(grad_view_[i].defined(),
               "model: the gradient of " + table_[i].name + " is not bound");
  return grad_view_[i].data<float>();
}

void Gpt::init_weights() {
  ENGINE_CHECK(params_.defined(), "model: init_weights needs the flat parameter buffer");
  core::Tensor host = core::Tensor::empty({table_.total_numel()});
  for (size_t i = 0; i < table_.size(); ++i) {
    const ParamInfo& p = table_[i];
    table_.init_host(i, host.slice(0, p.offset, p.numel), config_.seed);
  }
  core::write_from_host(backend_, params_, host);
  params_updated();
}

void Gpt::params_updated() {
  bf16_copy_fresh_.assign(table_.size(), false);
}

void Gpt::zero_grad() {
  if (grads_.defined()) {
    backend_.fill_zero(grads_.raw_data(), grads_.nbytes());
    return;
  }
  for (const core::Tensor& t : grad_view_)
    if (t.defined()) backend_.fill_zero(t.raw_data(), t.nbytes());
}

size_t Gpt::activation_bytes() const {
  return acts_.defined() ? acts_.nbytes() : 0;
}

void Gpt::plan(int B, int T) {
  if (B == B_ && T == T_) return;
  ENGINE_CHECK(B > 0 && T > 0, "model: batch and sequence length must be positive");
  ENGINE_CHECK(T <= config_.seq_len, "model: sequence length " + std::to_string(T) +
                                         " exceeds model.seq_len " +
                                         std::to_string(config_.seq_len));
  const int64_t N = int64_t(B) * T, D = config_.d_model, F = config_.d_ff(), H = config_.n_head,
                Vp = config_.padded_vocab(), E = config_.moe_experts,
                K = config_.moe() ? config_.moe_top_k : 0, M = N * K;
  const bool modern = config_.arch == Arch::Modern;

  // Two passes over the same layout: the first counts, the second hands out pointers. Every
  // block is rounded to 16 floats so each array starts on a 64-byte boundary.
  int64_t used = 0;
  float* base = nullptr;
  auto take = [&](int64_t n) {
    float* p = base ? base + used : nullptr;
    used += (n + 15) / 16 * 16;
    return p;
  };
  // bf16 arrays only in bf16 precision (two elements per float of the layout); a GEMM input
  // is one of them or an f32 array, never both.
  auto take_bf16 = [&](int64_t n) {
    return bf16_ ? reinterpret_cast<core::bf16*>(take((n + 1) / 2)) : nullptr;
  };
  auto take_f32 = [&](int64_t n) { return bf16_ ? nullptr : take(n); };
  auto take_fp8 = [&](int64_t n) { return reinterpret_cast<core::fp8*>(take((n + 3) / 4)); };
  // The residual stream: f32, or in bf16 precision bf16 only.
  auto take_stream = [&](int64_t n) {
    return bf16_ ? Stream{nullptr, take_bf16(n)} : Stream{take(n), nullptr};
  };
  auto layout = [&]() {
    used = 0;
    encoded_ = take_stream(N * D);
    embed_raw_ = config_.x0_norm ? take(N * D) : nullptr;
    embed_rstd_ = config_.x0_norm ? take(N) : nullptr;
    ve_heads_.clear();
    dve_heads_.clear();
    for (int i = 0; i < config_.value_embeds; ++i) {
      ve_heads_.push_back(take(N * D));
      dve_heads_.push_back(take(N * D));
    }
    ve_rows_ = config_.value_embeds > 0 ? take(N * D) : nullptr;
    dx0_ = config_.x0_lambdas ? take(N * D) : nullptr;
    dskip_.clear();
    for (int i = 0; i < config_.unet_count(); ++i)
      dskip_.push_back(take(N * D));
    dmix_ = take(N * D);
    layers_.assign(config_.n_layer, LayerActs{});
    for (int l = 0; l < config_.n_layer; ++l) {
      LayerActs& a = layers_[l];
      if (config_.skip_source(l) >= 0) a.skipped = take_stream(N * D);
      if (config_.x0_lambdas) a.mixed = take_stream(N * D);
      if (config_.has_v_lambdas(l)) a.vmix = take(N * D);
      a.ln1 = take_f32(N * D);
      a.ln1_bf16 = take_bf16(N * D);
      a.ln1_mean = take(N);
      a.ln1_rstd = take(N);
      a.qkv = take(N * 3 * D);
      if (modern) {
        a.q = take(N * D);
        a.k = take(N * D);
        a.v = take(N * D);
        a.q_rstd = take(N * H);
        a.k_rstd = take(N * H);
        a.qr = take(N * D);
        a.kr = take(N * D);
      }
      a.lse = take(B * H * int64_t(T));
      a.atty = take_f32(N * D);
      a.atty_bf16 = take_bf16(N * D);
      a.res_mid = take_stream(N * D);
      a.ln2 = take_f32(N * D);
      a.ln2_bf16 = take_bf16(N * D);
      a.ln2_mean = take(N);
      a.ln2_rstd = take(N);
      if (config_.moe()) {
        a.probs = take(N * E);
        a.xe = take_f32(M * D);
        a.xe_bf16 = take_bf16(M * D);
        a.pre = take(M * F);
        a.act = take_f32(M * F);
        a.act_bf16 = take_bf16(M * F);
        a.ye = take(M * D);
        core::MoeRouting& r = a.route;
        r.chosen = reinterpret_cast<int32_t*>(take(M));
        r.slot_row = reinterpret_cast<int32_t*>(take(M));
        r.row_token = reinterpret_cast<int32_t*>(take(M));
        r.row_gate = take(M);
        r.sel_sum = take(N);
        r.frac = take(E);
        r.offset = reinterpret_cast<int32_t*>(take(E + 1));
        r.mass = reinterpret_cast<double*>(take(2 * E));
      } else {
        a.pre = take(N * F);
        a.act = take_f32(N * F);
        a.act_bf16 = take_bf16(N * F);
      }
      a.res_out = take_stream(N * D);
    }
    lnf_ = take_f32(N * D);
    head_xq_ = config_.head_fp8 ? take_fp8(N * D) : nullptr;
    head_wq_ = config_.head_fp8 ? take_fp8(Vp * D) : nullptr;
    head_gq_ = config_.head_fp8 ? take_fp8(N * Vp) : nullptr;
    lnf_bf16_ = take_bf16(N * D);
    lnf_mean_ = take(N);
    lnf_rstd_ = take(N);
    // bf16 precision's ordinary head stores the logits (then d logits) in bf16 only; the FP8
    // head keeps f32 logits (its training forward writes them, its evaluation reads them).
    const bool bf16_logits = bf16_ && !config_.head_fp8;
    logits_ = bf16_logits ? nullptr : take(N * Vp);
    logits_bf16_ = bf16_logits ? take_bf16(N * Vp) : nullptr;
    losses_ = take(N);
    tokens_ = reinterpret_cast<int32_t*>(take(N));
    if (config_.masked_attention()) {
      key_begin_long_ = reinterpret_cast<int32_t*>(take(N));
      key_begin_short_ = reinterpret_cast<int32_t*>(take(N));
    }
    targets_ = reinterpret_cast<int32_t*>(take(N));
    last_index_ = reinterpret_cast<int32_t*>(take(B));
    last_hidden_ = take_f32(B * D);
    last_hidden_bf16_ = take_bf16(B * D);
    last_logits_ = bf16_logits ? nullptr : take(B * Vp);
    last_logits_bf16_ = bf16_logits ? take_bf16(B * Vp) : nullptr;
    const int64_t rows = std::max(N, M);
    dy_bf16_ = take_bf16(rows * D);
    dpre_bf16_ = take_bf16(rows * F);
    dqkv_bf16_ = take_bf16(N * 3 * D);
    router_in_ = config_.moe() && bf16_ ? take(N * D) : nullptr;
    dres_ = take(N * D);
    dln_ = take(N * D);
    // GPT-2's attention backward writes d qkv itself (in bf16 precision dqkv_bf16_); the modern
    // blocks' QK-norm and rotary backward go through the heads' f32 dq, dk, dv.
    dqkv_ = take_f32(N * 3 * D);
    if (modern) {
      dq_ = take(N * D);
      dk_ = take(N * D);
      dv_ = take(N * D);
    }
    datty_ = take(N * D);
    dact_ = take(rows * F);
    dpre_ = take_f32(rows * F);
    if (config_.moe()) {
      dxe_raw_ = take(M * D);
      dye_ = take(M * D);
      dxe_ = take(M * D);
      dgate_ = take(M);
      dprobs_ = take(N * E);
      drouter_ = take(N * E);
    }
  };
  layout();
  // A smaller shape (sampling with a growing prefix, a short last batch) reuses the buffer.
  if (!acts_.defined() || acts_.numel() < used) {
    acts_ = core::Tensor();  // free the previous plan before allocating the new one
    acts_ = core::Tensor::empty({used}, core::DType::F32, backend_.allocator());
    backend_.fill_zero(acts_.raw_data(), acts_.nbytes());
  }
  base = acts_.data<float>();
  layout();
  B_ = B;
  T_ = T;
}

void Gpt::norm_forward(float* out, core::bf16* out_bf16, float* mean, float* rstd, Stream inp,
                       size_t weight, size_t bias) {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model;
  const bool gpt2 = config_.arch == Arch::Gpt2;
  // bf16 precision: the bf16 stream in, the bf16 GEMM input out.
  if (inp.bf16) {
    ENGINE_CHECK(out_bf16, "model: a norm of the bf16 residual stream stores a bf16 output");
    if (gpt2) {
      backend_.layernorm_forward(out_bf16, mean, rstd, inp.bf16, w(weight), w(bias), N, D,
                                 kLayerNormEps);
    } else {
      backend_.rmsnorm_forward(out_bf16, rstd, inp.bf16, N, D, config_.norm_eps);
    }
  } else if (gpt2) {
    backend_.layernorm_forward(out, mean, rstd, inp.f32, w(weight), w(bias), N, D, kLayerNormEps);
  } else {
    backend_.rmsnorm_forward(out, rstd, inp.f32, N, D, config_.norm_eps);
  }
}

void Gpt::norm_backward(float* dinp, const float* dout, Stream inp, const float* mean,
                        const float* rstd, size_t weight, size_t bias) {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model;
  if (config_.arch == Arch::Gpt2 && inp.bf16) {
    backend_.layernorm_backward(dinp, g(weight), g(bias), dout, inp.bf16, w(weight), mean, rstd, N,
                                D);
  } else if (config_.arch == Arch::Gpt2) {
    backend_.layernorm_backward(dinp, g(weight), g(bias), dout, inp.f32, w(weight), mean, rstd, N,
                                D);
  } else if (inp.bf16) {
    backend_.rmsnorm_backward(dinp, dout, inp.bf16, rstd, N, D);
  } else {
    backend_.rmsnorm_backward(dinp, dout, inp.f32, rstd, N, D);
  }
}

void Gpt::act_forward(float* out, core::bf16* out_bf16, const float* inp, int64_t n) {
  const bool gelu = config_.arch == Arch::Gpt2;
  if (out_bf16 && gelu) {
    backend_.gelu_forward(out_bf16, inp, n);
  } else if (out_bf16) {
    backend_.relu2_forward(out_bf16, inp, n);
  } else if (gelu) {
    backend_.gelu_forward(out, inp, n);
  } else {
    backend_.relu2_forward(out, inp, n);
  }
}

Gpt::Operand Gpt::act_backward(const float* inp, const float* dout, int64_t n) {
  const bool gelu = config_.arch == Arch::Gpt2;
  if (bf16_) {
    if (gelu) {
      backend_.gelu_backward(dpre_bf16_, inp, dout, n);
    } else {
      backend_.relu2_backward(dpre_bf16_, inp, dout, n);
    }
    return {nullptr, dpre_bf16_};
  }
  backend_.fill_zero(dpre_, n * sizeof(float));
  if (gelu) {
    backend_.gelu_backward(dpre_, inp, dout, n);
  } else {
    backend_.relu2_backward(dpre_, inp, dout, n);
  }
  return {dpre_, nullptr};
}

float* Gpt::bias_grad(size_t bias) {
  return bias == kNone ? nullptr : g(bias);
}

void Gpt::attn_forward(int l) {
  const int64_t B = B_, T = T_, N = B * T, D = config_.d_model, H = config_.n_head,
                hd = config_.head_dim();
  LayerActs& a = layers_[l];
  const LayerParams& p = lp_[l];
  const Stream res_in = a.input;
  if (!config_.has_attention(l)) {
    copy_stream(a.res_mid, res_in);
    return;
  }
  norm_forward(a.ln1, a.ln1_bf16, a.ln1_mean, a.ln1_rstd, res_in, p.ln1_w, p.ln1_b);
  linear_epilogue(a.qkv, {a.ln1, a.ln1_bf16}, weight(p.qkv_w), p.qkv_b, N, D, 3 * D);
  // GPT-2: q, k and v read in place from qkv, 3 D floats a token.
  const float* q = a.qkv;
  const float* k = a.qkv + D;
  const float* v = a.qkv + 2 * D;
  const core::AttentionLayout layout = attention_layout();
  if (config_.arch == Arch::Modern) {
    // The heads split, QK-norm per head over hd, then rotary on the normalised copies: one pass.
    backend_.qk_norm_rotary_forward(a.qr, a.kr, a.q, a.k, a.v, a.q_rstd, a.k_rstd, a.qkv, B, T, H,
                                    hd, config_.norm_eps, config_.rotary_base,
                                    config_.rotary_truncate);
    q = a.qr;
    k = a.kr;
    v = a.v;
  }
  if (config_.has_v_lambdas(l)) {
    // v = l0 v + l1 ve with the block's learned pair (init 0.5, 0.5); l0 v without a table
    // (modern blocks only: the recipe's keys need arch modern, whose heads are split above).
    const int ve = config_.value_embed_of(l);
    const float* lam = w(p.v_lambdas);
    backend_.scalar_mix(a.vmix, lam, a.v, lam + 1, ve >= 0 ? ve_heads_[ve] : nullptr, N * D);
    v = a.vmix;
  }
  // Below fp32 a device may take attention's products to tensor cores too (TF32).
  // The output [B, T, H hd], the heads merged as written; in bf16 precision written as bf16.
  const bool tf32 = config_.precision != Precision::Fp32;
  const float scale = config_.attention_scale();
  if (a.atty_bf16) {
    backend_.attention_forward(a.atty_bf16, a.lse, q, k, v, B * H, T, hd, scale, mask_of(l), tf32,
                               layout);
  } else {
    backend_.attention_forward(a.atty, a.lse, q, k, v, B * H, T, hd, scale, mask_of(l), tf32,
                               layout);
  }
  // res_mid = res_in + atty @ proj^T (+ bias): the residual add as the GEMM's C.
  residual_linear(a.res_mid, {a.atty_bf16 ? nullptr : a.atty, a.atty_bf16}, weight(p.proj_w),
                  p.proj_b, N, D, D, res_in);
}

void Gpt::attn_backward(int l) {
  const int64_t B = B_, T = T_, N = B * T, D = config_.d_model, H = config_.n_head,
                hd = config_.head_dim();
  LayerActs& a = layers_[l];
  const LayerParams& p = lp_[l];
  // dres holds d/d res_mid; the residual path passes it through unchanged (all of it in a block
  // without attention).
  if (!config_.has_attention(l)) return;
  linear_backward(datty_, g(p.proj_w), dres_, {a.atty_bf16 ? nullptr : a.atty, a.atty_bf16},
                  weight(p.proj_w), N, D, D, 0.0f, nullptr, bias_grad(p.proj_b));
  const bool modern = config_.arch == Arch::Modern;
  const bool v_mixed = config_.has_v_lambdas(l);
  const int ve = config_.value_embed_of(l);
  const core::AttentionLayout layout = attention_layout();
  const bool tf32 = config_.precision != Precision::Fp32;
  const float scale = config_.attention_scale();
  if (!modern) {
    // GPT-2: dq, dk, dv written (=) straight into d qkv's columns, in bf16 precision as bf16 (the
    // QKV projection's GEMMs and its bias gradient read them as written).
    const float *q = a.qkv, *k = a.qkv + D, *v = a.qkv + 2 * D;
    if (dqkv_bf16_) {
      core::bf16* d = dqkv_bf16_;
      backend_.attention_backward(d, d + D, d + 2 * D, datty_, a.atty_bf16, a.lse, q, k, v, B * H,
                                  T, hd, scale, mask_of(l), tf32, layout);
    } else {
      backend_.attention_backward(dqkv_, dqkv_ + D, dqkv_ + 2 * D, datty_, a.atty, a.lse, q, k, v,
                                  B * H, T, hd, scale, mask_of(l), tf32, layout);
    }
    qkv_backward(l, {dqkv_, dqkv_bf16_});
    return;
  }
  // The modern blocks: f32 dq, dk, dv [B, H, T, hd] for the rotary and QK-norm backward, from
  // attention's output as stored.
  const float* v = v_mixed ? a.vmix : a.v;
  if (a.atty_bf16) {
    backend_.attention_backward(dq_, dk_, dv_, datty_, a.atty_bf16, a.lse, a.qr, a.kr, v, B * H, T,
                                hd, scale, mask_of(l), tf32, layout);
  } else {
    backend_.attention_backward(dq_, dk_, dv_, datty_, a.atty, a.lse, a.qr, a.kr, v, B * H, T, hd,
                                scale, mask_of(l), tf32, layout);
  }
  if (v_mixed) {
    // Through v = l0 v (+ l1 ve): d v into dmix, which becomes dv.
    const float* lam = w(p.v_lambdas);
    float* dlam = g(p.v_lambdas);
    backend_.fill_zero(dmix_, N * D * sizeof(float));
    backend_.scalar_mix_backward(dmix_, ve >= 0 ? dve_heads_[ve] : nullptr, dlam, dlam + 1, lam,
                                 a.v, lam + 1, ve >= 0 ? ve_heads_[ve] : nullptr, dv_, N * D);
    std::swap(dmix_, dv_);
  }
  // Undo rotary and the QK-norm, then the heads' split, in one pass: d qkv written whole (in bf16
  // precision as bf16, straight from the heads' f32 gradients).
  Operand dqkv{dqkv_, dqkv_bf16_};
  const float base = config_.rotary_base;
  const bool truncated = config_.rotary_truncate;
  if (dqkv_bf16_) {
    backend_.qk_norm_rotary_backward(dqkv_bf16_, dq_, dk_, dv_, a.q, a.k, a.q_rstd, a.k_rstd, B, T,
                                     H, hd, base, truncated);
  } else {
    backend_.qk_norm_rotary_backward(dqkv_, dq_, dk_, dv_, a.q, a.k, a.q_rstd, a.k_rstd, B, T, H,
                                     hd, base, truncated);
  }
  qkv_backward(l, dqkv);
}

void Gpt::qkv_backward(int l, Operand dqkv) {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model;
  const LayerActs& a = layers_[l];
  const LayerParams& p = lp_[l];
  const Stream res_in = a.input;
  linear_backward(dln_, g(p.qkv_w), dqkv.f32, {a.ln1, a.ln1_bf16}, weight(p.qkv_w), N, D, 3 * D,
                  0.0f, dqkv.bf16, bias_grad(p.qkv_b));
  norm_backward(dres_, dln_, res_in, a.ln1_mean, a.ln1_rstd, p.ln1_w, p.ln1_b);
}

Gpt::Fp8Scales Gpt::fp8_scales() const {
  return {std::sqrt(static_cast<float>(config_.d_model)) / 448.0f, 24.0f / 448.0f, 1.0f / 448.0f};
}

void Gpt::head_fp8_forward(float gain) {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model, Vp = config_.padded_vocab();
  const Fp8Scales s = fp8_scales();
  using core::kmath::Fp8;
  // In bf16 precision the final norm is stored only in bf16 (as the record's activations are):
  // its widened values are what the record scales and rounds.
  if (lnf_) {
    backend_.fp8_encode(head_xq_, lnf_, N * D, s.x, Fp8::E4M3);
  } else {
    backend_.fp8_encode(head_xq_, lnf_bf16_, N * D, s.x, Fp8::E4M3);
  }
  backend_.fp8_encode(head_wq_, w(head_), Vp * D, s.w, Fp8::E4M3);
  core::GemmArgs a;  // the record's forward _scaled_mm: use_fast_accum=True
  a.trans_b = true;
  a.m = N, a.n = Vp, a.k = D, a.alpha = gain * s.x * s.w;
  a.fp8_fast_accum = true;
  backend_.gemm_fp8(a, head_xq_, Fp8::E4M3, head_wq_, Fp8::E4M3, logits_);
}

void Gpt::head_fp8_backward() {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model, Vp = config_.padded_vocab();
  const Fp8Scales s = fp8_scales();
  using core::kmath::Fp8;
  // logits_ holds d loss / d z; g = e5m2(dz / grad_s). The backward GEMMs accumulate exactly
  // (the record's use_fast_accum=False).
  backend_.fp8_encode(head_gq_, logits_, N * Vp, s.grad, Fp8::E5M2);
  core::GemmArgs a;  // d lnf = (grad_s w_s) g Wq
  a.m = N, a.n = D, a.k = Vp, a.alpha = s.grad * s.w;
  core::GemmArgs b;  // d W += (grad_s x_s) g^T Xq
  b.trans_a = true;
  b.m = Vp, b.n = D, b.k = N, b.beta = 1.0f, b.alpha = s.grad * s.x;
  backend_.gemm_fp8(a, head_gq_, Fp8::E5M2, head_wq_, Fp8::E4M3, dln_);
  backend_.gemm_fp8(b, head_gq_, Fp8::E5M2, head_xq_, Fp8::E4M3, g(head_));
}

core::AttentionLayout Gpt::attention_layout() const {
  using L = core::AttentionLayout;
  const int64_t T = T_, D = config_.d_model, H = config_.n_head, hd = config_.head_dim();
  const core::HeadStrides in =
      config_.arch == Arch::Modern ? L::packed_heads(H, T, hd) : L::token_rows(T, hd, 3 * D);
  return {H, in, in, in, L::token_rows(T, hd, D)};
}

void Gpt::set_attention_window(int window) {
  ENGINE_CHECK(config_.window > 0 && window > 0,
               "model: set_attention_window needs model.window and a positive window, got " +
                   std::to_string(window));
  window_ = window;
}

int32_t Gpt::window_begin(int32_t t, bool short_window) const {
  if (window_ <= 0) return 0;
  const int block = config_.window_block;
  if (block == 0) {
    const int w = short_window ? std::max(1, window_ / 2) : window_;
    return std::max(0, t - w + 1);
  }
  // The record's block masks (train_gpt.py create_blockmasks): a query in block t / block keeps
  // the n nearest blocks of its document, n = window / block (short: n / 2), where n = 0 keeps
  // the query's own block (its diagonal block mask). The last block of a row shorter than a
  // multiple of the block is a block like the others, only shorter.
  const int n_long = window_ / block;
  const int n = std::max(1, short_window ? n_long / 2 : n_long);
  return std::max(0, (t / block - n + 1) * block);
}

void Gpt::set_key_begins(const int32_t* tokens, int B, int T) {
  // Position t sees keys from max(start of its document, window_begin(t)): both only grow with t.
  std::vector<int32_t> begins[2];
  for (int s = 0; s < 2; ++s) {
    begins[s].resize(static_cast<size_t>(B) * T);
    for (int b = 0; b < B; ++b) {
      int32_t doc = 0;
      for (int t = 0; t < T; ++t) {
        if (config_.doc_bos >= 0 && tokens[b * T + t] == config_.doc_bos) doc = t;
        begins[s][b * T + t] = std::max(doc, window_begin(t, s == 1));
      }
    }
  }
  backend_.copy_from_host(key_begin_long_, begins[0].data(), begins[0].size() * sizeof(int32_t));
  backend_.copy_from_host(key_begin_short_, begins[1].data(), begins[1].size() * sizeof(int32_t));
}

core::AttentionMask Gpt::mask_of(int l) const {
  if (!config_.masked_attention()) return {};
  return {config_.short_window(l) ? key_begin_short_ : key_begin_long_, config_.n_head};
}

void Gpt::input_forward(int l) {
  LayerActs& a = layers_[l];
  Stream x = l == 0 ? encoded_ : layers_[l - 1].res_out;
  const int src = config_.skip_source(l);
  if (src >= 0) {
    // x + w_i (output of the mirrored block of the first half)
    const float* weight = w(skip_w_) + (l - (config_.n_layer - config_.unet_count()));
    mix_stream(a.skipped, nullptr, x, weight, layers_[src].res_out);
    x = a.skipped;
  }
  if (config_.x0_lambdas) {
    const float* lam = w(lp_[l].lambdas);
    mix_stream(a.mixed, lam, x, lam + 1, encoded_);
    x = a.mixed;
  }
  a.input = x;
}

void Gpt::input_backward(int l) {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model;
  LayerActs& a = layers_[l];
  // dres holds d/d a.input; each mix's backward writes d/d its input into dmix, which becomes
  // dres.
  const Stream prev = l == 0 ? encoded_ : layers_[l - 1].res_out;
  const int src = config_.skip_source(l);
  if (config_.x0_lambdas) {
    const float* lam = w(lp_[l].lambdas);
    float* dlam = g(lp_[l].lambdas);
    backend_.fill_zero(dmix_, N * D * sizeof(float));
    mix_stream_backward(dmix_, dx0_, dlam, dlam + 1, lam, src >= 0 ? a.skipped : prev, lam + 1,
                        encoded_, dres_);
    std::swap(dmix_, dres_);
  }
  if (src >= 0) {
    const int i = l - (config_.n_layer - config_.unet_count());
    backend_.fill_zero(dmix_, N * D * sizeof(float));
    mix_stream_backward(dmix_, dskip_[i], nullptr, g(skip_w_) + i, nullptr, prev, w(skip_w_) + i,
                        layers_[src].res_out, dres_);
    std::swap(dmix_, dres_);
  }
}

bool Gpt::fused_gelu(int l) const {
  // GPT-2's MLP with f32 activations. In bf16 precision the activation is stored in bf16 and its
  // backward reads the f32 pre-activation, which cuBLASLt's epilogue (aux in D's dtype) cannot
  // keep: there the bias stays in the epilogue and GELU a pass of its own (docs/precision.md).
  return config_.arch == Arch::Gpt2 && lp_[l].fc_b != kNone && !layers_[l].act_bf16;
}

void Gpt::mlp_forward(int l) {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model, F = config_.d_ff();
  LayerActs& a = layers_[l];
  const LayerParams& p = lp_[l];
  if (fused_gelu(l)) {
    // pre = ln2 fc^T + b and act = gelu(pre) in the GEMM's epilogue.
    linear_epilogue(a.pre, {a.ln2, a.ln2_bf16}, weight(p.fc_w), p.fc_b, N, D, F, nullptr, a.act);
  } else {
    linear_epilogue(a.pre, {a.ln2, a.ln2_bf16}, weight(p.fc_w), p.fc_b, N, D, F);
    act_forward(a.act, a.act_bf16, a.pre, N * F);
  }
  // res_out = res_mid + act @ proj^T (+ bias): the residual add as the GEMM's C.
  residual_linear(a.res_out, {a.act, a.act_bf16}, weight(p.fcproj_w), p.fcproj_b, N, F, D,
                  a.res_mid);
}

void Gpt::mlp_backward(int l) {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model, F = config_.d_ff();
  LayerActs& a = layers_[l];
  const LayerParams& p = lp_[l];
  Operand dpre;
  if (fused_gelu(l)) {
    // d pre = gelu'(pre) (dres proj) in the GEMM's epilogue.
    linear_backward(dpre_, g(p.fcproj_w), dres_, {a.act, a.act_bf16}, weight(p.fcproj_w), N, F, D,
                    0.0f, nullptr, bias_grad(p.fcproj_b), a.pre);
    dpre = {dpre_, nullptr};
  } else {
    linear_backward(dact_, g(p.fcproj_w), dres_, {a.act, a.act_bf16}, weight(p.fcproj_w), N, F, D,
                    0.0f, nullptr, bias_grad(p.fcproj_b));
    dpre = act_backward(a.pre, dact_, N * F);
  }
  linear_backward(dln_, g(p.fc_w), dpre.f32, {a.ln2, a.ln2_bf16}, weight(p.fc_w), N, D, F, 0.0f,
                  dpre.bf16, bias_grad(p.fc_b));
}

void Gpt::moe_forward(int l) {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model, F = config_.d_ff(),
                E = config_.moe_experts, K = config_.moe_top_k, M = N * K;
  LayerActs& a = layers_[l];
  const LayerParams& p = lp_[l];
  const core::MoeRouting& r = a.route;

  // Router probabilities, then top-k, gates, dispatch rows and the aux loss on the device.
  linear(a.probs, {router_input(l), nullptr}, weight(p.router_w), N, D, E);
  backend_.softmax_forward(a.probs, a.probs, N, E);
  backend_.moe_route(r, losses_now_ + 1, a.probs, N, E, K, config_.moe_aux_weight);
  // The per-expert GEMMs take their row counts on the host: the one read of a layer's routing
  // (E + 1 offsets), kept for the backward.
  a.expert_rows.resize(E + 1);
  backend_.copy_to_host(a.expert_rows.data(), r.offset, (E + 1) * sizeof(int32_t));
  expert_rows_.resize(static_cast<size_t>(config_.n_layer * E));
  for (int64_t e = 0; e < E; ++e)
    expert_rows_[l * E + e] += a.expert_rows[e + 1] - a.expert_rows[e];

  // Dispatch, one pair of GEMMs per expert over its contiguous rows, combine.
  if (a.xe_bf16) {
    backend_.gather_rows(a.xe_bf16, a.ln2_bf16, r.row_token, M, D);
  } else {
    backend_.gather_rows(a.xe, a.ln2, r.row_token, nullptr, M, D);
  }
  const Operand xe{a.xe, a.xe_bf16};
  const Operand fc = weight(p.efc_w);
  const Operand proj = weight(p.eproj_w);
  const std::vector<int32_t>& offset = a.expert_rows;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offset[e], c = offset[e + 1] - r0;
    if (c == 0) continue;
    linear(a.pre + r0 * F, xe.at(r0 * D), fc.at(e * F * D), c, D, F);
  }
  act_forward(a.act, a.act_bf16, a.pre, M * F);
  const Operand act{a.act, a.act_bf16};
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offset[e], c = offset[e + 1] - r0;
    if (c == 0) continue;
    linear(a.ye + r0 * D, act.at(r0 * F), proj.at(e * D * F), c, F, D);
  }
  if (a.res_out.bf16) {
    // The bf16 stream: res_mid plus each token's gated rows in f32, rounded once.
    backend_.combine_rows(a.res_out.bf16, a.res_mid.bf16, a.ye, r.slot_row, r.row_gate, N, K, D);
  } else {
    backend_.copy(a.res_out.f32, a.res_mid.f32, N * D * sizeof(float));
    backend_.scatter_add_rows(a.res_out.f32, a.ye, r.row_token, r.row_gate, M, D);
  }
}

void Gpt::moe_backward(int l) {
  const int64_t N = int64_t(B_) * T_, D = config_.d_model, F = config_.d_ff(),
                E = config_.moe_experts, K = config_.moe_top_k, M = N * K;
  LayerActs& a = layers_[l];
  const LayerParams& p = lp_[l];
  const core::MoeRouting& r = a.route;
  const std::vector<int32_t>& offset = a.expert_rows;

  // d gate of each row = <dout[token], y_row>; d y_row = gate * dout[token].
  backend_.gather_rows(dxe_raw_, dres_, r.row_token, nullptr, M, D);
  backend_.row_dot(dgate_, dxe_raw_, a.ye, M, D);
  backend_.gather_rows(dye_, dres_, r.row_token, r.row_gate, M, D);
  const Operand fc = weight(p.efc_w);
  const Operand proj = weight(p.eproj_w);
  const Operand xe{a.xe, a.xe_bf16}, act{a.act, a.act_bf16};
  float* dfc = g(p.efc_w);
  float* dproj = g(p.eproj_w);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offset[e], c = offset[e + 1] - r0;
    if (c == 0) continue;
    linear_backward(dact_ + r0 * F, dproj + e * D * F, dye_ + r0 * D, act.at(r0 * F),
                    proj.at(e * D * F), c, F, D, 0.0f);
  }
  const Operand dpre = act_backward(a.pre, dact_, M * F);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offset[e], c = offset[e + 1] - r0;
    if (c == 0) continue;
    const Operand dy = dpre.at(r0 * F);
    linear_backward(dxe_ + r0 * D, dfc + e * F * D, dy.f32, xe.at(r0 * D), fc.at(e * F * D), c, D,
                    F, 0.0f, dy.bf16);
  }
  backend_.fill_zero(dln_, N * D * sizeof(float));
  backend_.scatter_add_rows(dln_, dxe_, r.row_token, nullptr, M, D);

  // Router: through the renormalised gates and the aux loss into d probs, then the softmax.
  backend_.fill_zero(dprobs_, N * E * sizeof(float));
  backend_.moe_router_backward(dprobs_, r, dgate_, N, E, K, config_.moe_aux_weight);
  backend_.fill_zero(drouter_, N * E * sizeof(float));
  backend_.softmax_backward(drouter_, dprobs_, a.probs, N, E);
  linear_backward(dln_, g(p.router_w), drouter_, {router_input(l), nullptr}, weight(p.router_w), N,
                  D, E, 1.0f);
}

void Gpt::run_forward(const int32_t* tokens, const int32_t* targets, int B, int T, bool want_grad) {
  plan(B, T);
  const int64_t N = int64_t(B) * T, D = config_.d_model, V = config_.vocab_size,
                Vp = config_.padded_vocab(), Vs = config_.softmax_vocab();
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
  if (config_.masked_attention()) set_key_begins(tokens, B, T);
  if (targets) backend_.copy_from_host(targets_, targets, N * sizeof(int32_t));
  have_grad_state_ = false;
  backend_.fill_zero(losses_now_, 2 * sizeof(float));  // cross-entropy, aux loss

  notify(LayerEvent::kBeforeForward, -1);
  if (config_.x0_norm) {
    // x0 = rmsnorm(embed(tokens)): the first block's input and the x0 lambdas' x0.
    backend_.embedding_forward(embed_raw_, tokens_, w(embed_), w(pos_), B, T, D);
    if (encoded_.bf16) {
      backend_.rmsnorm_forward(encoded_.bf16, embed_rstd_, embed_raw_, N, D, config_.norm_eps);
    } else {
      backend_.rmsnorm_forward(encoded_.f32, embed_rstd_, embed_raw_, N, D, config_.norm_eps);
    }
  } else if (encoded_.bf16) {
    backend_.embedding_forward(encoded_.bf16, tokens_, w(embed_), w(pos_), B, T, D);
  } else {
    backend_.embedding_forward(encoded_.f32, tokens_, w(embed_), w(pos_), B, T, D);
  }
  for (int i = 0; i < config_.value_embeds; ++i) {
    // Looked up once per forward, kept in the heads' layout of v for the blocks that mix it in.
    const int64_t H = config_.n_head, hd = config_.head_dim();
    backend_.embedding_forward(ve_rows_, tokens_, w(value_embed_[i]), nullptr, B, T, D);
    backend_.fill_zero(ve_heads_[i], N * D * sizeof(float));
    backend_.merge_heads_backward(ve_heads_[i], ve_rows_, B, T, H, hd);
  }
  notify(LayerEvent::kAfterForward, -1);
  for (int l = 0; l < config_.n_layer; ++l) {
    notify(LayerEvent::kBeforeForward, l);
    input_forward(l);
    attn_forward(l);
    LayerActs& a = layers_[l];
    norm_forward(a.ln2, a.ln2_bf16, a.ln2_mean, a.ln2_rstd, a.res_mid, lp_[l].ln2_w, lp_[l].ln2_b);
    if (config_.moe()) {
      moe_forward(l);
    } else {
      mlp_forward(l);
    }
    notify(LayerEvent::kAfterForward, l);
  }
  notify(LayerEvent::kBeforeForward, config_.n_layer);
  norm_forward(lnf_, lnf_bf16_, lnf_mean_, lnf_rstd_, layers_.back().res_out, lnf_w_, lnf_b_);
  if (!targets) {
    notify(LayerEvent::kAfterForward, config_.n_layer);
    return;
  }
  // The logits enter the loss times logit_gain() (1 but for the sigmoid cap), so d loss / d z
  // is the gain times the loss kernel's gradient: it goes into the kernel's scale.
  const float gain = config_.logit_gain();
  const bool fp8_head = want_grad && config_.head_fp8;  // the record's head in training only
  if (fp8_head) {
    head_fp8_forward(gain);
  } else if (logits_bf16_) {
    linear(logits_bf16_, {lnf_, lnf_bf16_}, weight(head_), N, D, Vp, gain);
  } else {
    linear(logits_, {lnf_, lnf_bf16_}, weight(head_), N, D, Vp, 0.0f, gain);
  }
  // With want_grad the fused loss also overwrites the logits with d loss / d logits (in bf16
  // precision: the bf16 logits with the gradient rounded to bf16, for the head's GEMMs; the FP8
  // head rounds its f32 gradient itself).
  const float scale = gain / static_cast<float>(N);
  if (logits_bf16_) {
    backend_.cross_entropy(losses_, want_grad ? logits_bf16_ : nullptr, logits_bf16_, targets_, N,
                           Vs, Vp, config_.tanh_cap(), scale);
  } else {
    backend_.cross_entropy(losses_, want_grad ? logits_ : nullptr, logits_, targets_, N, Vs, Vp,
                           config_.tanh_cap(), scale);
  }
  backend_.mean_loss(losses_now_, losses_, N);
  have_grad_state_ = want_grad;
  notify(LayerEvent::kAfterForward, config_.n_layer);
}

std::array<float, 2> Gpt::read_losses() const {
  std::array<float, 2> host{};
  backend_.copy_to_host(host.data(), losses_now_, sizeof(host));
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
  backend_.accumulate_loss(loss_sum_, losses_now_, 2);
}

std::vector<int64_t> Gpt::take_expert_rows() {
  std::vector<int64_t> rows = std::move(expert_rows_);
  expert_rows_.clear();
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
  const int64_t D = config_.d_model, V = config_.vocab_size, Vp = config_.padded_vocab();
  std::vector<int32_t> last(B);
  for (int b = 0; b < B; ++b)
    last[b] = b * T + T - 1;
  backend_.copy_from_host(last_index_, last.data(), B * sizeof(int32_t));
  if (lnf_bf16_) {
    backend_.gather_rows(last_hidden_bf16_, lnf_bf16_, last_index_, B, D);
  } else {
    backend_.gather_rows(last_hidden_, lnf_, last_index_, nullptr, B, D);
  }
  std::vector<float> padded(B * Vp);
  if (last_logits_bf16_) {
    // The logits the loss reads in bf16 precision: gain z rounded once (the loss's head GEMM),
    // widened here and the gain taken off again.
    const float gain = config_.logit_gain();
    linear(last_logits_bf16_, {last_hidden_, last_hidden_bf16_}, weight(head_), B, D, Vp, gain);
    std::vector<core::bf16> rounded(padded.size());
    backend_.copy_to_host(rounded.data(), last_logits_bf16_, rounded.size() * sizeof(core::bf16));
    for (size_t i = 0; i < padded.size(); ++i)
      padded[i] = core::kmath::float_from_bf16(rounded[i]) / gain;
  } else {
    linear(last_logits_, {last_hidden_, last_hidden_bf16_}, weight(head_), B, D, Vp);
    backend_.copy_to_host(padded.data(), last_logits_, padded.size() * sizeof(float));
  }
  std::vector<float> out(B * V);
  const float cap = config_.softcap;
  const bool sigmoid = config_.softcap_form == SoftcapForm::Sigmoid;
  for (int b = 0; b < B; ++b) {
    for (int64_t v = 0; v < V; ++v) {
      const float z = padded[b * Vp + v];
      if (sigmoid) {
        out[b * V + v] = cap / (1.0f + std::exp(-z / config_.softcap_scale));
      } else {
        out[b * V + v] = cap > 0.0f ? cap * std::tanh(z / cap) : z;
      }
    }
  }
  return out;
}

void Gpt::backward() {
  ENGINE_CHECK(have_grad_state_, "model: backward() needs a forward() with targets before it");
  have_grad_state_ = false;
  const int64_t B = B_, T = T_, N = B * T, D = config_.d_model, Vp = config_.padded_vocab();
  // logits_ (bf16 precision: logits_bf16_) holds d loss / d logits (zero in the padded columns, so
  // padded head rows get none).
  backend_.fill_zero(dres_, N * D * sizeof(float));
  for (float* d : dve_heads_)
    backend_.fill_zero(d, N * D * sizeof(float));
  for (float* d : dskip_)
    backend_.fill_zero(d, N * D * sizeof(float));
  if (dx0_) backend_.fill_zero(dx0_, N * D * sizeof(float));
  notify(LayerEvent::kBeforeBackward, config_.n_layer);
  if (config_.head_fp8) {
    head_fp8_backward();
  } else {
    linear_backward(dln_, g(head_), logits_, {lnf_, lnf_bf16_}, weight(head_), N, D, Vp, 0.0f,
                    logits_bf16_);
  }
  norm_backward(dres_, dln_, layers_.back().res_out, lnf_mean_, lnf_rstd_, lnf_w_, lnf_b_);
  notify(LayerEvent::kAfterBackward, config_.n_layer);
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    LayerActs& a = layers_[l];
    notify(LayerEvent::kBeforeBackward, l);
    // A U-net skip source's output also fed a block of the second half.
    if (config_.unet_count() > 0 && l < config_.unet_count())
      backend_.add(dres_, dres_, dskip_[config_.unet_count() - 1 - l], N * D);
    // dres: d/d res_out. MLP branch into dln, then its norm adds into dres (= d/d res_mid).
    if (config_.moe()) {
      moe_backward(l);
    } else {
      mlp_backward(l);
    }
    norm_backward(dres_, dln_, a.res_mid, a.ln2_mean, a.ln2_rstd, lp_[l].ln2_w, lp_[l].ln2_b);
    attn_backward(l);
    input_backward(l);
    notify(LayerEvent::kAfterBackward, l);
  }
  if (dx0_) backend_.add(dres_, dres_, dx0_, N * D);
  if (config_.x0_norm) {
    // Through x0 = rmsnorm(embedding rows): d rows into dmix, which becomes dres.
    backend_.fill_zero(dmix_, N * D * sizeof(float));
    backend_.rmsnorm_backward(dmix_, dres_, embed_raw_, embed_rstd_, N, D);
    std::swap(dmix_, dres_);
  }
  backend_.embedding_backward(g(embed_), g(pos_), dres_, tokens_, B, T, D);
  for (int i = 0; i < config_.value_embeds; ++i) {
    backend_.merge_heads(ve_rows_, dve_heads_[i], B, T, config_.n_head, config_.head_dim());
    backend_.embedding_backward(g(value_embed_[i]), nullptr, ve_rows_, tokens_, B, T, D);
  }
  notify(LayerEvent::kAfterBackward, -1);
}

}  // namespace model
