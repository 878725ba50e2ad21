#include "engine/validation.h"

#include "data/batch.h"
#include "data/val_loader.h"

namespace engine {

double validation_loss(model::Gpt& gpt, data::ValLoader& val, comm::Communicator& comm,
                       const std::function<void()>& after_forward) {
  data::Batch batch;
  double sum = 0;
  for (int64_t s = 0; s < val.num_steps(); ++s) {
    val.load(s, batch);
    sum += gpt.eval_loss(batch.inputs.data(), batch.targets.data(), static_cast<int>(batch.rows),
                         gpt.config().seq_len);
    if (after_forward) after_forward();
  }
  // Every rank and step averages the same number of tokens: the mean of means is the mean.
  comm.all_reduce(&sum, 1, comm::ReduceOp::Sum);
  return sum / static_cast<double>(val.num_steps() * comm.size());
}

}  // namespace engine
