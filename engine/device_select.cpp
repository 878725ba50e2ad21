#include "engine/device_select.h"

#include <algorithm>
#include <iterator>

namespace engine {

bool is_device_mode(const std::string& mode) {
  return std::find(std::begin(kDeviceModes), std::end(kDeviceModes), mode) !=
         std::end(kDeviceModes);
}

DeviceSelection select_device(const std::string& mode, const DeviceFacts& f) {
  DeviceSelection s;
  if (!is_device_mode(mode)) {
    s.error = "device: '" + mode + "' is not a device; use auto, cpu or cuda";
    return s;
  }
  if (mode == "cpu") {
    s.device = core::Device::cpu();
    return s;
  }
  if (mode == "auto" && (!f.cuda_built || f.visible_gpus <= 0)) {
    s.device = core::Device::cpu();
    return s;
  }
  if (!f.cuda_built) {
    s.error =
        "device: cuda was asked for, but this build has no CUDA backend (build on a machine "
        "with the CUDA toolkit, cmake -DENGINE_CUDA=ON), or use device: cpu";
    return s;
  }
  if (f.visible_gpus <= 0) {
    s.error =
        "device: cuda was asked for, but this machine shows no GPU (no CUDA device visible: "
        "check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES), or use device: cpu";
    return s;
  }
  if (f.local_size > f.visible_gpus && !f.share_gpus) {
    s.error = "device: " + mode + ": this node runs " + std::to_string(f.local_size) +
              " ranks but shows " + std::to_string(f.visible_gpus) +
              " GPU(s); one rank drives one GPU, so start at most " +
              std::to_string(f.visible_gpus) +
              " ranks per node (or comm.device_collectives: mpi to share GPUs, or device: cpu)";
    return s;
  }
  s.device = core::Device::cuda(f.local_rank % f.visible_gpus);
  return s;
}

}  // namespace engine
