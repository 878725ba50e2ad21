// A layer of the model: one mechanism with its parameters, its arrays in the activation plan, its
// forward and its backward (llm.c's pairs). A model is a list of them that its config builds
// (model/gpt.cpp); each reads the residual stream and hands on the stream after it, and its
// backward turns the gradient of its output into the gradient of its input. Layers know nothing
// of sharding or optimizers: they read parameters and accumulate gradients through the
// ParamStore, whose views the sharding layer may rebind between layer events.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "model/activation_plan.h"
#include "model/linear.h"
#include "model/model_config.h"
#include "model/param_store.h"
#include "model/residual_stream.h"

namespace model {

// What every layer shares: the config, the device, the parameters, the GEMMs, the current batch
// and the residual stream's gradient.
struct Context {
  Context(const ModelConfig& c, core::Backend& b, ParamStore& p)
      : config(c), backend(b), params(p), linear(b, c.precision) {}

  const ModelConfig& config;
  core::Backend& backend;
  ParamStore& params;
  Linear linear;

  // The planned batch: B rows of T tokens, and their ids on the device (targets: null in a
  // forward without them).
  int B = 0, T = 0;
  int64_t N() const { return int64_t(B) * T; }
  int32_t* tokens = nullptr;
  int32_t* targets = nullptr;
  // Whether this forward is followed by a backward (the FP8 head runs in training only).
  bool want_grad = false;
  // The training loss's terms (Gpt::set_loss_weights: record #89's multi-token and prefix
  // targets), which the head applies in a forward with want_grad; evaluation stays the plain
  // cross-entropy. The head sets row_tokens to T.
  core::kmath::LossTerms loss_terms;
  // The forward's {cross-entropy, aux loss} on the device.
  float* losses = nullptr;
  // MoE: the dispatch rows per (block, expert) since the last take (Gpt::take_expert_rows).
  std::vector<int64_t> expert_rows;

  // Backward: d loss / d (the residual stream) [N, D] at the point the backward has reached
  // (dres), the gradient of a norm's output (dln) and a scratch of the same size (dmix) that a
  // mix's backward writes d input into before it is swapped with dres.
  float *dres = nullptr, *dln = nullptr, *dmix = nullptr;
};

class Layer {
 public:
  virtual ~Layer() = default;
  // Takes the layer's arrays (both passes of the plan).
  virtual void plan(ActivationPlan& plan, const Context& ctx) = 0;
  // Reads the stream x and returns the stream after the layer (x itself for a layer that only
  // reads it).
  virtual Stream forward(Context& ctx, Stream x) = 0;
  // Before any layer's backward: zero the gradient sums other layers add into.
  virtual void begin_backward(Context& /*ctx*/) {}
  // ctx.dres holds d loss / d (this layer's output); leaves d loss / d (its input) there.
  virtual void backward(Context& ctx) = 0;
};

}  // namespace model
