// The trainer: wires the model, the sharding plan, the optimizer groups, the data loaders and
// the checkpoints together, and runs the training loop.
//
// One step, as named phases:
//   zero grads -> micro-batch loop (forward, backward; A = rows per rank / micro rows
//   micro-steps) -> scale by 1/A -> reduce every gradient to its placement (mean over ranks)
//   -> global grad norm over the local parts (each element counted once) and clipping -> check
//   loss and norm are finite (the same global values on every rank) -> optimizer step on the
//   local parts -> all-gather the updated parameters -> metrics.
// ZeRO stage 3 (training runs): the model's flat buffers are freed after initialisation and
// parameters rest only as this rank's local parts. The model's layer hook all-gathers a layer's
// full parameters into allocator buffers just before its forward (layer -1, the embeddings,
// ln_f and head, from the start of forward to the end of backward; block l until block l+1
// starts, and again for its backward), gives it a zeroed full gradient buffer for its backward,
// and after that backward reduce-scatters the gradient into the local part and frees both.
// Trainers without training data (export, sample) keep the full model at every stage.
// The global batch is train.batch_tokens whatever the world size, so np 1, 2, 4 take the same
// steps up to floating-point summation order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/layer_gatherer.h"
#include "comm/sharding_plan.h"
#include "engine/config.h"
#include "engine/lr_schedule.h"
#include "engine/metrics.h"
#include "model/gpt.h"
#include "optim/optimizer_set.h"

namespace data {
class DataLoader;
class ValLoader;
}  // namespace data

namespace engine {

// The engine config's model section as the model's own struct.
model::ModelConfig model_config_of(const Config& config);

struct TrainSummary {
  int64_t steps_done = 0;
  std::optional<double> final_val_loss;
  double train_time_ms = 0;
  std::optional<int64_t> target_step;  // step at which train.target_val_loss was reached
  std::optional<double> target_time_ms;
  std::string last_checkpoint;
};

class Trainer {
 public:
  // Builds everything; `with_train_data` false skips the training loader (eval, export, sample
  // only need the model and, for eval, the validation loader).
  Trainer(Config config, comm::Communicator& comm, bool with_train_data = true,
          bool with_val_data = true);
  ~Trainer();

  const Config& config() const { return config_; }
  model::Gpt& model() { return *gpt_; }
  const comm::ShardingPlan& plan() const { return *plan_; }
  int64_t step() const { return step_; }  // optimizer steps done
  int64_t grad_accum() const { return grad_accum_; }
  int64_t micro_rows() const { return micro_rows_; }

  // Restores parameters, optimizer state and the step counter from a checkpoint folder (any
  // world size). Parameters only (no optimizer state) when `params_only`.
  void load_checkpoint(const std::string& dir, bool params_only = false);
  // Sets the parameters from trained weights (train.init_from): a checkpoint folder, a
  // safetensors file of `engine export` or a Hugging Face GPT-2 folder. Optimizer state and the
  // step counter are untouched (a fresh run's). Shapes are checked against the model config; a
  // mismatch is refused naming the tensor.
  void init_params_from(const std::string& source);
  // Saves a checkpoint of the current state (collective); returns its folder.
  std::string save_checkpoint();

  // One optimizer step; returns its record (losses, norm, timing...).
  StepRecord train_step();
  // Mean validation loss over train.val_tokens tokens (collective).
  double evaluate();
  // The whole run: resume per checkpoint.resume, warm-up, steps, evals, checkpoints, metrics.
  TrainSummary run();

 private:
  void print_banner() const;
  void warm_up();
  void scale_grads(double factor);
  void zero_grads();
  // The model's backward; at stage 3 first binds layer -1's gradient buffers.
  void model_backward();
  // Stage 3 residency (layer_hook is the model's hook; see the header comment).
  void layer_hook(model::Gpt::LayerEvent event, int layer);
  void gather_layer(int layer);
  void release_layer(int layer);
  void bind_layer_grads(int layer);
  void reduce_layer_grads(int layer);
  void release_all_layers();

  Config config_;
  comm::Communicator& comm_;
  std::unique_ptr<model::Gpt> gpt_;
  std::unique_ptr<optim::OptimizerSet> optim_;
  std::unique_ptr<comm::ShardingPlan> plan_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<data::ValLoader> val_loader_;
  LrSchedule schedule_;
  std::vector<core::Tensor> local_value_;
  std::vector<core::Tensor> local_grad_;
  // Stage 3: parameters rest as local_value_; full tensors only while a layer is gathered.
  std::unique_ptr<comm::LayerGatherer> gatherer_;
  bool first_micro_ = true;  // stage 3: the next reduction overwrites local_grad_
  int64_t micro_rows_ = 0;
  int64_t grad_accum_ = 1;
  int64_t val_rows_ = 0;  // validation rows per rank per forward
  int64_t step_ = 0;
  int64_t tokens_ = 0;
  double train_time_ms_ = 0;
  double base_lr_ = 0;  // the first group's lr, for the log
  double flops_per_token_ = 0;
};

}  // namespace engine
