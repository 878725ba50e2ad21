// The loops the CPU kernels share, and the optimizers' CPU ops with them: the thread threshold
// of an elementwise loop, the elementwise loop itself, a vectorised row max, and deterministic
// column sums (rows split into fixed blocks whose sums are added in order, so results do not
// depend on the thread count).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace core::cpu {

// Below this many elements an elementwise loop runs on one thread (a parallel region costs more).
inline constexpr int64_t kParallelMin = 1 << 15;
// Rows per block in the deterministic column reductions.
inline constexpr int64_t kRowBlock = 64;

// max of x[0, n) as a vectorised reduction (std::max in the loop body blocks vectorisation).
template <typename T>
T row_max(const T* x, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i)
    mx = mx > x[i] ? mx : x[i];
  return mx;
}

// dst[c] += sum over rows n of the K partial contributions row_fn(n, partial) writes into
// partial[k * C + c]; K output vectors are handled together.
template <typename T, typename RowFn>
void blocked_column_sums(T* const* dst, int K, int64_t N, int64_t C, RowFn row_fn) {
  int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
  std::vector<T> partial(static_cast<size_t>(blocks * K * C), T(0));
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    T* p = partial.data() + blk * K * C;
    for (int64_t n = blk * kRowBlock; n < std::min(N, (blk + 1) * kRowBlock); ++n)
      row_fn(n, p);
  }
  for (int k = 0; k < K; ++k) {
    if (!dst[k]) continue;
    T* d = dst[k];
#pragma omp parallel for schedule(static) if (C * blocks > kParallelMin)
    for (int64_t c = 0; c < C; ++c) {
      T s = T(0);
      for (int64_t blk = 0; blk < blocks; ++blk)
        s += partial[(blk * K + k) * C + c];
      d[c] += s;
    }
  }
}

// fn(i) for i < n. Each thread calls its own copy of fn: GCC reads the pointers a lambda captured
// through the shared closure on every element otherwise, and vectorises the loop with gathers
// and scatters (GELU forward and backward 4-8x slower, measured).
template <typename T, typename Fn>
void elementwise(int64_t n, Fn fn) {
#pragma omp parallel if (n > kParallelMin)
  {
    const Fn local = fn;
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; ++i)
      local(i);
  }
}

}  // namespace core::cpu
