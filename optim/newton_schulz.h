// Odd-polynomial orthogonalisers for Muon: quintic Newton-Schulz (NS5) and Polar Express.
//
// For X [m, n] (each of `batch` matrices independently): X <- X / (scale ||X||_F + eps), then per
// iteration with (a, b, c): X <- a X + (b A + c A^2) X with A = X X^T when m <= n, or the same
// polynomial applied from the right, X <- a X + X (b A + c A^2) with A = X^T X when m > n. Both
// forms apply p(s) = a s + b s^3 + c s^5 to the singular values; the right form works on the
// small Gram matrix without transposing, as the reference's "transpose if rows > cols" does.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/backend.h"

namespace optim {

// (3.4445, -4.7750, 2.0315) x steps, scale 1, eps 1e-7 (Keller Jordan's Muon).
core::NewtonSchulzSchedule ns5_schedule(int steps = 5);
// Polar Express (record #38): five tuned triples, scale 1.02, eps 1e-6.
core::NewtonSchulzSchedule polar_express_schedule();
// "ns5" or "polar_express"; anything else is an error naming `context`.
core::NewtonSchulzSchedule schedule_by_name(const std::string& name, int ns_steps,
                                            const std::string& context);

// Orthogonalises x [batch, m, n] in place through the backend's gemm (float32 throughout).
void orthogonalize(core::Backend& backend, float* x, int64_t m, int64_t n,
                   const core::NewtonSchulzSchedule& schedule, int64_t batch = 1);

// Floating-point operations of one orthogonalisation of [batch, m, n], for GFLOP/s reports.
double orthogonalize_flops(int64_t m, int64_t n, int iterations, int64_t batch = 1);

}  // namespace optim
