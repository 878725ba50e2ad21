#include "comm/placement.h"

#include "core/check.h"

namespace comm {

std::string Placement::str() const {
  switch (kind) {
    case Kind::Replicate:
      return "Replicate";
    case Kind::Shard:
      return "Shard(" + std::to_string(dim) + ")";
    case Kind::Owned:
      return owner == kAutoOwner ? "Owned(auto)" : "Owned(" + std::to_string(owner) + ")";
  }
  return "?";
}

Range shard_range(int64_t n, int world_size, int rank) {
  ENGINE_CHECK(world_size > 0 && rank >= 0 && rank < world_size && n >= 0,
               "shard_range: bad arguments n=" + std::to_string(n) +
                   " world_size=" + std::to_string(world_size) + " rank=" + std::to_string(rank));
  return {rank * n / world_size, (rank + 1) * n / world_size};
}

}  // namespace comm
