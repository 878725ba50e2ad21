// Whole tensors between the host and a backend's memory: the one copy path every floor uses, so
// no code above core branches on the device to move a tensor. A tensor already where it is wanted
// comes back as it is (the same storage); anything else is copied through the backend. And the
// one question above core about where memory lies: whether the host may use it in place.
#pragma once

#include "core/backend.h"
#include "core/tensor.h"

namespace core {

// A host tensor with t's contents (t itself when it is on the host, or undefined).
Tensor to_host(Backend& backend, const Tensor& t);
// A tensor in `backend`'s memory with host's contents (host itself when it is there already, or
// undefined); anything else must be a contiguous host tensor.
Tensor to_backend(Backend& backend, const Tensor& host);
// Writes host's contents into `dst` in place, wherever in `backend`'s memory it lives: for
// storage others hold views of (a model's parameters, an optimizer's factors). Both contiguous,
// of one dtype and size; `host` in host memory.
void write_from_host(Backend& backend, const Tensor& dst, const Tensor& host);

// Whether memory of `device` is host memory, which the host reads and writes in place (files,
// MPI's host collectives, host loops). Code above core checks this where a buffer must be host
// memory, never the device's kind.
bool is_host_memory(const Device& device);

}  // namespace core
