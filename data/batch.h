// One rank's slice of a batch: `rows` sequences of `seq_len` tokens, row-major int32. The
// BOS-aligned document loader (data/document_loader.h) also fills the document boundaries and,
// when asked, the bigram hash; the other loaders leave them empty.
#pragma once

#include <cstdint>
#include <vector>

namespace data {

struct Batch {
  int64_t rows = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> inputs;      // [rows, seq_len]: x
  std::vector<int32_t> targets;     // [rows, seq_len]: y, the token after each input
  std::vector<int64_t> sequences;   // [rows]: the ShardSet sequence number of each row
  int64_t max_docs = 0;             // cu_seqlens entries per row (0: none given)
  std::vector<int32_t> cu_seqlens;  // [rows, max_docs]: 0, each document's end, then seq_len
  std::vector<int32_t> bigram;      // [rows, seq_len]: data::bigram_hash of each row's inputs

  void resize(int64_t r, int64_t t) {
    rows = r;
    seq_len = t;
    inputs.resize(static_cast<size_t>(r * t));
    targets.resize(static_cast<size_t>(r * t));
    sequences.resize(static_cast<size_t>(r));
    max_docs = 0;  // the document loader fills these after resize
    cu_seqlens.clear();
    bigram.clear();
  }
};

}  // namespace data
