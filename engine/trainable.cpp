#include "engine/trainable.h"

#include "model/gpt.h"

namespace engine {

std::vector<Trainable> model_trainables(model::Gpt& gpt) {
  std::vector<Trainable> out;
  const model::ParamTable& table = gpt.table();
  for (size_t i = 0; i < table.size(); ++i) {
    Trainable t;
    t.name = table[i].name;
    t.shape = table[i].shape;
    t.layer = table[i].layer;
    t.sparse_rows = table[i].kind == model::ParamKind::Embedding;
    t.value = gpt.param(i);
    t.grad = gpt.grad(i);
    t.bind_value = [&gpt, i](const core::Tensor& v) { gpt.bind_param(i, v); };
    t.bind_grad = [&gpt, i](const core::Tensor& g) { gpt.bind_grad(i, g); };
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace engine
