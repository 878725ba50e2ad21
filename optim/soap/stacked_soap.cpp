#include "optim/soap/stacked_soap.h"

namespace optim {

std::pair<int64_t, int64_t> stacked_shape(const core::Shape& shape) {
  const int64_t b = shape[0], m = shape[1], n = shape[2];
  return stack_permutes(shape) ? std::pair{m, b * n} : std::pair{b * m, n};
}

bool stack_permutes(const core::Shape& shape) {
  return shape[2] <= shape[1];
}

// Column block j of s [m, b n] is matrix j of x [b, m, n].
void stack(core::Backend& backend, const float* x, float* s, const core::Shape& shape) {
  const int64_t b = shape[0], m = shape[1], n = shape[2];
  for (int64_t j = 0; j < b; ++j)
    backend.copy_block_2d(s + j * n, b * n, x + j * m * n, n, m, n);
}

void unstack(core::Backend& backend, const float* s, float* x, const core::Shape& shape) {
  const int64_t b = shape[0], m = shape[1], n = shape[2];
  for (int64_t j = 0; j < b; ++j)
    backend.copy_block_2d(x + j * m * n, n, s + j * n, b * n, m, n);
}

}  // namespace optim
