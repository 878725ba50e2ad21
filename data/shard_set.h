// The shards matched by a glob, seen as a list of fixed-length training sequences.
//
// Sequence k of a shard is the window of T+1 tokens starting at token k*T of that shard: inputs
// are its first T tokens, targets its last T (the next-token shift). Windows never cross a shard
// boundary, so a shard of N tokens holds floor((N-1)/T) sequences; the few tokens left at its end
// are unused. With whole batches of b rows, a shard holds only the batches that fit as
// modded-nanogpt's distributed_data_generator reads them (batch k while (k+1) b T + 1 < N: a
// shard of 100M tokens gives 254 batches of 8 x 49152, 2032 rows) and the rest is skipped.
// Sequences are numbered shard by shard in sorted file-name order.
//
// Each shard stays open and a window is read with pread, not through a memory map: a shard
// truncated in place under a running job (`cp new old` does that) killed every rank with SIGBUS
// and a backtrace naming no file, and a validation shard changed in place was read as zeros, a
// silently wrong loss. After each read the file's size and modification time are compared with
// those at load: a short read or any change ends the run with one line naming the shard. A shard
// replaced by a rename (mv new old) is no change to the open file: the run goes on reading what
// it loaded. Two system calls per sequence, about a microsecond; an open file per shard.
#pragma once

#include <sys/types.h>

#include <ctime>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/token_shard.h"

namespace data {

class ShardSet {
 public:
  // Every matched file's header, size and token ids (< vocab_size) are checked here, once; a bad
  // one throws naming the file (and the position and id of the first bad token). The ids are read
  // in chunks, so a shard's size in memory is no limit.
  // whole_batch_rows > 0: each shard holds whole batches of that many rows only (above).
  ShardSet(const std::string& pattern, int64_t seq_len, int64_t vocab_size,
           int64_t whole_batch_rows = 0);
  ~ShardSet();
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  const std::string& pattern() const { return pattern_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  const ShardHeader& shard(int64_t i) const { return shards_[i].header; }
  // token_hash of shard i's tokens (computed with the id check, while they are read anyway).
  uint64_t shard_hash(int64_t i) const { return shards_[i].hash; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_sequences() const { return seq_begin_.back(); }

  // Writes sequence `index` as T inputs and T targets (int32, the backend's token type). Throws
  // naming the shard when it was changed since it was loaded.
  void read_sequence(int64_t index, int32_t* inputs, int32_t* targets) const;
  // Writes `count` tokens of shard `shard` from token `first` (the document loader's reads).
  // Throws naming the shard when the range is outside it or the file changed since it was
  // loaded.
  void read_tokens(int64_t shard, int64_t first, int64_t count, uint16_t* out) const;
  // Where a sequence lives: its shard and the token offset of its first input.
  std::pair<int64_t, int64_t> locate(int64_t index) const;

 private:
  struct Shard {
    ShardHeader header;
    uint64_t hash = 0;
    int fd = -1;
    // The file as loaded: read_sequence compares these after each read.
    off_t bytes = 0;
    timespec modified{};
  };
  // Opens, checks and hashes each file (the constructor closes them should one throw).
  void load(const std::vector<std::string>& paths, int64_t vocab_size);
  // Throws naming the shard unless its open file still has the size and time it had at load.
  void check_unchanged(const Shard& s) const;

  std::string pattern_;
  int64_t seq_len_;
  int64_t whole_batch_rows_;
  int64_t num_tokens_ = 0;
  std::vector<Shard> shards_;
  std::vector<int64_t> seq_begin_;  // prefix sums of sequences per shard, size num_shards + 1
};

// Files matching a glob, sorted; throws when nothing matches, naming the pattern, the working
// directory it is relative to, a missing folder, and the commands that write shards.
std::vector<std::string> glob_files(const std::string& pattern);

}  // namespace data
