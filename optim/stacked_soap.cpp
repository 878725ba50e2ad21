#include "optim/stacked_soap.h"

#include <algorithm>

namespace optim {

std::pair<int64_t, int64_t> stacked_shape(const core::Shape& shape) {
  const int64_t b = shape[0], m = shape[1], n = shape[2];
  return stack_permutes(shape) ? std::pair{m, b * n} : std::pair{b * m, n};
}

bool stack_permutes(const core::Shape& shape) {
  return shape[2] <= shape[1];
}

void stack(const float* x, float* s, const core::Shape& shape) {
  const int64_t b = shape[0], m = shape[1], n = shape[2];
  for (int64_t j = 0; j < b; ++j)
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(x + (j * m + i) * n, n, s + i * b * n + j * n);
}

void unstack(const float* s, float* x, const core::Shape& shape) {
  const int64_t b = shape[0], m = shape[1], n = shape[2];
  for (int64_t j = 0; j < b; ++j)
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(s + i * b * n + j * n, n, x + (j * m + i) * n);
}

}  // namespace optim
