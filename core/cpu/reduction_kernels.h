// The CPU reductions: the sum of squares in float64, in fixed blocks added in order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/parallel_loops.h"

namespace core::cpu {

// Sum of squares in float64 over fixed blocks added in order.
template <typename T>
double sum_squares(const T* x, int64_t n) {
  constexpr int64_t kBlock = 1 << 14;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double s = 0.0;
    for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) {
      s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    }
    partial[blk] = s;
  }
  double total = 0.0;
  for (double p : partial)
    total += p;
  return total;
}

}  // namespace core::cpu
