// A tap on the residual stream (x0 for the x0 lambdas, a U-net skip's source block output, record
// #89's cached activations: cache0 after the embeddings, cache3 and cache7 after the MLPs of blocks
// 3 and 7, cache9 at the last block's input, and a sublayer's input that its mix reads again): it
// keeps the stream as it is at its place and hands it on unchanged. Readers later in the forward
// add d loss / d (the kept stream) into grad(); its backward, which runs after theirs, adds that
// sum into the stream's gradient.
#pragma once

#include "model/layer.h"

namespace model {

class StreamTap : public Layer {
 public:
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void begin_backward(Context& ctx) override;
  void backward(Context& ctx) override;

  Stream stream() const { return kept_; }
  float* grad() const { return dkept_; }

 private:
  Stream kept_;
  float* dkept_ = nullptr;  // d (the kept stream) summed over the readers
};

// How a block's branch (attention, MLP) meets the stream. By default it reads the chain's stream
// and returns x + branch(x). `alone`: it returns the branch's output y by itself (a StreamMix
// after it makes the record's rho x + pi y + ...); `input`: it reads that tap's stream instead of
// the chain's (record #89's blocks 8-10 attend over cache7), its input gradient going there;
// `aux_v` (rotary attention): that tap's stream, read as the heads' rows, is added to v (record
// #89's v_mudd in block 10).
struct BranchWiring {
  bool alone = false;
  const StreamTap* input = nullptr;
  const StreamTap* aux_v = nullptr;
};

}  // namespace model
