// The record's bigram hash (modded-nanogpt train_gpt.py at f411b3d3, get_bigram_hash): the row
// of the bigram embedding table each input position reads, from the token and the one before.
//
// Over one rank's row x[0..T) of int32 token ids, with m = table_rows - 1 (the record: 50304 *
// 15 / 2 - 1 = 377279) and p = 36313, q = 27191:
//   h[0] = m                                   (the reserved last row)
//   h[1] = ((p x[1]) XOR (q m)) mod m          (the record overwrites x[0] with m first)
//   h[t] = ((p x[t]) XOR (q x[t-1])) mod m     (t >= 2)
// The products wrap as int32 (torch multiplies int32 tensors in int32: q m = 10,258,553,289
// wraps to 1,668,658,697), the XOR may be negative, and mod is torch's remainder, which takes
// the sign of the divisor: every h is in [0, m]. A document's BOS hashes with the last token of
// the document before it, as in the record. The element math is core::kmath::bigram_hash_at,
// which the model's device op (EmbeddingOps::bigram_hash) shares.
#pragma once

#include <cstdint>
#include <span>

namespace data {

// Writes h for the row `tokens` into `out` (same length); table_rows >= 2.
void bigram_hash(std::span<const int32_t> tokens, int64_t table_rows, std::span<int32_t> out);

}  // namespace data
