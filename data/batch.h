// One rank's slice of a batch: `rows` sequences of `seq_len` tokens, row-major int32.
#pragma once

#include <cstdint>
#include <vector>

namespace data {

struct Batch {
  int64_t rows = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> inputs;     // [rows, seq_len]: x
  std::vector<int32_t> targets;    // [rows, seq_len]: y, the token after each input
  std::vector<int64_t> sequences;  // [rows]: the ShardSet sequence number of each row

  void resize(int64_t r, int64_t t) {
    rows = r;
    seq_len = t;
    inputs.resize(static_cast<size_t>(r * t));
    targets.resize(static_cast<size_t>(r * t));
    sequences.resize(static_cast<size_t>(r));
  }
};

}  // namespace data
