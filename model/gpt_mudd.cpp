// Record #89's block wiring (model.mudd; train_gpt.py at f411b3d3, GPT.forward): Gpt::build's list
// for the record's 11 blocks of 6 heads. Per-token coefficients come from two MUDD gates (26 and 41
// columns) and two MUDD blocks (14 and 5; model/layers/coefficient_mlp.h); the stream is kept at
// x0, cache0 (after the embeddings), cache3 and cache7 (after the MLPs of blocks 3 and 7) and
// cache9 (block 10's input) by taps (model/layers/stream_tap.h), and every sublayer's output is
// mixed into the stream by a StreamMix:
//
//   G0 = gate0(x0);  cache0 = x0                  (+ g_bg[0] bigram: not on this branch)
//   block i (not 6, not 10): y = attn_i(n(i >= 8 ? cache7 : x));
//                            x = rho_a[i] x + pi_a[i] y + g_x0[i] x0
//                            x = rho_m[i] x + pi_m[i] mlp_i(n(x))
//   block 4 first: G1 = gate1(x);  block 6: x += sigmoid(skip_lambda) g_skip cache3, then its MLP
//   block 10: cache9 = x; mu = mudd0(x); v_mudd = mu0 cache0 + mu1 cache7 + mu2 x;
//             x' = (1 + mu5) x + mu3 cache0 + mu4 cache7; y = attn_10(n(cache7)) with v += v_mudd;
//             x = mu8 x' + mu9 y + mu10 cache0;  x = mu12 x + mu13 mlp_10(n(x))
//   after: mu' = mudd1(x); x += mu'0 cache0 + mu'1 cache7 + mu'2 cache9 + mu'4 cache3
//
// The gates' other columns (XSA alphas, attention output gates, DC weights, bigram gates) and the
// value-embedding terms (mu6, mu7, mu'3, the gated tables of blocks 1, 2, 8, 9) belong to layers
// not on this branch: ModelConfig::validate refuses value tables with model.mudd until they are.
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/layers/coefficient_mlp.h"
#include "model/layers/fp8_head.h"
#include "model/layers/mlp.h"
#include "model/layers/rotary_attention.h"
#include "model/layers/skip_gate.h"
#include "model/layers/stream_mix.h"
#include "model/layers/stream_tap.h"
#include "model/layers/token_embedding.h"

namespace model {

namespace {

// The gate column of block `layer`'s x0 gate (its bigram gate is the next column): gate 0 serves
// blocks 0-3 from column 18, gate 1 blocks 4, 5, 7, 8, 9 from column 18, two columns each.
int x0_gate_column(int layer) {
  if (layer < ModelConfig::kMuddGate1Block) return 18 + 2 * layer;
  const int index = layer < ModelConfig::kMuddSkipBlock ? layer - 4 : layer - 5;
  return 18 + 2 * index;
}

}  // namespace

void Gpt::build_mudd() {
  const ModelConfig& c = config_;
  auto tap = [&](Stage& s) { return s.add(std::make_unique<StreamTap>()); };
  auto mix = [&](Stage& s, std::vector<MixTerm> terms) {
    s.add(std::make_unique<StreamMix>(std::move(terms)));
  };
  auto lambda = [&](int layer, const char* name, int k) {
    return scalar_param(params_.index("blocks." + std::to_string(layer) + "." + name), k);
  };
  const std::string scale = "mudd_gate.scale";

  Stage& embeddings = stage(-1);
  embeddings.add(std::make_unique<TokenEmbedding>(ctx_));
  StreamTap* x0 = tap(embeddings);
  const CoefficientMlp* gate0 =
      embeddings.add(std::make_unique<CoefficientMlp>(ctx_, "mudd_gate.0", 0.0f, scale));
  StreamTap* cache0 = tap(embeddings);

  const CoefficientMlp* gate1 = nullptr;
  StreamTap *cache3 = nullptr, *cache7 = nullptr, *cache9 = nullptr;
  const int last = c.n_layer - 1;
  for (int l = 0; l < c.n_layer; ++l) {
    Stage& block = stage(l);
    if (l == ModelConfig::kMuddGate1Block)
      gate1 = block.add(std::make_unique<CoefficientMlp>(ctx_, "mudd_gate.1", 0.0f, scale));
    const CoefficientMlp* mu = nullptr;
    if (l == ModelConfig::kMuddSkipBlock) {
      const SkipGate* skip =
          block.add(std::make_unique<SkipGate>(ctx_, "skip_lambda", column_of(*gate1, 28)));
      mix(block,
          {{CoefOf{}, nullptr}, {[skip](const Context&, bool) { return skip->view(); }, cache3}});
    } else if (l < last) {
      StreamTap* in = tap(block);
      const StreamTap* attn_in = l > ModelConfig::kMuddCache7 ? cache7 : nullptr;
      block.add(
          std::make_unique<RotaryAttention>(ctx_, l, masks_, nullptr, BranchWiring{true, attn_in}));
      const CoefficientMlp& gate = l < ModelConfig::kMuddGate1Block ? *gate0 : *gate1;
      mix(block, {{lambda(l, "resid_lambdas", 0), in},
                  {lambda(l, "post_lambdas", 0), nullptr},
                  {column_of(gate, x0_gate_column(l)), x0}});
    } else {
      cache9 = tap(block);
      mu = block.add(std::make_unique<CoefficientMlp>(ctx_, "mudd.0", 0.1f));
      // v_mudd, kept by a tap for the attention's v; then x' from cache9, not from v_mudd.
      mix(block,
          {{column_of(*mu, 0), cache0}, {column_of(*mu, 1), cache7}, {column_of(*mu, 2), cache9}});
      StreamTap* v_mudd = tap(block);
      mix(block, {{CoefOf{}, cache9},
                  {column_of(*mu, 5), cache9},
                  {column_of(*mu, 3), cache0},
                  {column_of(*mu, 4), cache7}});
      StreamTap* in = tap(block);
      block.add(std::make_unique<RotaryAttention>(ctx_, l, masks_, nullptr,
                                                  BranchWiring{true, cache7, v_mudd}));
      mix(block,
          {{column_of(*mu, 8), in}, {column_of(*mu, 9), nullptr}, {column_of(*mu, 10), cache0}});
    }
    StreamTap* in = tap(block);
    if (fp8_scales_) {
      block.add(std::make_unique<Fp8Mlp>(ctx_, l, *fp8_scales_, BranchWiring{true, nullptr}));
    } else {
      block.add(std::make_unique<Mlp>(ctx_, l, BranchWiring{true, nullptr}));
    }
    if (mu) {
      mix(block, {{column_of(*mu, 12), in}, {column_of(*mu, 13), nullptr}});
    } else {
      mix(block, {{lambda(l, "resid_lambdas", 1), in}, {lambda(l, "post_lambdas", 1), nullptr}});
    }
    if (l == ModelConfig::kMuddCache3) cache3 = tap(block);
    if (l == ModelConfig::kMuddCache7) cache7 = tap(block);
  }

  Stage& head = stage(c.n_layer);
  const CoefficientMlp* mu = head.add(std::make_unique<CoefficientMlp>(ctx_, "mudd.1", 0.1f));
  mix(head, {{CoefOf{}, nullptr},
             {column_of(*mu, 0), cache0},
             {column_of(*mu, 1), cache7},
             {column_of(*mu, 2), cache9},
             {column_of(*mu, 4), cache3}});
  if (c.head_fp8) {
    head_ = head.add(std::make_unique<Fp8Head>(ctx_));
  } else {
    head_ = head.add(std::make_unique<LmHead>(ctx_));
  }
}

}  // namespace model
