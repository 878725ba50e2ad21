// Streams tokens into numbered shards PREFIX_000000.bin, PREFIX_000001.bin, ... of a fixed size
// (the last one shorter), each written atomically by write_shard. It writes only its own shards
// and deletes nothing: which files under a prefix may be replaced is ShardOutputs' business.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace data {

class ShardWriter {
 public:
  ShardWriter(std::string prefix, int64_t shard_tokens);

  // Appends ids (each must be in [0, 65536)); full shards are written as they fill.
  void append(std::span<const int32_t> ids);
  // Writes the last partial shard; returns the number of shards. Appending after finish is an
  // error.
  int finish();

  int64_t tokens() const { return tokens_; }
  static std::string shard_path(const std::string& prefix, int index);

 private:
  void write_full_shards(bool last);

  std::string prefix_;
  int64_t shard_tokens_;
  std::vector<uint16_t> pending_;
  int64_t tokens_ = 0;
  int shards_ = 0;
  bool finished_ = false;
};

}  // namespace data
