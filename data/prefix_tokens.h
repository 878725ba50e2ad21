// Record #89's prefix targets (train_gpt.py's build_prefix_table): each token's prefix token, the
// token whose bytes are the longest proper prefix of its bytes, built from the GPT-2 vocabulary
// alone (never from a corpus). -1 where there is none: the 256 one-byte tokens, <|endoftext|>
// (a special token, outside the BPE vocabulary), the ids at or past the tokenizer's vocabulary
// (a padded model vocabulary), and a token whose longest prefix lies at or past vocab_size (a
// model vocabulary smaller than the tokenizer's: that prefix is no target).
#pragma once

#include <cstdint>
#include <vector>

#include "data/gpt2_tokenizer.h"

namespace data {

// [vocab_size] prefix token of each id (-1: none).
std::vector<int32_t> prefix_tokens(const Gpt2Tokenizer& tokenizer, int64_t vocab_size);

}  // namespace data
