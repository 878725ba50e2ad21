// StackedSoap (registry `stacked_soap`, spec section 4): SOAP for 3-D parameters [b, m, n] such
// as MoE expert weights. The batch is merged into the smaller matrix edge and the 2-D stack is
// preconditioned with one pair of factors, so the larger edge's factor is shared by all b
// matrices:
//   n <= m: S = X.permute(1, 0, 2).reshape(m, b n)   column block j of S is matrix j (a copy)
//   n >  m: S = X.reshape(b m, n)                    row block j of S is matrix j (same memory)
// 2-D parameters are stepped exactly as by `soap` with the same settings. Defaults: the
// reference's fixed settings (KL-Shampoo factors, QR refresh after a first eigh).
#pragma once

#include <cstdint>
#include <utility>

#include "core/backend.h"
#include "core/tensor.h"

namespace optim {

// The stacked 2-D shape of a 3-D shape [b, m, n].
std::pair<int64_t, int64_t> stacked_shape(const core::Shape& shape);
// Whether stacking [b, m, n] needs the permuted copy (n <= m) rather than a plain reshape.
bool stack_permutes(const core::Shape& shape);
// x [b, m, n] -> s [m, b n] and back (the permuted branch), both in the backend's memory.
void stack(core::Backend& backend, const float* x, float* s, const core::Shape& shape);
void unstack(core::Backend& backend, const float* s, float* x, const core::Shape& shape);

}  // namespace optim
