#include "data/prefix_tokens.h"

#include <string>
#include <string_view>
#include <unordered_map>

namespace data {

std::vector<int32_t> prefix_tokens(const Gpt2Tokenizer& tokenizer, int64_t vocab_size) {
  const int32_t n = tokenizer.vocab_size();
  std::unordered_map<std::string_view, int32_t> id_of;
  id_of.reserve(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id)
    if (id != Gpt2Tokenizer::kEndOfText) id_of.emplace(tokenizer.token_bytes(id), id);
  std::vector<int32_t> out(static_cast<size_t>(vocab_size), -1);
  for (int32_t id = 0; id < n && id < vocab_size; ++id) {
    if (id == Gpt2Tokenizer::kEndOfText) continue;
    const std::string_view bytes = tokenizer.token_bytes(id);
    // The longest proper prefix first; every single byte is a token, so any token of two or more
    // bytes finds one.
    for (size_t len = bytes.size(); len-- > 1;) {
      const auto hit = id_of.find(bytes.substr(0, len));
      if (hit != id_of.end()) {
        if (hit->second < vocab_size) out[static_cast<size_t>(id)] = hit->second;
        break;
      }
    }
  }
  return out;
}

}  // namespace data
