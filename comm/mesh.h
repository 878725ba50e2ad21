// A 2D device mesh over a communicator of W ranks: W = replicas x shard_size. Rank r sits at
// (replica r / shard_size, shard index r % shard_size). The shard group (consecutive ranks, e.g.
// one node) holds one copy of the sharded state; the replicate group (same shard index in every
// replica) all-reduces what the shard groups computed (HSDP: shard inside, replicate across).
// shard_size == W is plain ZeRO over everything, shard_size == 1 plain data parallelism.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace comm {

struct Mesh2D {
  int replicas = 1;
  int shard_size = 1;
  std::unique_ptr<Communicator> shard;      // size shard_size, rank = shard index
  std::unique_ptr<Communicator> replicate;  // size replicas, rank = replica index
};

// Collective over `world`; shard_size must divide world.size().
Mesh2D make_mesh(Communicator& world, int shard_size);

}  // namespace comm
