// The GPT's shape and switches (YAML `model:`), independent of where the values come from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace model {

enum class Arch { Gpt2, Modern };

const char* arch_name(Arch arch);
Arch parse_arch(const std::string& name);  // "gpt2" | "modern"; anything else throws

// What the matmuls compute in (train.precision; docs/precision.md). Fp32: f32 throughout. Tf32:
// f32 values, GEMMs on TF32 tensor cores (GPUs). Bf16: each matmul weight, the activation it
// multiplies and, in the backward, the gradient it multiplies, rounded to bf16 for the GEMM;
// f32 accumulation and outputs; everything else (norms, softmax, loss, gradients, their
// reduction, the optimizers, the MoE router) f32. The parameters stay f32 in every precision.
enum class Precision { Fp32, Tf32, Bf16 };

const char* precision_name(Precision precision);
Precision parse_precision(const std::string& name);  // "fp32" | "tf32" | "bf16"; else throws

// The logit cap: cap tanh(z / cap), or cap sigmoid(z / scale) (modded-nanogpt's form, which is
// a tanh cap of cap/2 on z cap / (4 scale) shifted by cap/2: the softmax does not see the shift).
enum class SoftcapForm { Tanh, Sigmoid };

const char* softcap_form_name(SoftcapForm form);
SoftcapForm parse_softcap_form(const std::string& name);  // "tanh" | "sigmoid"; else throws

// The smear's gate reads the first 12 columns of a row (the record's smear_gate, nn.Linear(12, 1)).
inline constexpr int kSmearGateWidth = 12;

struct ModelConfig {
  int n_layer = 2;
  int n_head = 2;
  int d_model = 64;
  int seq_len = 64;
  int vocab_size = 50257;
  Arch arch = Arch::Modern;
  float softcap = 0.0f;  // logit soft-cap; <= 0 is off
  int moe_experts = 0;   // 0: dense MLP
  int moe_top_k = 2;
  float moe_aux_weight = 0.01f;
  uint64_t seed = 1337;  // initialisation seed
  Precision precision = Precision::Fp32;
  SoftcapForm softcap_form = SoftcapForm::Tanh;
  float softcap_scale = 0.0f;  // the sigmoid form's s
  // The sigmoid form's offset b: cap sigmoid((z + b) / s) (record #89's asymmetric cap, b = 5);
  // the loss kernel then takes gain (z + b), so the logits need f32 storage (not bf16 precision's
  // bf16 logits, unless head_fp8, whose logits are f32).
  float softcap_offset = 0.0f;

  // The parts of modded-nanogpt's PR #102-era record (docs/specs/modded_nanogpt.md c.1), arch
  // modern only, each off by default.
  float attn_scale = 0.0f;          // attention score scale; <= 0: 1/sqrt(head_dim)
  std::vector<int> no_attn_layers;  // blocks without attention (MLP only)
  // Value-embedding tables: block i < n and block n_layer - n + i mix table i into V.
  int value_embeds = 0;
  // Record #89's placement: table i serves block value_embed_layers[i] (value_embeds is then its
  // length; the record: 1, 2, 8, 9, 10).
  std::vector<int> value_embed_layers;
  bool unet_skips = false;      // block n_layer - 1 - i adds skip_weights[.] x (block i's output)
  bool x0_lambdas = false;      // block input = l0 x + l1 x0 (x0 the embedding output)
  bool zero_init_head = false;  // lm_head starts at zero
  int vocab_pad = 64;           // the vocabulary is padded to a multiple of this
  // Attention masks beyond causality: with doc_bos >= 0 a token sees only its own document (the
  // tokens from the last doc_bos at or before it); with window > 0 a block marked 'L' in
  // window_pattern ("" : every block) sees at most the last `window` tokens, one marked 'S' the
  // last window / 2. Gpt::set_attention_window changes the long window (the trainer grows it),
  // and with train.stages sets the short one apart (each stage's own, record #89's).
  int doc_bos = -1;
  int window = 0;
  std::string window_pattern;
  bool window_grow = false;  // the trainer grows the window over training (engine/lr_schedule.h)

  // The record exactly (modded-nanogpt record #24, train_gpt.py at 3e121a6e; docs/
  // record_recipe.md), each off by default: the engine's own choices stay where they were.
  bool x0_norm = false;    // x0 = rmsnorm(embed(x)) (else the raw embedding)
  float norm_eps = 1e-6f;  // every RMSNorm's eps (the record's F.rms_norm: FLT_EPSILON)
  float rotary_base = 10000.0f;
  // The record's half-truncated rotary: head_dim/4 pairs at base^(-j / (head_dim/4 - 1)) (from 1
  // down to 1/base), the other head_dim/4 pairs unrotated (else all pairs at base^(-j/half)).
  bool rotary_truncate = false;
  // Windows in blocks of this many tokens (FlexAttention's block masks; 0: token-granular).
  int window_block = 0;
  bool v_lambdas_all = false;      // every attention block scales v by a learned l0 (init 0.5)
  bool loss_over_padding = false;  // the softmax runs over all padded logits
  float embed_std = 0.02f;         // init std of the embedding and value tables (the record: 1)
  // Hidden-matrix init: normal (std 0.02) or uniform, the record's U(-sqrt(3) s, sqrt(3) s) with
  // s = 0.5 / sqrt(fan_in) for the QKV and MLP fc weights (projections zero either way).
  bool uniform_matrix_init = false;
  // lm_head in FP8 in training, the record's scales (model/layers/fp8_head.h).
  bool head_fp8 = false;
  // The MLP's two forward GEMMs in FP8 in training, the record's dynamic and delayed scales
  // (model/layers/fp8_mlp.h); the backward as without it.
  bool mlp_fp8 = false;
  // head_fp8's scales of the final norm, the weight and the logits' gradient, in units of 1/448
  // (x 0: sqrt(d_model)); record #89's: 100, 1.6, 0.75.
  float head_fp8_x_scale = 0.0f;
  float head_fp8_w_scale = 24.0f;
  float head_fp8_grad_scale = 1.0f;
  // Record #89's partial key offset in the long-window blocks (model/layers/key_offset.h); needs
  // rotary_truncate (the unrotated half it shifts) and window.
  bool key_offset = false;
  // Record #89's input side, each off by default (arch modern). The bigram hash embedding's rows
  // (model/layers/bigram_embedding.h; the record: 377,280 = 50304 * 15 / 2), 0: off.
  int64_t bigram_rows = 0;
  // The smear of each embedding row into the next before x0's norm (model/layers/smear.h); needs
  // x0_norm and d_model >= kSmearGateWidth.
  bool smear = false;
  // Record #89's block wiring with its MUDD blocks and MUDD gates (model/gpt_mudd.cpp,
  // model/layers/coefficient_mlp.h): per-token coefficients from small MLPs over the stream, at
  // the record's fixed places in its 11 blocks of 6 heads (the kMudd* constants below). Needs
  // sublayer_lambdas and no_attn_layers {6}; takes no value tables yet. Parameters:
  // mudd_gate.{0,1}.{w1,w2,b2} (26 and 41 coefficients, made from x0 and at block 4's input),
  // mudd_gate.scale (their shared learned scale), mudd.{0,1}.{w1,w2,b2} (14 and 5 coefficients,
  // made at the last block's input and after it), skip_lambda (block 6's skip gate).
  bool mudd = false;
  // Record #89's sublayer lambdas: each block's attention and MLP write their output y alone and
  // the block mixes x = rho x + pi y (blocks.<l>.resid_lambdas init sqrt 1.1 and post_lambdas
  // init 1, one of each per sublayer; with mudd the last block takes its MUDD coefficients
  // instead and blocks 0..9 also add their x0 gate times x0 after attention). Dense MLP only.
  bool sublayer_lambdas = false;
  // Record #89's QKV and O weight lambdas: an attention block's q, k, v come from
  // a (l_qkv W_qkv)^T and its output from atty (l_o W_o)^T (blocks.<l>.attn.qkvo_lambdas, init
  // 0.5 and 1; model/layers/weight_lambda.h). Independent of v_lambdas_all's (v, ve) mix.
  bool qkvo_lambdas = false;

  // model.mudd's fixed layout: the blocks and heads it is written for, each MLP's coefficient
  // count, the block whose input makes gate 1.
  static constexpr int kMuddBlocks = 11, kMuddHeads = 6;
  static constexpr int kMuddGate0Coefs = 26, kMuddGate1Coefs = 41, kMudd0Coefs = 14,
                       kMudd1Coefs = 5;
  static constexpr int kMuddGate1Block = 4;
  // The block without attention that adds sigmoid(skip_lambda) g_skip cache3 (gate 1's column
  // 28), and the blocks whose outputs are cache3 and cache7.
  static constexpr int kMuddSkipBlock = 6, kMuddCache3 = 3, kMuddCache7 = 7;
  // Record #89's paired heads in these blocks (model/layers/rotary_attention.h): head h of token t
  // is rotated at position 2t + h mod 2, and heads h and h + n_head / 2 attend as one head over
  // the interleaved sequence of 2T (documents doubled, the window counted on it).
  std::vector<int> paired_head_layers;
  // Record #89's YaRN (model/layers/yarn.h): each change of the long window (Gpt::
  // set_attention_window) rescales the rotary frequencies and the attention scale; needs window
  // and windows that a schedule sets (not window_grow).
  bool yarn = false;
  // Record #89's attention output corrections before the output projection (model/layers/
  // attention.h), per token and head: XSA in xsa_layers, y -= tanh(alpha) (y.v / max(|v|^2,
  // 1e-8)) v with alpha blocks.<i>.attn.xsa_alpha [n_head] (0 at init; not paired blocks), and
  // the output gate in attn_gate_layers, y *= gate with blocks.<i>.attn.out_gate [n_head] (1 at
  // init).
  std::vector<int> xsa_layers;
  std::vector<int> attn_gate_layers;

  // Recipe queries.
  bool has_attention(int layer) const;
  // The value-embedding table block `layer` uses, or -1.
  int value_embed_of(int layer) const;
  // U-net: n = n_layer / 2 skips when on (else 0). Block n_layer - n + i first adds
  // skip_weights[i] times the output of block n - 1 - i (its mirror), for i in [0, n).
  int unet_count() const { return unet_skips ? n_layer / 2 : 0; }
  // The block whose output `layer` adds, or -1; its weight is skip_weights[layer - (n_layer - n)].
  int skip_source(int layer) const;
  float attention_scale() const;
  bool masked_attention() const { return doc_bos >= 0 || window > 0; }
  // Whether block `layer` uses the short window.
  bool short_window(int layer) const;
  // Whether block `layer` has paired heads (paired_head_layers).
  bool paired_heads(int layer) const;
  bool xsa(int layer) const;
  bool attn_gate(int layer) const;
  // Whether block `layer` scales v by its v_lambdas (l0 v, plus l1 ve with a value table).
  bool has_v_lambdas(int layer) const {
    return has_attention(layer) && (v_lambdas_all || value_embed_of(layer) >= 0);
  }
  // The head's logits z enter the loss as tanh_cap() tanh(logit_gain() z / tanh_cap()): gain 1
  // and cap softcap for the tanh form, gain cap / (4 scale) and cap / 2 for the sigmoid form.
  // With softcap_offset b the loss sees tanh_cap() tanh(logit_gain() (z + b) / tanh_cap()).
  float logit_gain() const;
  float tanh_cap() const;

  bool moe() const { return moe_experts > 0; }
  int head_dim() const { return d_model / n_head; }
  int d_ff() const { return 4 * d_model; }
  // Vocabulary rounded up to a multiple of vocab_pad; the padded logits enter the softmax only
  // with loss_over_padding.
  int padded_vocab() const { return (vocab_size + vocab_pad - 1) / vocab_pad * vocab_pad; }
  // The logits the softmax runs over.
  int softmax_vocab() const { return loss_over_padding ? padded_vocab() : vocab_size; }
  // Throws core::Error naming the first inconsistent field.
  void validate() const;
};

}  // namespace model
