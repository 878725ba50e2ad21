// The one place that turns a device into its backend, so code above core/ never compares a device
// with the CPU backend's to pick one (docs/DESIGN.md, "Where a new thing goes": a device).
#pragma once

#include <memory>

#include "core/backend.h"
#include "core/device.h"

namespace core {

// The backend computing on `device`: the process-wide CPU backend for the host (shared, never
// freed by the pointer), a new CUDA backend for a GPU (freed with the last pointer; throws
// core::Error naming the reason when the build has no CUDA support or no such device).
std::shared_ptr<Backend> make_backend(const Device& device);

}  // namespace core
