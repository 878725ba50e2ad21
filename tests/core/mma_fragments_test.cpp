// core/mma_fragments.h on the host: each map covers its fragment once, the paired order turns a
// score fragment into an A operand in place, and the tensor-core attention kernels' two products
// (S = X Y^T, then O = S Z with S's fragments as A operands) run on an emulated
// mma.sync.m16n8k8 (D = A B + C over the matrices the 32 lanes' registers hold, by the maps)
// equal float64. The kernels' loads (core/cuda/attention_mma.cu: a_rows, b_transposed,
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

// ---- m16n8k16 with bf16 operands (the bf16 kernels: a16_rows, b16_transposed, b16_rows,
// a16_from_c) --------------------------------------------------------------------------------

using A16Regs = std::vector<std::array<std::array<double, 2>, 4>>;  // [lane][register][half]
using B16Regs = std::vector<std::array<std::array<double, 2>, 2>>;

// d += a b for one warp's 16 x 8 x 16 product, through the bf16 maps.
void emulated_mma16(CRegs& d, const A16Regs& a, const B16Regs& b) {
  double A[16][16] = {}, B[16][8] = {};
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 4; ++i) {
        const Coord c = a16_coord(g, t, i, h);
        A[c.row][c.col] = a[lane][i][h];
      }
      for (int i = 0; i < 2; ++i) {
        const Coord c = b16_coord(g, t, i, h);
        B[c.row][c.col] = b[lane][i][h];
      }
    }
  }
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const Coord c = c_coord(g, t, e);
      for (int k = 0; k < 16; ++k)
        d[lane][e] += A[c.row][k] * B[k][c.col];
    }
  }
}

TEST(MmaFragments, EachBf16MapCoversItsFragmentOnce) {
  int a[16][16] = {}, b[16][8] = {};
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 4; ++i)
        ++a[a16_coord(g, t, i, h).row][a16_coord(g, t, i, h).col];
      for (int i = 0; i < 2; ++i)
        ++b[b16_coord(g, t, i, h).row][b16_coord(g, t, i, h).col];
    }
  }
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      EXPECT_EQ(a[r][col], 1) << "A " << r << "," << col;
      if (col < 8) {
        EXPECT_EQ(b[r][col], 1) << "B " << r << "," << col;
      }
    }
  // A half pair is two neighbouring columns of a row (one 8-byte load from a row-major tile).
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a16_coord(3, 2, i, 1).row, a16_coord(3, 2, i, 0).row);
    EXPECT_EQ(a16_coord(3, 2, i, 1).col, a16_coord(3, 2, i, 0).col + 1);
    EXPECT_EQ(a16_coord(3, 2, i, 0).col % 2, 0);
  }
}

TEST(MmaFragments, TwoScoreFragmentsAreABf16OperandInPlace) {
  // A's register i half h is the C register c_register_of_a16(i, h) of fragment i / 2 of the
  // same lane: the same row, and column 8 (i / 2) + that register's column.
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) {
        const Coord a = a16_coord(g, t, i, h), c = c_coord(g, t, c_register_of_a16(i, h));
        EXPECT_EQ(c.row, a.row) << "lane " << lane << " register " << i << " half " << h;
        EXPECT_EQ(8 * (i / 2) + c.col, a.col) << "lane " << lane << " register " << i;
      }
  }
}

TEST(MmaFragments, Bf16AttentionProductsEqualFloat64) {
  // As AttentionProductsEqualFloat64 with the bf16 kernels' loads: head dim 32 (two k steps of
  // 16), the 16 x 64 scores times Z in four steps of two fragments. The inputs are bf16 values
  // (so the products are exact in float64, and a swapped half shows).
  constexpr int HD = 32, ZD = 24, kRows = 64;
  auto bf16_values = [](std::vector<float> v) {
    for (float& x : v)
      x = kmath::float_from_bf16(kmath::bf16_from_float(x));
    return v;
  };
  const std::vector<float> x = bf16_values(random_vector(16 * HD, 4)),
                           y = bf16_values(random_vector(kRows * HD, 5)),
                           z = bf16_values(random_vector(kRows * ZD, 6));
  std::vector<CRegs> s(8, CRegs(kLanes, {0, 0, 0, 0}));
  for (int k0 = 0; k0 < HD; k0 += 16) {
    A16Regs a(kLanes);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < 4; ++i)
        for (int h = 0; h < 2; ++h) {
          const Coord c = a16_coord(lane / 4, lane % 4, i, h);
          a[lane][i][h] = x[c.row * HD + k0 + c.col];  // a16_rows
        }
    for (int j = 0; j < 8; ++j) {
      B16Regs b(kLanes);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int i = 0; i < 2; ++i)
          for (int h = 0; h < 2; ++h) {
            const Coord c = b16_coord(lane / 4, lane % 4, i, h);
            b[lane][i][h] = y[(8 * j + c.col) * HD + k0 + c.row];  // b16_transposed
          }
      emulated_mma16(s[j], a, b);
    }
  }
  // The scores as the kernel holds them (f32 accumulators), rounded to bf16 as a16_from_c does.
  auto rounded = [](double v) {
    return static_cast<double>(
        kmath::float_from_bf16(kmath::bf16_from_float(static_cast<float>(v))));
  };
  std::vector<CRegs> o(ZD / 8, CRegs(kLanes, {0, 0, 0, 0}));
  for (int j = 0; j < 8; j += 2) {
    A16Regs a(kLanes);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int i = 0; i < 4; ++i)
        for (int h = 0; h < 2; ++h)
          a[lane][i][h] = rounded(s[j + i / 2][lane][c_register_of_a16(i, h)]);  // a16_from_c
    for (int dt = 0; dt < ZD / 8; ++dt) {
      B16Regs b(kLanes);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int i = 0; i < 2; ++i)
          for (int h = 0; h < 2; ++h) {
            const Coord c = b16_coord(lane / 4, lane % 4, i, h);
            b[lane][i][h] = z[(8 * j + c.row) * ZD + 8 * dt + c.col];  // b16_rows
          }
      emulated_mma16(o[dt], a, b);
    }
  }
  for (int lane = 0; lane < kLanes; ++lane)
    for (int e = 0; e < 4; ++e) {
      const Coord c = c_coord(lane / 4, lane % 4, e);
      for (int j = 0; j < 8; ++j) {  // the scores, exact
        double want = 0.0;
        for (int d = 0; d < HD; ++d)
          want += double(x[c.row * HD + d]) * y[(8 * j + c.col) * HD + d];
        EXPECT_NEAR(s[j][lane][e], want, 1e-12 * (1.0 + std::abs(want)));
      }
      for (int dt = 0; dt < ZD / 8; ++dt) {  // the product with Z of the rounded scores
        double want = 0.0;
        for (int key = 0; key < kRows; ++key) {
          double score = 0.0;
          for (int d = 0; d < HD; ++d)
            score += double(x[c.row * HD + d]) * y[key * HD + d];
          want += rounded(score) * z[key * ZD + 8 * dt + c.col];
        }
        EXPECT_NEAR(o[dt][lane][e], want, 1e-12 * (1.0 + std::abs(want)))
            << "row " << c.row << " column " << 8 * dt + c.col;
      }
    }
}

}  // namespace
}  // namespace core::mma
