// Validation: the mean loss of a model over the validation split, the same number for the
// trainer's evaluations and for `engine eval`.
#pragma once

#include <functional>

#include "comm/communicator.h"
#include "model/gpt.h"

namespace data {
class ValLoader;
}

namespace engine {

// Mean validation loss over every step of `val` (collective over `comm`, whose ranks each read
// their rows). `after_forward` runs after each forward (the trainer's ZeRO state frees what the
// forward gathered).
double validation_loss(model::Gpt& gpt, data::ValLoader& val, comm::Communicator& comm,
                       const std::function<void()>& after_forward = {});

}  // namespace engine
