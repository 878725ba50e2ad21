#include "data/bigram_hash.h"

#include <string>

#include "core/check.h"
#include "core/kernel_math.h"

namespace data {

void bigram_hash(std::span<const int32_t> tokens, int64_t table_rows, std::span<int32_t> out) {
  ENGINE_CHECK(table_rows >= 2 && table_rows - 1 <= INT32_MAX,
               "bigram hash: table_rows must be in [2, 2^31], got " + std::to_string(table_rows));
  ENGINE_CHECK(out.size() == tokens.size(), "bigram hash: output size " +
                                                std::to_string(out.size()) + " != row size " +
                                                std::to_string(tokens.size()));
  const auto m = static_cast<int32_t>(table_rows - 1);
  for (size_t t = 0; t < tokens.size(); ++t)
    out[t] = core::kmath::bigram_hash_at(tokens.data(), static_cast<int64_t>(t), m);
}

}  // namespace data
