// The kinds of reparametrisation, listed in one place (reparam_kinds.cpp, one line each): the
// factory of the list the trainer holds and the reading of a reparametrised checkpoint's dense
// weights. The interface (engine/reparam/reparam.h) knows none of them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/reparam/reparam.h"

namespace engine {

// Every reparametrisation the config asks for, in a fixed order (OSFT: an optimizer group
// `osft` with targets). Refuses a config one of them cannot serve, naming the key.
std::vector<std::unique_ptr<Reparam>> make_reparams(const ReparamSetup& setup);

// Model parameter `param` ([shape]) of a checkpoint that holds it reparametrised (as tensors of
// the kind that saved it): the dense weight, whole, on the host, computed on `backend`;
// undefined when the checkpoint holds no such tensors for it.
core::Tensor dense_weight_from_checkpoint(const CheckpointReader& reader, const std::string& param,
                                          const core::Shape& shape, core::Backend& backend);

}  // namespace engine
