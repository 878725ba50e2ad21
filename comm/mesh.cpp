#include "comm/mesh.h"

#include <string>

#include "core/check.h"

namespace comm {

Mesh2D make_mesh(Communicator& world, int shard_size) {
  const int W = world.size();
  ENGINE_CHECK(shard_size >= 1 && W % shard_size == 0,
               "make_mesh on rank " + std::to_string(world.rank()) + ": shard size " +
                   std::to_string(shard_size) + " does not divide the world size " +
                   std::to_string(W));
  Mesh2D mesh;
  mesh.shard_size = shard_size;
  mesh.replicas = W / shard_size;
  const int replica = world.rank() / shard_size, index = world.rank() % shard_size;
  mesh.shard = world.split(replica, index);
  mesh.replicate = world.split(index, replica);
  return mesh;
}

}  // namespace comm
