// Record #34's smear (model.smear; kept through record #89): before x0's norm, each embedding row
// takes in a gated share of the row before it,
//   x[t] += lambda sigmoid(x[t, :12] . w) x[t - 1]      (t >= 1 within a row, across documents)
// with smear_gate w [12] and smear_lambda [1], both zero at init (the record's smear_gate and
// scalars[2 n_layer]). A part of the token embedding (model/layers/token_embedding.h), which owns
// the rows before and after it.
#pragma once

#include "model/layer.h"

namespace model {

class Smear {
 public:
  explicit Smear(Context& ctx);
  void plan(ActivationPlan& plan, const Context& ctx);
  // out [N, D] from the embedding rows x [N, D] (kept for the backward); out must not overlap x.
  void forward(Context& ctx, float* out, const float* x);
  // dx [N, D] written from dout; the gate's gradients accumulated.
  void backward(Context& ctx, float* dx, const float* dout);

 private:
  size_t gate_, lambda_;
  const float* x_ = nullptr;
  float* sigmoid_ = nullptr;  // [N]: each position's sigmoid(x[t, :12] . w), 0 at t = 0
};

}  // namespace model
