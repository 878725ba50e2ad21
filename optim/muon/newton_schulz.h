// Schedules of the odd-polynomial orthogonalisers Muon runs through MuonOps::newton_schulz:
// quintic Newton-Schulz (NS5) and Polar Express. Each iteration (a, b, c) applies
// p(s) = a s + b s^3 + c s^5 to the singular values of X / (scale ||X||_F + eps).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace optim {

// An odd matrix polynomial iteration X <- a X + (b A + c A^2) X with A = X X^T, one (a, b, c)
// per iteration, after X <- X / (norm_scale * ||X||_F + norm_eps). Quintic NS5 is five copies of
// (3.4445, -4.7750, 2.0315) with scale 1 and eps 1e-7; Polar Express has its own table.
struct NewtonSchulzSchedule {
  std::vector<std::array<float, 3>> coefficients;
  float norm_scale = 1.0f;
  float norm_eps = 1e-7f;
  // The GEMMs may use TF32 tensor cores (inputs rounded to 10 mantissa bits): CUDA only; the
  // CPU computes f32. modded-nanogpt runs the iteration in bf16, coarser still.
  bool tf32 = false;
  // modded-nanogpt's bfloat16 iteration (record #24's zeropower_via_newtonschulz5 on
  // G.bfloat16(), as it runs on CUDA): X starts as bf16(x), and every operation's result is
  // rounded to bf16 as its tensor ops store it: the norm, norm + eps and the division; A = X X^T,
  // b A, c A, (c A) A (the record's c * A @ A) and the sum; a X, B X and the sum. The GEMMs take
  // bf16 values and sum in f32 (exact products): on a device TF32 tensor cores change nothing.
  bool bf16 = false;
  // With bf16: b A + (c A) A and a X + B X each computed in f32 from the stored bf16 terms and
  // rounded once, as the record's torch.compile'd function runs (kmath::ns_bf16_fused_axpy; the
  // default), or with b A and a X rounded first, as eager PyTorch (bf16_eager,
  // kmath::ns_bf16_axpy). The two orthogonalised updates differ by about 1e-2.
  bool bf16_eager = false;
};

// (3.4445, -4.7750, 2.0315) x steps, scale 1, eps 1e-7 (Keller Jordan's Muon).
NewtonSchulzSchedule ns5_schedule(int steps = 5);
// Polar Express (record #38): five tuned triples, scale 1.02, eps 1e-6.
NewtonSchulzSchedule polar_express_schedule();
// "ns5" or "polar_express"; anything else is an error naming `context`.
NewtonSchulzSchedule schedule_by_name(const std::string& name, int ns_steps,
                                      const std::string& context);

// Floating-point operations of one orthogonalisation of [batch, m, n], for GFLOP/s reports.
double orthogonalize_flops(int64_t m, int64_t n, int iterations, int64_t batch = 1);

}  // namespace optim
