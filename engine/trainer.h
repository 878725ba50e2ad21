// The trainer: wires the model, the sharding plan, the optimizer groups, the data loaders and
// the checkpoints together, and runs the training loop.
//
// One step, as named phases (train_step): forward and backward over the micro-batches (A = rows
// per rank / micro rows micro-steps; the model's layer events go to the ZeRO state) -> the
// gradients to their placements, the mean over ranks and micro-steps -> global grad norm and
// clipping -> check loss and norm are finite (the same global values on every rank) -> optimizer
// step on the local parts -> the updated parameters published -> metrics.
// Where values and gradients live between these phases, and the communication that moves them,
// is the ZeRO state's (engine/zero_state.h); checkpoints map it through engine/sharded_state.h.
// The global batch is train.batch_tokens whatever the world size, so np 1, 2, 4 take the same
// steps up to floating-point summation order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/sharding_plan.h"
#include "engine/config.h"
#include "engine/lr_schedule.h"
#include "engine/metrics.h"
#include "engine/training_health.h"
#include "engine/zero_state.h"
#include "model/gpt.h"
#include "optim/optimizer_set.h"

namespace data {
class DataLoader;
class ValLoader;
}  // namespace data

namespace engine {

class OsftReparam;

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

// One line per rank on rank 0's log: its backend (device), host, OpenMP threads and the cores it
// may use; then one warning line if some rank's threads outnumber its cores (collective,
// start-up only).
void log_rank_devices(comm::Communicator& comm, core::Backend& backend);

class Trainer {
 public:
  // Builds everything on `backend` (the device the engine chose, engine/device_select.h);
  // `with_train_data` false skips the training loader (eval, export, sample only need the model
  // and, for eval, the validation loader). `control` carries scalars, barriers and the
  // checkpoint protocol (host buffers, MPI); `tensors` moves parameters and gradients (buffers
  // of the backend's device: NCCL on a GPU). On the CPU both are the same MPI communicator.
  Trainer(Config config, comm::Communicator& control, comm::Communicator& tensors,
          core::Backend& backend, bool with_train_data = true, bool with_val_data = true);
  ~Trainer();

  const Config& config() const { return config_; }
  model::Gpt& model() { return *gpt_; }
  const comm::ShardingPlan& plan() const { return *plan_; }
  // The OSFT factors held beside the model; null without osft targets.
  const OsftReparam* osft() const { return osft_.get(); }
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
  // Whether run() got past its set-up (resume or init_from, the log files) to the training.
  bool started() const { return started_; }

 private:
  void print_banner() const;
  void warm_up();
  // One micro-step's backward; `last` marks the step's last micro-step.
  void backward(bool last);
  void on_layer_event(model::Gpt::LayerEvent event, int layer);

  Config config_;
  comm::Communicator& comm_;     // control: host scalars, barriers, checkpoints
  comm::Communicator& tensors_;  // parameters and gradients on the backend's device
  core::Backend& backend_;
  std::unique_ptr<model::Gpt> gpt_;
  std::unique_ptr<optim::OptimizerSet> optim_;
  std::unique_ptr<comm::ShardingPlan> plan_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<data::ValLoader> val_loader_;
  TrainingHealth health_;
  LrSchedule schedule_;
  std::unique_ptr<ZeroState> zero_;
  std::unique_ptr<OsftReparam> osft_;  // OSFT factors beside the model (null without targets)
  int64_t micro_rows_ = 0;
  int64_t grad_accum_ = 1;
  int64_t val_rows_ = 0;  // validation rows per rank per forward
  int64_t step_ = 0;
  bool started_ = false;
  int64_t tokens_ = 0;
  double train_time_ms_ = 0;
  double base_lr_ = 0;  // the first group's lr, for the log
  double flops_per_token_ = 0;
};

}  // namespace engine
