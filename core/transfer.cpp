#include "core/transfer.h"

#include "core/check.h"

namespace core {

bool is_host_memory(const Device& device) {
  return device.is_cpu();
}

Tensor to_host(Backend& backend, const Tensor& t) {
  if (!t.defined() || is_host_memory(t.device())) return t;
  ENGINE_CHECK(t.is_contiguous(), "to_host: " + t.str() + " is not contiguous");
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  if (t.nbytes() > 0) backend.copy_to_host(host.raw_data(), t.raw_data(), t.nbytes());
  return host;
}

Tensor to_backend(Backend& backend, const Tensor& host) {
  if (!host.defined() || host.device() == backend.device()) return host;
  ENGINE_CHECK(is_host_memory(host.device()) && host.is_contiguous(),
               "to_backend: " + host.str() + " is not a contiguous host tensor (the step runs on " +
                   backend.name() + ")");
  Tensor t = Tensor::empty(host.shape(), host.dtype(), backend.allocator());
  if (host.nbytes() > 0) backend.copy_from_host(t.raw_data(), host.raw_data(), host.nbytes());
  return t;
}

void write_from_host(Backend& backend, const Tensor& dst, const Tensor& host) {
  ENGINE_CHECK(is_host_memory(host.device()) && host.is_contiguous() && dst.is_contiguous() &&
                   host.dtype() == dst.dtype() && host.nbytes() == dst.nbytes(),
               "write_from_host: " + host.str() + " cannot be written into " + dst.str());
  if (host.nbytes() > 0) backend.copy_from_host(dst.raw_data(), host.raw_data(), host.nbytes());
}

}  // namespace core
