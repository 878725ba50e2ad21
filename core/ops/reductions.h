// Op family: Reductions in float64: sums of squares (gradient and Frobenius norms), column dots.
// A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/reductions.cpp and core/cuda/reductions.cu.
#pragma once

#include <cstdint>
#include <span>

#include "core/device.h"

namespace core {

class ReductionOps {
 public:
  virtual ~ReductionOps() = default;

  // sum of x^2 in float64 (gradient norms, Frobenius norms); returns to the host.
  virtual double sum_squares(const float* x, int64_t n) = 0;
  // The sum over the list of sum_squares(x), added in list order from 0 (so bit for bit the host
  // loop over sum_squares), with a single read back to the host.
  virtual double sum_squares_many(std::span<const std::span<const float>> xs) = 0;
  // The same sum written to *out, a float64 in this backend's memory, with no read back (the
  // step's gradient norm stays on the device).
  virtual void sum_squares_many(std::span<const std::span<const float>> xs, double* out) = 0;
  // *scale = kmath::grad_clip_scale(*sum_squares, mean, max_norm), both on this backend's
  // device: the gradients' mean and clip factor without a read back.
  virtual void grad_clip_scale(float* scale, const double* sum_squares, double mean,
                               double max_norm) = 0;
  // The sum of x^2 in float64 in one pass, read back to the host. CPU: in index order (the bits
  // of a host loop); CUDA: in a fixed tree order.
  virtual double sum_squares_in_order(const float* x, int64_t n) = 0;
  // out[j] = sum_i a[i, j] b[i, j] for a, b [rows, cols] (kmath::column_dot: float64, row order);
  // with a = Q and b = K Q, the Rayleigh quotients q_j^T K q_j.
  virtual void column_dots(float* out, const float* a, const float* b, int64_t rows,
                           int64_t cols) = 0;
  // *out = max |x[i]| over n elements (0 for n = 0), a float in this backend's memory, no read
  // back: the amax of a dynamic FP8 scale (model/layers/fp8_mlp.h). Taken on the bit patterns of
  // |x| (an order of non-negative floats), so it is exact in any order, and a NaN wins.
  virtual void abs_max(float* out, const float* x, int64_t n) = 0;
  virtual void abs_max(float* out, const bf16* x, int64_t n) = 0;
};

}  // namespace core
