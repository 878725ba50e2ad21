// The token embedding: x0 = embed[token] (+ pos_embed[t] for gpt2), the stream's start. With
// model.x0_norm (the record) x0 = rmsnorm(embed[token]); with model.smear (needs x0_norm) the rows
// are smeared before the norm (model/layers/smear.h). Stored in the stream's dtype.
#pragma once

#include <optional>

#include "model/layer.h"
#include "model/layers/smear.h"

namespace model {

class TokenEmbedding : public Layer {
 public:
  explicit TokenEmbedding(Context& ctx);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 private:
  size_t embed_, pos_;
  bool norm_;
  Stream out_;
  // x0_norm: the rows before the norm and its rstd [N].
  float *raw_ = nullptr, *rstd_ = nullptr;
  // model.smear: the smear and its rows (the norm's input in place of raw_).
  std::optional<Smear> smear_;
  float* smeared_ = nullptr;
};

}  // namespace model
