#include "core/backend_factory.h"

namespace core {

std::shared_ptr<Backend> make_backend(const Device& device) {
  switch (device.kind) {
    case Device::Kind::Cpu:
      return std::shared_ptr<Backend>(&cpu_backend(), [](Backend*) {});
    case Device::Kind::Cuda:
      return make_cuda_backend(device.index);
  }
  return nullptr;
}

}  // namespace core
