// The floating-point operations of training on one token, the one rule behind the trainer's
// GFLOP/s and MFU and the benchmarks' TFLOP/s.
#pragma once

#include "model/model_config.h"

namespace model {

// FLOPs of one token's forward and backward, counted as llm.c does: 6 per weight that enters a
// matmul for that token (every hidden matrix, the MoE router, the head: lm_head, or the
// embedding when it is the tied head; of the experts' matrices only the top_k of E a token is
// routed to), plus 6 d_model seq_len per block with attention for its scores and weighted sums
// (model.no_attn_layers have none; a sliding window still counts the whole seq_len). Biases,
// norm weights, the recipe's learned scalars and embedding lookups (value embeddings too) are
// no matmul and do not count.
double training_flops_per_token(const ModelConfig& config);

}  // namespace model
