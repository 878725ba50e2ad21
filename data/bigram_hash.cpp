#include "data/bigram_hash.h"

#include <string>

#include "core/check.h"

namespace data {

namespace {

// int32 multiplication as torch does it on int32 tensors: two's-complement wrap-around
// (computed in uint32, where overflow is defined).
int32_t mul_wrap(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}

// torch.remainder on integers: the result has the divisor's sign (m > 0: in [0, m)).
int32_t floor_mod(int32_t a, int32_t m) {
  const int32_t r = a % m;
  return r < 0 ? r + m : r;
}

}  // namespace

void bigram_hash(std::span<const int32_t> tokens, int64_t table_rows, std::span<int32_t> out) {
  ENGINE_CHECK(table_rows >= 2 && table_rows - 1 <= INT32_MAX,
               "bigram hash: table_rows must be in [2, 2^31], got " + std::to_string(table_rows));
  ENGINE_CHECK(out.size() == tokens.size(), "bigram hash: output size " +
                                                std::to_string(out.size()) + " != row size " +
                                                std::to_string(tokens.size()));
  if (tokens.empty()) return;
  const auto m = static_cast<int32_t>(table_rows - 1);
  int32_t previous = m;  // the record's x[0] := m before the products
  out[0] = m;
  for (size_t t = 1; t < tokens.size(); ++t) {
    const int32_t mixed =
        mul_wrap(kBigramMulCurrent, tokens[t]) ^ mul_wrap(kBigramMulPrevious, previous);
    out[t] = floor_mod(mixed, m);
    previous = tokens[t];
  }
}

}  // namespace data
