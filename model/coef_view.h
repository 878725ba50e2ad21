// Per-token coefficients that one layer computes and others read: record #89's MUDD blocks and
// MUDD gates (small GELU MLPs over the stream) feed the x0 and bigram gates, the residual mixes,
// XSA's alpha, the attention output gates and the DC weights, each a few columns of one [N, K]
// array. Token n's coefficients start at values[n * stride]; a view of some columns is the same
// array from its first column on. stride 0 is one row for every token (a learned parameter read
// as a coefficient).
//
// Gradients follow the layers' order: a reader adds d loss / d coef into grads at the places it
// read (with stride 0 summed over the tokens); the producer zeroes grads in begin_backward and
// takes them in its backward, which runs after every reader's as it comes earlier in the forward.
#pragma once

#include <cstdint>

namespace model {

struct CoefView {
  const float* values = nullptr;  // on the device
  float* grads = nullptr;         // on the device; null: no gradient wanted
  int64_t stride = 0;             // floats from one token's row to the next; 0: one row for all

  bool defined() const { return values != nullptr; }
  // The view from column c on.
  CoefView column(int64_t c) const { return {values + c, grads ? grads + c : nullptr, stride}; }
};

}  // namespace model
