#include "data/shard_writer.h"

#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/check.h"
#include "data/token_shard.h"

namespace data {

ShardWriter::ShardWriter(std::string prefix, int64_t shard_tokens)
    : prefix_(std::move(prefix)), shard_tokens_(shard_tokens) {
  ENGINE_CHECK(
      shard_tokens > 0 && shard_tokens <= std::numeric_limits<int32_t>::max(),
      "shard writer: tokens per shard must be in [1, 2^31), got " + std::to_string(shard_tokens));
  const auto parent = std::filesystem::path(prefix_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
}

std::string ShardWriter::shard_path(const std::string& prefix, int index) {
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "_%06d.bin", index);
  return prefix + suffix;
}

void ShardWriter::append(std::span<const int32_t> ids) {
  ENGINE_CHECK(!finished_, "shard writer '" + prefix_ + "': append after finish");
  for (const int32_t id : ids) {
    ENGINE_CHECK(id >= 0 && id < kShardMaxVocab, "shard writer '" + prefix_ + "': token id " +
                                                     std::to_string(id) + " does not fit uint16");
    pending_.push_back(static_cast<uint16_t>(id));
  }
  tokens_ += static_cast<int64_t>(ids.size());
  write_full_shards(false);
}

void ShardWriter::write_full_shards(bool last) {
  size_t done = 0;
  while (pending_.size() - done >= static_cast<size_t>(shard_tokens_) ||
         (last && done < pending_.size())) {
    const size_t n = std::min(pending_.size() - done, static_cast<size_t>(shard_tokens_));
    write_shard(shard_path(prefix_, shards_++), {pending_.data() + done, n});
    done += n;
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
}

int ShardWriter::finish() {
  ENGINE_CHECK(!finished_, "shard writer '" + prefix_ + "': finish called twice");
  write_full_shards(true);
  finished_ = true;
  return shards_;
}

}  // namespace data
