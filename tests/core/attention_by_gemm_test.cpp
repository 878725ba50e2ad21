// Attention as batched GEMMs (core/attention_by_gemm.h), composed of the CPU backend's GEMMs and
// its attention_softmax ops, against the CPU's own attention (the blocked kernels): the
// composition and its GEMM arguments are what the CUDA backend runs with TF32 tensor cores, so
// they are checked here, on every shape and mask the tile kernels are, with the heads cut into
// chunks that do not divide BH (the mask's head offset) as well as in one chunk.
#include "core/attention_by_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "grad_check.h"
#include "tests/backend_test_data.h"

namespace {

using core::test::expect_within;
using core::test::norm_rel_diff;
using test_data::random_vector;
using FVec = std::vector<float>;

core::Backend& be() {
  return core::cpu_backend();
}

// Query t of batch row b sees keys from begins[b T + t]: documents starting at 0, 3, 4 (one
// token) and T/2, and a window of (T + 1) / 3 over the second row; empty when `masked` is false.
std::vector<int32_t> mask_begins(int64_t B, int64_t T, bool masked) {
  if (!masked) return {};
  std::vector<int32_t> begin(static_cast<size_t>(B * T));
  const int64_t window = std::max<int64_t>(1, (T + 1) / 3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t doc = t >= T / 2 && T / 2 > 4 ? T / 2 : t >= 4 ? 4 : t >= 3 ? 3 : 0;
      begin[static_cast<size_t>(b * T + t)] =
          static_cast<int32_t>(b % 2 == 0 ? doc : std::max<int64_t>(0, t - window + 1));
    }
  return begin;
}

TEST(AttentionByGemm, EqualsTheBlockedKernelsInChunksAndWhole) {
  for (auto [B, H, T, hd] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 1, 1, 64},
                             {2, 3, 7, 4},
                             {1, 5, 65, 80},
                             {2, 2, 130, 64}}) {
    for (bool masked : {false, true}) {
      // Scratch for 2 heads' scores: the forward goes 2 heads at a time, the backward 1; then
      // all at once (the default scratch).
      for (size_t scratch : {2 * static_cast<size_t>(T * T) * sizeof(float), size_t{256} << 20}) {
        const int64_t BH = B * H, n = BH * T * hd;
        SCOPED_TRACE("B " + std::to_string(B) + " H " + std::to_string(H) + " T " +
                     std::to_string(T) + " hd " + std::to_string(hd) + (masked ? " masked" : "") +
                     " scratch " + std::to_string(scratch));
        const std::vector<int32_t> begins = mask_begins(B, T, masked);
        const core::AttentionMask mask{begins.empty() ? nullptr : begins.data(), H};
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        const FVec q = random_vector(n, 1, 2.0f), k = random_vector(n, 2, 2.0f),
                   v = random_vector(n, 3), dout = random_vector(n, 4);
        const FVec dq0 = random_vector(n, 5), dk0 = random_vector(n, 6), dv0 = random_vector(n, 7);

        FVec out(n), lse(BH * T), dq = dq0, dk = dk0, dv = dv0;
        be().attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, hd,
                               scale, mask);
        be().attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                lse.data(), q.data(), k.data(), v.data(), BH, T, hd, scale, mask);

        const core::AttentionByGemm opts{.tf32 = true, .max_scratch_bytes = scratch};
        FVec g_out(n), g_lse(BH * T), g_dq = dq0, g_dk = dk0, g_dv = dv0;
        core::attention_forward_by_gemm(be(), g_out.data(), g_lse.data(), q.data(), k.data(),
                                        v.data(), BH, T, hd, scale, mask, opts);
        core::attention_backward_by_gemm(be(), g_dq.data(), g_dk.data(), g_dv.data(), dout.data(),
                                         g_out.data(), q.data(), k.data(), v.data(), BH, T, hd,
                                         scale, mask, opts);
        // f32 both, summed in other orders: measured at most 3.5e-7.
        expect_within("out", norm_rel_diff(g_out, out), 2e-6);
        expect_within("lse", norm_rel_diff(g_lse, lse), 2e-6);
        if (T > 1) {
          expect_within("dq", norm_rel_diff(g_dq, dq), 2e-6);
          expect_within("dk", norm_rel_diff(g_dk, dk), 2e-6);
        } else {
          // One key: p = 1 and ds = dp - delta = dout . (v - out) = 0, so dq and dk are 0 up to
          // the rounding of the two dot products (written, = : no prefilled values to compare).
          for (const FVec* x : {&dq, &dk, &g_dq, &g_dk})
            for (float e : *x)
              ASSERT_LE(std::abs(e), 1e-5f);
        }
        expect_within("dv", norm_rel_diff(g_dv, dv), 2e-6);
      }
    }
  }
}

// The model's layout: q, k, v read strided from one qkv [B, T, 3, H, hd] (the GEMMs' leading
// dimension 3 D, a chunk of heads within a batch row at hd from each other), out and dout
// [B, T, H hd]; d q, k, v written into d qkv over noise. Against the blocked kernels in the same
// layout, with chunks of 2 heads (which must not cross a batch row: H = 3) and whole.
TEST(AttentionByGemm, StridedQkvEqualsTheBlockedKernels) {
  using L = core::AttentionLayout;
  for (auto [B, H, T, hd] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 3, 7, 4}, {2, 3, 70, 16}}) {
    for (bool masked : {false, true}) {
      for (size_t scratch : {2 * static_cast<size_t>(T * T) * sizeof(float), size_t{256} << 20}) {
        SCOPED_TRACE("T " + std::to_string(T) + (masked ? " masked" : "") + " scratch " +
                     std::to_string(scratch));
        const int64_t BH = B * H, D = H * hd, N = B * T;
        const std::vector<int32_t> begins = mask_begins(B, T, masked);
        const core::AttentionMask mask{begins.empty() ? nullptr : begins.data(), H};
        const core::HeadStrides in = L::token_rows(T, hd, 3 * D);
        const core::AttentionLayout layout{H, in, in, in, L::token_rows(T, hd, D)};
        const float scale = 0.3f;
        const FVec qkv = random_vector(N * 3 * D, 21, 2.0f), dout = random_vector(N * D, 22);
        const float* x = qkv.data();
        FVec out(N * D), lse(BH * T), dqkv = random_vector(N * 3 * D, 23);
        be().attention_forward(out.data(), lse.data(), x, x + D, x + 2 * D, BH, T, hd, scale, mask,
                               false, layout);
        be().attention_backward(dqkv.data(), dqkv.data() + D, dqkv.data() + 2 * D, dout.data(),
                                out.data(), lse.data(), x, x + D, x + 2 * D, BH, T, hd, scale, mask,
                                false, layout);
        const core::AttentionByGemm opts{.tf32 = true, .max_scratch_bytes = scratch};
        FVec g_out(N * D), g_lse(BH * T), g_dqkv = random_vector(N * 3 * D, 24);
        float* g = g_dqkv.data();
        core::attention_forward_by_gemm(be(), g_out.data(), g_lse.data(), x, x + D, x + 2 * D, BH,
                                        T, hd, scale, mask, opts, layout);
        core::attention_backward_by_gemm(be(), g, g + D, g + 2 * D, dout.data(), g_out.data(), x,
                                         x + D, x + 2 * D, BH, T, hd, scale, mask, opts, layout);
        expect_within("out", norm_rel_diff(g_out, out), 2e-6);
        expect_within("lse", norm_rel_diff(g_lse, lse), 2e-6);
        expect_within("d qkv", norm_rel_diff(g_dqkv, dqkv), 2e-6);
      }
    }
  }
}

// The row steps on their own: each row of p sums to 1 over the keys it sees and is exactly 0 at
// the others, lse is the log of the row's sum of exp(s); ds is 0 wherever p is.
TEST(AttentionByGemm, SoftmaxRowsSeeOnlyTheirKeys) {
  const int64_t B = 2, H = 2, BH = B * H, T = 9, hd = 3, head0 = 2;
  // The heads are those from head0 = 2 on (batch row 1 first): their mask rows are shifted.
  const std::vector<int32_t> begins = mask_begins(3, T, true);
  const core::AttentionMask mask{begins.data(), H};
  const FVec s0 = random_vector(BH * T * T, 8, 3.0f);
  FVec p = s0, lse(BH * T);
  be().attention_softmax(p.data(), lse.data(), BH, T, mask, head0);
  for (int64_t r = 0; r < BH * T; ++r) {
    const int64_t t = r % T, first = begins[static_cast<size_t>(((head0 + r / T) / H) * T + t)];
    double sum = 0.0, sum_exp = 0.0;
    for (int64_t j = 0; j < T; ++j) {
      const float pj = p[static_cast<size_t>(r * T + j)];
      if (j < first || j > t) {
        EXPECT_EQ(pj, 0.0f) << "row " << r << " key " << j;
      } else {
        sum += pj;
        sum_exp += std::exp(static_cast<double>(s0[static_cast<size_t>(r * T + j)]));
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << r;
    EXPECT_NEAR(lse[static_cast<size_t>(r)], std::log(sum_exp), 1e-5) << "row " << r;
  }
  const FVec dout = random_vector(BH * T * hd, 9), out = random_vector(BH * T * hd, 10);
  FVec ds = random_vector(BH * T * T, 11);
  be().attention_softmax_backward(ds.data(), p.data(), dout.data(), out.data(), BH, T, hd, mask,
                                  head0);
  for (size_t i = 0; i < ds.size(); ++i) {
    if (p[i] == 0.0f) {
      EXPECT_EQ(ds[i], 0.0f) << "element " << i;
    }
  }
}

}  // namespace
