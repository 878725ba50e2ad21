// Record #89's bigram hash embedding (records #62 and #83; model.bigram_rows): a table
// BG [rows, D] (zero init) that position t reads at the hash of its token and the one before
// (kmath::bigram_hash_at over each row of tokens, on the device: the model needs no input beside
// the tokens), times a constant row of signs (the record's sign trick, so that bigrams sharing a
// table row differ in sign):
//   bg[t] = BG[hash[t]] * S[(x[t-1] XOR x[t]) mod 8192]     (S row 0 at t = 0)
// S [8192, D] of +-1 is fixed: the record's torch.randn(8192, D).sign() is a buffer saved with
// its weights, and the engine's weight files hold parameters only, so every build draws the same
// S: S[r, d] = -1 where the top bit of core::rng_hash(kBigramSignStream, r D + d) is set, else +1.
// It does not depend on the model seed, so every rank, every run and every reload of a weight
// file agree.
//
// BigramSource (after the embeddings) computes bg and, in the backward, takes the injections'
// summed gradient of it through the signs into BG's rows (only the hashed rows get one: the
// table is an embedding, reduced by sparse rows). BigramInject adds g bg to the stream: at the
// start of block 0 (the record's x = x0 + g_bg[0] bg, x0 kept without it) and after the
// attention of each later block that has attention (the record's layer 6, without attention,
// adds none). Its gate g is read as a model::CoefView: the engine's own form is a learned scalar
// per block, blocks.<i>.bigram_gate (init 0.05, the record's gate bias), read with stride 0; the
// record's per-token MUDD-gate columns are views of the same kind.
#pragma once

#include "core/tensor.h"
#include "model/coef_view.h"
#include "model/layer.h"

namespace model {

inline constexpr int64_t kBigramSignRows = 8192;       // the record's bigram_sign_table_rows
inline constexpr uint64_t kBigramSignStream = 0x5167;  // S's fixed stream of core::rng_hash

// S [kBigramSignRows, D] on the host (f32 +-1), as above.
core::Tensor bigram_sign_table(int64_t D);

class BigramSource : public Layer {
 public:
  explicit BigramSource(Context& ctx);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void begin_backward(Context& ctx) override;
  void backward(Context& ctx) override;

  const float* bg() const { return bg_; }
  float* bg_grad() const { return dbg_; }

 private:
  size_t table_;
  core::Tensor signs_;  // S on the device
  int32_t* ids_ = nullptr;
  float *bg_ = nullptr, *dbg_ = nullptr;  // bg [N, D] and d bg summed over the injections
};

class BigramInject : public Layer {
 public:
  BigramInject(Context& ctx, int block, const BigramSource& source);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 private:
  // The block's gate: its learned scalar (stride 0); its gradient only in the backward (at ZeRO
  // stage 3 a block's gradients are bound for its backward alone).
  CoefView gate(const Context& ctx, bool backward) const;

  size_t gate_;
  const BigramSource& source_;
  Stream out_;
};

}  // namespace model
