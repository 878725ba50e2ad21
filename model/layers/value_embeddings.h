// The record's value embeddings (model.value_embeds = n tables): each table's rows for the tokens,
// looked up once per forward and kept in the heads' layout of v [B, H, T, hd] for the attention
// blocks that mix them into v (block i < n and block n_layer - n + i use table i). It hands the
// stream on unchanged; its backward takes the tables' gradients from what the blocks summed.
#pragma once

#include <vector>

#include "model/layer.h"

namespace model {

class ValueEmbeddings : public Layer {
 public:
  explicit ValueEmbeddings(Context& ctx);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void begin_backward(Context& ctx) override;
  void backward(Context& ctx) override;

  // Table i's rows in the heads' layout, and the sum of their gradients [B, H, T, hd].
  const float* heads(int i) const { return heads_.at(i); }
  float* heads_grad(int i) const { return dheads_.at(i); }

 private:
  std::vector<size_t> tables_;
  std::vector<float*> heads_, dheads_;
  float* rows_ = nullptr;  // [B, T, D] scratch for the lookups
};

}  // namespace model
