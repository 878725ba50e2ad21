#include "model/flops.h"

#include "model/param_table.h"

namespace model {

double training_flops_per_token(const ModelConfig& config) {
  const ParamTable table(config);
  const bool tied_head = !table.find("lm_head.weight");
  double matmul_weights = 0;
  for (const ParamInfo& p : table.params()) {
    const double n = static_cast<double>(p.numel);
    switch (p.kind) {
      case ParamKind::Matrix:
      case ParamKind::Head:
        matmul_weights += n;
        break;
      case ParamKind::ExpertMatrix:
        // A token passes through top_k of the E experts stacked in the tensor.
        matmul_weights += n / config.moe_experts * config.moe_top_k;
        break;
      case ParamKind::Embedding:
        if (tied_head && p.name == "embed.weight") matmul_weights += n;
        break;
      case ParamKind::Vector:
        break;
    }
  }
  const double attention_layers =
      static_cast<double>(config.n_layer) - static_cast<double>(config.no_attn_layers.size());
  return 6.0 * matmul_weights + 6.0 * attention_layers * config.d_model * config.seq_len;
}

}  // namespace model
