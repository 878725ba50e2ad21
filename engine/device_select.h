// Device selection: the device a rank trains on, from the config's `device` key and what the
// rank sees (the build, the GPUs, its place among the ranks of its node). Pure: the facts come
// in as arguments, so every case is tested without a GPU; apps/engine gathers them.
//
//   cpu    the CPU backend.
//   cuda   GPU <node-local rank>; refused when the build has no CUDA backend, when the machine
//          shows no GPU, or when the node runs more ranks than it has GPUs; with shared GPUs
//          (comm.device_collectives: mpi) GPU <node-local rank mod GPUs>.
//   auto   cuda when the build has it and the rank sees a GPU (with the same refusal when the
//          node runs more ranks than GPUs), else cpu.
#pragma once

#include <string>

#include "core/device.h"

namespace engine {

// The values the `device` key accepts.
inline constexpr const char* kDeviceModes[] = {"auto", "cpu", "cuda"};
bool is_device_mode(const std::string& mode);

struct DeviceFacts {
  bool cuda_built = false;  // the build has the CUDA backend
  int visible_gpus = 0;     // CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied)
  int local_rank = 0;       // this rank's place among the ranks of its node
  int local_size = 1;       // ranks on this node
  // Several ranks may drive one GPU (their collectives go over MPI: NCCL refuses a GPU twice).
  bool share_gpus = false;
};

struct DeviceSelection {
  core::Device device;  // meaningful when error is empty
  std::string error;    // why the rank cannot start: names the mode and the counts
  bool ok() const { return error.empty(); }
};

DeviceSelection select_device(const std::string& mode, const DeviceFacts& facts);

}  // namespace engine
