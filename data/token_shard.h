// The token-shard file format of llm.c and modded-nanogpt, so FineWeb shards work unchanged:
//   header: 256 little-endian int32 = {magic 20240520, version 1, token count N, 0...}
//   body:   N little-endian uint16 token ids
// A valid file is exactly 1024 + 2N bytes long.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;
// uint16 ids: the largest vocabulary a shard can hold.
inline constexpr int64_t kShardMaxVocab = 65536;

struct ShardHeader {
  std::string path;
  int64_t num_tokens = 0;
};

// Reads and checks the header and the file size; throws core::Error naming the file and the
// problem (missing file, short header, bad magic, wrong version, negative count, truncated body,
// trailing bytes).
ShardHeader read_shard_header(const std::string& path);

// Checks ids in `tokens` (those of `path` starting at token `first`) are below `vocab_size`;
// throws naming the file, the token position and the id otherwise.
void check_token_ids(const std::string& path, std::span<const uint16_t> tokens, int64_t first,
                     int64_t vocab_size);

// A 64-bit hash of token ids, their order included: what a resume compares to find a shard
// whose tokens changed while its count did not. Not cryptographic (it catches edits and
// re-tokenised data, not forgery); memory-bound, about as fast as reading the tokens.
uint64_t token_hash(std::span<const uint16_t> tokens);

// token_hash of `total` tokens given in pieces (a shard read in chunks): add() them in order,
// then value() equals token_hash of their concatenation.
class TokenHash {
 public:
  explicit TokenHash(size_t total);
  void add(std::span<const uint16_t> tokens);
  uint64_t value() const;

 private:
  void block(const unsigned char* bytes);  // 16 tokens, one 64-bit word per lane

  size_t total_;
  size_t blocked_;  // tokens that go through the four lanes: whole 16-token blocks
  size_t seen_ = 0;
  uint64_t lanes_[4] = {1, 2, 3, 4};
  uint64_t tail_;
  uint16_t pending_[16] = {};
  size_t pending_count_ = 0;
};

// Reads a whole shard (header, size and every id < vocab_size checked).
std::vector<uint16_t> read_shard(const std::string& path, int64_t vocab_size = kShardMaxVocab);

// Writes a shard atomically (core::AtomicFile): to a temporary name beside it, flushed, then
// renamed over `path` (never a link, device or folder there), so a reader never sees a
// half-written shard. Ids must fit uint16 (they do by type); the count must
// fit the int32 header field.
void write_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace data
