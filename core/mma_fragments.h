// Where the registers of PTX's mma.sync.m16n8k8 (.tf32, row.col, f32 accumulate) and
// mma.sync.m16n8k16 (.bf16) live in their matrices, per lane (g = lane / 4, t = lane % 4), as the
// tensor-core attention kernels (core/cuda/attention_mma.cu) read and write them;
// tests/core/mma_fragments_test.cpp runs the kernels' products on the host with these maps
// against float64.
//
//   A (16 x 8):  a[i] = A[g + 8 (i % 2)][t + 4 (i / 2)]
//   B (8 x 8):   b[i] = B[t + 4 i][g]                      (rows are k)
//   C (16 x 8):  c[e] = C[g + 8 (e / 2)][2t + e % 2]
//
// Paired order: a score fragment C becomes the A operand of the next product without moving
// between lanes when A's k runs over C's 8 columns as 0 2 4 6 1 3 5 7 (k = t is column 2t,
// k = t + 4 column 2t + 1): then a[i] = c[c_register_of_a(i)], and that product's B takes its
// rows in the same order (row paired_row(k) for k).
#pragma once

#include "core/kernel_math.h"  // ENGINE_HD

namespace core::mma {

struct Coord {
  int row;
  int col;
};

ENGINE_HD constexpr Coord a_coord(int g, int t, int i) {
  return {g + 8 * (i % 2), t + 4 * (i / 2)};
}
ENGINE_HD constexpr Coord b_coord(int g, int t, int i) {
  return {t + 4 * i, g};
}
ENGINE_HD constexpr Coord c_coord(int g, int t, int e) {
  return {g + 8 * (e / 2), 2 * t + e % 2};
}

// The C column a paired A's k reads, and the C register each A register is (0 2 1 3).
ENGINE_HD constexpr int paired_row(int k) {
  return k < 4 ? 2 * k : 2 * (k - 4) + 1;
}
ENGINE_HD constexpr int c_register_of_a(int i) {
  return i == 1 ? 2 : i == 2 ? 1 : i;
}

// m16n8k16 with bf16 operands: each register holds two, half h = 0 the lower 16 bits (the lower
// index); C is as above.
//
//   A (16 x 16): a[i] half h = A[g + 8 (i % 2)][2t + h + 8 (i / 2)]
//   B (16 x 8):  b[i] half h = B[2t + h + 8 i][g]                    (rows are k)
//
// Two score fragments side by side (C over columns 0-7, then 8-15) are the A operand over those
// 16 columns in place and in natural order: a[i] half h = c[i / 2][c_register_of_a16(i, h)].
ENGINE_HD constexpr Coord a16_coord(int g, int t, int i, int h) {
  return {g + 8 * (i % 2), 2 * t + h + 8 * (i / 2)};
}
ENGINE_HD constexpr Coord b16_coord(int g, int t, int i, int h) {
  return {2 * t + h + 8 * i, g};
}
ENGINE_HD constexpr int c_register_of_a16(int i, int h) {
  return 2 * (i % 2) + h;
}

}  // namespace core::mma
