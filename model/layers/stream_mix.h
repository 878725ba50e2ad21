// A weighted sum of streams (record #89's residual wiring): out = sum_i c_i s_i, each source s_i
// the chain's stream at this place (a branch's output y) or a StreamTap's (the sublayer's input
// x, x0, cache0, cache7, ...), each weight c_i a coefficient (model/coef_view.h): a learned scalar
// (stride 0: the residual and post lambdas), a per-token column (the MUDD gates' x0 and bigram
// gates, the MUDD blocks' coefficients), or, for the first term only, none (1). Sublayer i's
// x = rho[i] x + pi[i] y + g_x0[i] x0 is three terms.
//
// On bf16 precision's stream the first two terms, when both are scalars, are one rounding and
// each further term one more (the record rounds after every op).
//
// The backward takes d out from the stream's gradient and adds c_i d out into each source's
// gradient (the chain's: the new stream gradient) and <s_i, d out> into each weight's (per token
// for a column, summed over the tokens for a scalar).
#pragma once

#include <functional>
#include <vector>

#include "model/coef_view.h"
#include "model/layer.h"
#include "model/layers/coefficient_mlp.h"
#include "model/layers/stream_tap.h"

namespace model {

// A term's coefficient, looked up at each forward and backward: the parameters' storage (ZeRO
// stage 3) and the activation plan (a new batch shape) may move between steps. `grads`: the
// backward asks for the gradient too (ZeRO stage 3 binds a parameter's gradient only then).
using CoefOf = std::function<CoefView(const Context&, bool grads)>;
// Element `element` of the vector parameter `param` (stride 0).
CoefOf scalar_param(size_t param, int element);
// Column `column` of a coefficient MLP's output.
CoefOf column_of(const CoefficientMlp& producer, int column);

struct MixTerm {
  CoefOf coef;                        // empty: 1 (first term only)
  const StreamTap* source = nullptr;  // null: the chain's stream
};

class StreamMix : public Layer {
 public:
  explicit StreamMix(std::vector<MixTerm> terms);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 private:
  std::vector<MixTerm> terms_;
  Stream in_, out_;
};

}  // namespace model
