// The token embedding: x0 = embed[token] (+ pos_embed[t] for gpt2), the stream's start. With
// model.x0_norm (the record) x0 = rmsnorm(embed[token]). Stored in the stream's dtype.
#pragma once

#include "model/layer.h"

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
};

}  // namespace model
