// ParamDesc: one trained tensor as every floor above the model describes it: the optimizer
// groups match its name and check its shape, the sharding plan places it, the ZeRO state moves
// it by layer, the checkpoints store it under its name. The model's own table entry
// (model::ParamInfo: init rule, flat-buffer offset) and a rank's local part of it
// (optim::ParamShard) are different things and keep their own types.
#pragma once

#include <string>

#include "comm/placement.h"
#include "core/tensor.h"

namespace comm {

struct ParamDesc {
  std::string name;   // checkpoint key and optimizer-glob name (model/param_table.h)
  core::Shape shape;  // the whole tensor
  Placement placement = Placement::replicate();  // as its optimizer group requests it
  // The layer whose forward reads it and whose backward finishes its gradient; the stage-3
  // gather unit (-1: used from the start of forward to the end of backward: embeddings).
  int layer = -1;
  // Its gradient is zero outside a few rows along dim 0 (an embedding: the rows of the tokens
  // seen), so reducing only the nonzero rows can move far fewer bytes.
  bool sparse_rows = false;
};

}  // namespace comm
