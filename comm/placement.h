// Placement of one parameter across the ranks of a shard group, and the split rule for Shard.
#pragma once

#include <cstdint>
#include <string>

namespace comm {

struct Placement {
  enum class Kind : uint8_t { Replicate, Shard, Owned };
  static constexpr int kAutoOwner = -1;

  Kind kind = Kind::Replicate;
  int dim = 0;             // Shard: the dimension split across ranks
  int owner = kAutoOwner;  // Owned: the rank holding the whole tensor (kAutoOwner: plan chooses)

  static Placement replicate() { return {Kind::Replicate, 0, kAutoOwner}; }
  static Placement shard(int dim = 0) { return {Kind::Shard, dim, kAutoOwner}; }
  static Placement owned(int rank = kAutoOwner) { return {Kind::Owned, 0, rank}; }

  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_shard() const { return kind == Kind::Shard; }
  bool is_owned() const { return kind == Kind::Owned; }
  bool operator==(const Placement& other) const = default;
  std::string str() const;  // "Replicate", "Shard(0)", "Owned(2)", "Owned(auto)"
};

// Half-open index range [begin, end).
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range& other) const = default;
};

// Rank r of w gets [floor(r n / w), floor((r + 1) n / w)): sizes differ by at most one, ranks
// below the remainder get the smaller part, and a rank may get nothing when n < w.
Range shard_range(int64_t n, int world_size, int rank);

}  // namespace comm
