// core/mma_fragments.h on the host: each map covers its fragment once, the paired order turns a
// score fragment into an A operand in place, and the tensor-core attention kernels' two products
// (S = X Y^T, then O = S Z with S's fragments as A operands) run on an emulated
// mma.sync.m16n8k8 (D = A B + C over the matrices the 32 lanes' registers hold, by the maps)
// equal float64. The kernels' loads (core/cuda/attention_tf32.cu: a_rows, b_transposed,
// b_rows_paired, a_from_c) index their tiles exactly as below.
#include "core/mma_fragments.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "tests/backend_test_data.h"

namespace core::mma {
namespace {

using test_data::random_vector;

constexpr int kLanes = 32;
using ARegs = std::vector<std::array<double, 4>>;  // [lane][register]
using BRegs = std::vector<std::array<double, 2>>;
using CRegs = std::vector<std::array<double, 4>>;

// d += a b for one warp, through the maps.
void emulated_mma(CRegs& d, const ARegs& a, const BRegs& b) {
  double A[16][8] = {}, B[8][8] = {};
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const Coord c = a_coord(g, t, i);
      A[c.row][c.col] = a[lane][i];
    }
    for (int i = 0; i < 2; ++i) {
      const Coord c = b_coord(g, t, i);
      B[c.row][c.col] = b[lane][i];
    }
  }
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const Coord c = c_coord(g, t, e);
      for (int k = 0; k < 8; ++k)
        d[lane][e] += A[c.row][k] * B[k][c.col];
    }
  }
}

TEST(MmaFragments, EachMapCoversItsFragmentOnce) {
  int a[16][8] = {}, b[8][8] = {}, c[16][8] = {};
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      ++a[a_coord(g, t, i).row][a_coord(g, t, i).col];
      ++c[c_coord(g, t, i).row][c_coord(g, t, i).col];
    }
    for (int i = 0; i < 2; ++i)
      ++b[b_coord(g, t, i).row][b_coord(g, t, i).col];
  }
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 8; ++col) {
      EXPECT_EQ(a[r][col], 1) << "A " << r << "," << col;
      EXPECT_EQ(c[r][col], 1) << "C " << r << "," << col;
      if (r < 8) {
        EXPECT_EQ(b[r][col], 1) << "B " << r << "," << col;
      }
    }
}

TEST(MmaFragments, PairedOrderReadsAScoreFragmentInPlace) {
  bool seen[8] = {};
  for (int k = 0; k < 8; ++k)
    seen[paired_row(k)] = true;
  for (bool s : seen)
    EXPECT_TRUE(s) << "paired_row is no permutation of 0..7";
  // A's register i is the C register c_register_of_a(i) of the same lane: same row, column
  // paired_row.
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const Coord a = a_coord(g, t, i), c = c_coord(g, t, c_register_of_a(i));
      EXPECT_EQ(c.row, a.row) << "lane " << lane << " register " << i;
      EXPECT_EQ(c.col, paired_row(a.col)) << "lane " << lane << " register " << i;
    }
  }
}

TEST(MmaFragments, AttentionProductsEqualFloat64) {
  // A warp's 16 rows of X against a 64-row tile Y (head dim 16: two k steps), then the 16 x 64
  // scores times a 64-row tile Z (24 columns: three fragments), as the kernels loop.
  constexpr int HD = 16, ZD = 24, kRows = 64;
  const std::vector<float> x = random_vector(16 * HD, 1), y = random_vector(kRows * HD, 2),
                           z = random_vector(kRows * ZD, 3);
  std::vector<CRegs> s(8, CRegs(kLanes, {0, 0, 0, 0}));
  for (int k0 = 0; k0 < HD; k0 += 8) {
    ARegs a(kLanes);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < 4; ++i) {
        const Coord c = a_coord(lane / 4, lane % 4, i);
        a[lane][i] = x[c.row * HD + k0 + c.col];  // a_rows
      }
    for (int j = 0; j < 8; ++j) {
      BRegs b(kLanes);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int i = 0; i < 2; ++i) {
          const Coord c = b_coord(lane / 4, lane % 4, i);
          b[lane][i] = y[(8 * j + c.col) * HD + k0 + c.row];  // b_transposed
        }
      emulated_mma(s[j], a, b);
    }
  }
  std::vector<CRegs> o(ZD / 8, CRegs(kLanes, {0, 0, 0, 0}));
  for (int j = 0; j < 8; ++j) {
    ARegs a(kLanes);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < 4; ++i)
        a[lane][i] = s[j][lane][c_register_of_a(i)];  // a_from_c
    for (int dt = 0; dt < ZD / 8; ++dt) {
      BRegs b(kLanes);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int i = 0; i < 2; ++i) {
          const Coord c = b_coord(lane / 4, lane % 4, i);
          b[lane][i] = z[(8 * j + paired_row(c.row)) * ZD + 8 * dt + c.col];  // b_rows_paired
        }
      emulated_mma(o[dt], a, b);
    }
  }
  for (int lane = 0; lane < kLanes; ++lane)
    for (int e = 0; e < 4; ++e) {
      const Coord c = c_coord(lane / 4, lane % 4, e);
      for (int j = 0; j < 8; ++j) {  // the scores
        double want = 0.0;
        for (int d = 0; d < HD; ++d)
          want += double(x[c.row * HD + d]) * y[(8 * j + c.col) * HD + d];
        EXPECT_NEAR(s[j][lane][e], want, 1e-9 * (1.0 + std::abs(want)));
      }
      for (int dt = 0; dt < ZD / 8; ++dt) {  // the product with Z
        double want = 0.0;
        for (int key = 0; key < kRows; ++key) {
          double score = 0.0;
          for (int d = 0; d < HD; ++d)
            score += double(x[c.row * HD + d]) * y[key * HD + d];
          want += score * z[key * ZD + 8 * dt + c.col];
        }
        EXPECT_NEAR(o[dt][lane][e], want, 1e-9 * (1.0 + std::abs(want)))
            << "row " << c.row << " column " << 8 * dt + c.col;
      }
    }
}

}  // namespace
}  // namespace core::mma
