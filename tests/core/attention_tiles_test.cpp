// The tiled online-softmax attention of the CUDA kernels (core/attention_tiles.h), run on the
// host in float64 with the kernels' loop structure, against the plain CPU attention
// (attention_kernels.h): tile sizes that do not divide T, tiles longer than T, T = 1, the causal
// boundary, document and window masks.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/attention_tiles.h"
#include "core/compare.h"
#include "core/cpu/attention_kernels.h"
#include "grad_check.h"

namespace {

using core::test::expect_within;
using core::test::norm_rel_diff;
using core::test::random_vec;
using Vec = std::vector<double>;
namespace kmath = core::kmath;

struct Case {
  int64_t BH, T, hd, Br, Bc;
};

struct Heads {
  int64_t BH, T, hd;
  double scale;
  // With a mask (core::AttentionMask, one head per row): query i of head h sees keys from
  // begins[h T + i] on; empty: plain causal.
  std::vector<int32_t> begins = {};
  int64_t begin(int64_t h, int64_t i) const {
    return begins.empty() || i >= T ? 0 : begins[static_cast<size_t>(h * T + i)];
  }
  bool visible(int64_t h, int64_t i, int64_t j) const {
    return kmath::masked_visible(i, j, T, begin(h, i));
  }
  // The begin of the last real row of the query tile from r0 (Br rows).
  int64_t last_begin(int64_t h, int64_t r0, int64_t Br) const {
    return begin(h, std::min(r0 + Br, T) - 1);
  }
  const double* at(const Vec& x, int64_t h, int64_t row) const {
    return x.data() + (h * T + row) * hd;
  }
  double score(const Vec& a, int64_t ha, int64_t i, const Vec& b, int64_t j) const {
    double s = 0.0;
    for (int64_t d = 0; d < hd; ++d)
      s += at(a, ha, i)[d] * at(b, ha, j)[d];
    return s * scale;
  }
};

// The forward kernel's steps: per query tile, the key tiles from masked_key_start up to
// causal_key_end, each row's FlashRow advanced by the tile's visible maximum and the accumulator
// rescaled with it. Every skipped key must be invisible to the tile.
void tiled_forward(Vec& out, Vec& lse, const Vec& q, const Vec& k, const Vec& v, const Heads& x,
                   int64_t Br, int64_t Bc) {
  const int64_t T = x.T, hd = x.hd;
  for (int64_t h = 0; h < x.BH; ++h) {
    for (int64_t r0 = 0; r0 < T; r0 += Br) {
      std::vector<kmath::FlashRow<double>> rows(static_cast<size_t>(Br));
      Vec acc(static_cast<size_t>(Br * hd), 0.0);
      const int64_t key_start = kmath::masked_key_start(x.begin(h, r0), Bc);
      for (int64_t i = r0; i < std::min(r0 + Br, T); ++i)
        for (int64_t j = 0; j < key_start; ++j)
          EXPECT_FALSE(x.visible(h, i, j)) << "skipped key " << j << " of query " << i;
      for (int64_t c0 = key_start; c0 < kmath::causal_key_end(r0, Br, T); c0 += Bc) {
        const bool masked = kmath::tile_needs_mask(r0, Br, c0, Bc, T) ||
                            kmath::begin_needs_mask(c0, x.last_begin(h, r0, Br));
        for (int64_t r = 0; r < Br; ++r) {
          const int64_t i = r0 + r;
          Vec s(static_cast<size_t>(Bc));
          double tile_max = -INFINITY;
          for (int64_t c = 0; c < Bc; ++c) {
            const int64_t j = c0 + c;
            const bool seen = x.visible(h, i, j);
            EXPECT_TRUE(masked || seen) << "tile (" << r0 << ", " << c0 << ") skipped its mask";
            s[c] = seen ? x.score(q, h, i, k, j) : -INFINITY;
            tile_max = std::max(tile_max, s[c]);
          }
          const double alpha = rows[r].advance(tile_max);
          for (int64_t d = 0; d < hd; ++d)
            acc[r * hd + d] *= alpha;
          for (int64_t c = 0; c < Bc; ++c) {
            if (s[c] == -INFINITY) continue;
            const double p = rows[r].weight(s[c]);
            rows[r].sum += p;
            for (int64_t d = 0; d < hd; ++d)
              acc[r * hd + d] += p * x.at(v, h, c0 + c)[d];
          }
        }
      }
      for (int64_t r = 0; r < Br && r0 + r < T; ++r) {
        for (int64_t d = 0; d < hd; ++d)
          out[(h * T + r0 + r) * hd + d] = acc[r * hd + d] / rows[r].sum;
        lse[h * T + r0 + r] = rows[r].log_sum_exp();
      }
    }
  }
}

// The backward kernels' steps: delta per row; per key tile over the query tiles from
// causal_first_query_tile until the first whose first begin is past the key tile (dk, dv); per
// query tile over its key tiles (dq). Writes (=) every element, as the kernels do.
void tiled_backward(Vec& dq, Vec& dk, Vec& dv, const Vec& dout, const Vec& out, const Vec& lse,
                    const Vec& q, const Vec& k, const Vec& v, const Heads& x, int64_t Br,
                    int64_t Bc) {
  const int64_t T = x.T, hd = x.hd;
  Vec delta(static_cast<size_t>(x.BH * T), 0.0);
  for (int64_t row = 0; row < x.BH * T; ++row)
    for (int64_t d = 0; d < hd; ++d)
      delta[row] += dout[row * hd + d] * out[row * hd + d];
  // p and ds of a visible (query i, key j) pair.
  auto grads = [&](int64_t h, int64_t i, int64_t j, double& p, double& ds) {
    p = kmath::attention_prob(x.score(q, h, i, k, j), lse[h * T + i]);
    double dp = 0.0;
    for (int64_t d = 0; d < hd; ++d)
      dp += x.at(dout, h, i)[d] * x.at(v, h, j)[d];
    ds = kmath::attention_dscore(p, dp, delta[h * T + i]);
  };
  const int64_t query_tiles = (T + Br - 1) / Br;
  for (int64_t h = 0; h < x.BH; ++h) {
    for (int64_t c0 = 0; c0 < T; c0 += Bc) {
      Vec dk_acc(static_cast<size_t>(Bc * hd), 0.0), dv_acc(static_cast<size_t>(Bc * hd), 0.0);
      // Query tiles before the first one must see nothing of this key tile.
      for (int64_t i = 0; i < kmath::causal_first_query_tile(c0, Br) * Br; ++i)
        for (int64_t j = c0; j < std::min(T, c0 + Bc); ++j)
          EXPECT_FALSE(x.visible(h, i, j)) << "query " << i << " key " << j;
      for (int64_t tile = kmath::causal_first_query_tile(c0, Br); tile < query_tiles; ++tile) {
        if (x.begin(h, tile * Br) >= c0 + Bc) {
          // This and every later query tile see nothing of the key tile.
          for (int64_t i = tile * Br; i < T; ++i)
            for (int64_t j = c0; j < std::min(T, c0 + Bc); ++j)
              EXPECT_FALSE(x.visible(h, i, j)) << "query " << i << " key " << j;
          break;
        }
        for (int64_t c = 0; c < Bc; ++c) {
          for (int64_t r = 0; r < Br; ++r) {
            const int64_t i = tile * Br + r, j = c0 + c;
            if (!x.visible(h, i, j)) continue;
            double p, ds;
            grads(h, i, j, p, ds);
            for (int64_t d = 0; d < hd; ++d) {
              dv_acc[c * hd + d] += p * x.at(dout, h, i)[d];
              dk_acc[c * hd + d] += ds * x.at(q, h, i)[d];
            }
          }
        }
      }
      for (int64_t c = 0; c < Bc && c0 + c < T; ++c) {
        for (int64_t d = 0; d < hd; ++d) {
          dk[(h * T + c0 + c) * hd + d] = x.scale * dk_acc[c * hd + d];
          dv[(h * T + c0 + c) * hd + d] = dv_acc[c * hd + d];
        }
      }
    }
    for (int64_t r0 = 0; r0 < T; r0 += Br) {
      Vec dq_acc(static_cast<size_t>(Br * hd), 0.0);
      const int64_t key_start = kmath::masked_key_start(x.begin(h, r0), Bc);
      for (int64_t c0 = key_start; c0 < kmath::causal_key_end(r0, Br, T); c0 += Bc) {
        for (int64_t r = 0; r < Br; ++r) {
          for (int64_t c = 0; c < Bc; ++c) {
            if (!x.visible(h, r0 + r, c0 + c)) continue;
            double p, ds;
            grads(h, r0 + r, c0 + c, p, ds);
            for (int64_t d = 0; d < hd; ++d)
              dq_acc[r * hd + d] += ds * x.at(k, h, c0 + c)[d];
          }
        }
      }
      for (int64_t r = 0; r < Br && r0 + r < T; ++r)
        for (int64_t d = 0; d < hd; ++d)
          dq[(h * T + r0 + r) * hd + d] = x.scale * dq_acc[r * hd + d];
    }
  }
}

class AttentionTiles : public ::testing::TestWithParam<Case> {};

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTiles,
    ::testing::Values(Case{2, 1, 4, 4, 4},     // T = 1
                      Case{2, 7, 5, 3, 2},     // tiles that do not divide T, Br != Bc
                      Case{1, 9, 4, 2, 5},     // key tiles longer than query tiles
                      Case{2, 5, 3, 8, 8},     // one tile longer than T
                      Case{1, 16, 4, 4, 4},    // tiles that divide T: the diagonal exactly
                      Case{1, 70, 8, 64, 64},  // the kernels' tiles, a partial last tile
                      Case{1, 33, 6, 16, 7}),
    [](const auto& info) {
      const Case& c = info.param;
      std::string name = std::string("T").append(std::to_string(c.T));
      name.append("_Br").append(std::to_string(c.Br));
      name.append("_Bc").append(std::to_string(c.Bc));
      return name;
    });

TEST_P(AttentionTiles, MatchPlainAttentionInFloat64) {
  const Case c = GetParam();
  const int64_t n = c.BH * c.T * c.hd;
  const Heads x{c.BH, c.T, c.hd, 1.0 / std::sqrt(static_cast<double>(c.hd))};
  // Scores up to ~10: the running maximum moves between tiles, so the rescaling is exercised.
  Vec q = random_vec(n, 1, 2.0), k = random_vec(n, 2, 2.0), v = random_vec(n, 3);
  Vec dout = random_vec(n, 4);
  Vec out(n), lse(c.BH * c.T), tout(n), tlse(c.BH * c.T);
  core::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), c.BH, c.T,
                               c.hd, x.scale);
  tiled_forward(tout, tlse, q, k, v, x, c.Br, c.Bc);
  expect_within("tiled out, norm-relative", norm_rel_diff(tout, out), 1e-13);
  expect_within("tiled lse, norm-relative", norm_rel_diff(tlse, lse), 1e-13);

  // Over noise: both write every element.
  Vec dq = random_vec(n, 5), dk = random_vec(n, 6), dv = random_vec(n, 7), tdq = random_vec(n, 8),
      tdk = random_vec(n, 9), tdv = random_vec(n, 10);
  core::cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                lse.data(), q.data(), k.data(), v.data(), c.BH, c.T, c.hd, x.scale);
  tiled_backward(tdq, tdk, tdv, dout, tout, tlse, q, k, v, x, c.Br, c.Bc);
  if (c.T == 1) {
    // One key: the softmax is constant, so dq and dk are zero. Each side holds only the rounding
    // of dP - delta (the BLAS kernel's dot against attention_delta's, ~1e-16, whichever kernel
    // OpenBLAS picks), so neither is a scale for the other: both must be zero up to rounding.
    const Vec zero(n, 0.0);
    for (const auto& [what, g] : {std::pair<const char*, const Vec*>{"tiled dq", &tdq},
                                  {"tiled dk", &tdk},
                                  {"plain dq", &dq},
                                  {"plain dk", &dk}})
      expect_within(std::string(what) + " at T = 1, max-abs", core::compare(*g, zero).max_abs(),
                    1e-14);
  } else {
    expect_within("tiled dq, norm-relative", norm_rel_diff(tdq, dq), 1e-13);
    expect_within("tiled dk, norm-relative", norm_rel_diff(tdk, dk), 1e-13);
  }
  expect_within("tiled dv, norm-relative", norm_rel_diff(tdv, dv), 1e-13);
}

// Documents and sliding windows: the tiled steps with the mask against the CPU's masked
// attention, for the kernels' tiles and for tiles that do not divide T or the window. Head 0 has
// documents from 0, 9, 10 (a one-token document), 40 (longer than the window), head 1 the window
// alone.
TEST(AttentionTilesMasked, MatchTheCpuMaskedAttentionInFloat64) {
  for (auto [T, window, Br, Bc] :
       {std::array<int64_t, 4>{70, 23, 64, 64}, {70, 23, 16, 16}, {61, 7, 5, 3}, {33, 40, 4, 8}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " window " + std::to_string(window) + " Br " +
                 std::to_string(Br) + " Bc " + std::to_string(Bc));
    const int64_t BH = 2, hd = 4, n = BH * T * hd;
    Heads x{BH, T, hd, 0.4};
    x.begins.resize(static_cast<size_t>(BH * T));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t doc = t >= 40 ? 40 : t >= 10 ? 10 : t >= 9 ? 9 : 0;
      x.begins[t] = static_cast<int32_t>(std::max(doc, t - window + 1));
      x.begins[T + t] = static_cast<int32_t>(std::max<int64_t>(0, t - window + 1));
    }
    const core::AttentionMask mask{x.begins.data(), 1};
    Vec q = random_vec(n, 11, 2.0), k = random_vec(n, 12, 2.0), v = random_vec(n, 13);
    Vec dout = random_vec(n, 14);
    Vec out(n), lse(BH * T), tout(n), tlse(BH * T);
    core::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, hd,
                                 x.scale, core::cpu::HeadParallel::kAuto, mask);
    tiled_forward(tout, tlse, q, k, v, x, Br, Bc);
    expect_within("masked tiled out, norm-relative", norm_rel_diff(tout, out), 1e-13);
    expect_within("masked tiled lse, norm-relative", norm_rel_diff(tlse, lse), 1e-13);
    Vec dq(n, 0.0), dk(n, 0.0), dv(n, 0.0), tdq(n, 0.0), tdk(n, 0.0), tdv(n, 0.0);
    core::cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                  lse.data(), q.data(), k.data(), v.data(), BH, T, hd, x.scale,
                                  core::cpu::HeadParallel::kAuto, mask);
    tiled_backward(tdq, tdk, tdv, dout, tout, tlse, q, k, v, x, Br, Bc);
    expect_within("masked tiled dq, norm-relative", norm_rel_diff(tdq, dq), 1e-13);
    expect_within("masked tiled dk, norm-relative", norm_rel_diff(tdk, dk), 1e-13);
    expect_within("masked tiled dv, norm-relative", norm_rel_diff(tdv, dv), 1e-13);
  }
}

// tile_needs_mask is false only where every element is visible (so skipping the per-element
// test is exact), and true on every tile that crosses the diagonal or T.
TEST(AttentionTilesMask, FalseOnlyOnFullyVisibleTiles) {
  for (int64_t T = 1; T <= 12; ++T) {
    for (int64_t Br = 1; Br <= 5; ++Br) {
      for (int64_t Bc = 1; Bc <= 5; ++Bc) {
        for (int64_t r0 = 0; r0 < T; r0 += Br) {
          for (int64_t c0 = 0; c0 < kmath::causal_key_end(r0, Br, T); c0 += Bc) {
            bool all = true;
            for (int64_t i = r0; i < r0 + Br; ++i)
              for (int64_t j = c0; j < c0 + Bc; ++j)
                all = all && kmath::causal_visible(i, j, T);
            EXPECT_EQ(kmath::tile_needs_mask(r0, Br, c0, Bc, T), !all)
                << "T " << T << " Br " << Br << " Bc " << Bc << " tile (" << r0 << ", " << c0
                << ")";
          }
        }
      }
    }
  }
}

// The online form equals the log-sum-exp of everything seen, whatever the tiling, with tiles
// that show nothing (-inf maximum) before, between and after the visible ones.
TEST(AttentionTilesFlashRow, EqualsLogSumExpWithEmptyTiles) {
  const Vec scores = {0.5, -3.0, 7.25, 7.0, -40.0, 2.0, 6.5};
  double mx = -INFINITY;
  for (double s : scores)
    mx = std::max(mx, s);
  double sum = 0.0;
  for (double s : scores)
    sum += std::exp(s - mx);
  const double want = mx + std::log(sum);
  for (size_t tile = 1; tile <= scores.size(); ++tile) {
    kmath::FlashRow<double> row;
    EXPECT_EQ(row.advance(-INFINITY), 1.0);  // an empty tile first: nothing to rescale
    double acc = 0.0;                        // sum of weights, rescaled like an accumulator
    for (size_t t0 = 0; t0 < scores.size(); t0 += tile) {
      double tile_max = -INFINITY;
      for (size_t i = t0; i < std::min(scores.size(), t0 + tile); ++i)
        tile_max = std::max(tile_max, scores[i]);
      acc *= row.advance(tile_max);
      for (size_t i = t0; i < std::min(scores.size(), t0 + tile); ++i) {
        row.sum += row.weight(scores[i]);
        acc += row.weight(scores[i]);
      }
      EXPECT_EQ(row.advance(-INFINITY), 1.0);  // an empty tile between: the state stays
    }
    EXPECT_NEAR(row.log_sum_exp(), want, 1e-14) << "tile " << tile;
    EXPECT_NEAR(acc, row.sum, 1e-14) << "tile " << tile;
  }
}

}  // namespace
