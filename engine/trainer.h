// The trainer: builds a run from its parts and runs the training loop. The parts: the batch
// geometry and its loaders (engine/batch_geometry.h), the model, the optimizer groups, the
// reparametrisations of trainables (engine/reparam/reparam.h), the sharding plan and the ZeRO state
// (engine/zero_state.h), the checkpointer (engine/checkpoint/checkpointer.h).
//
// One step, as named phases (train_step): forward and backward over the micro-batches (the
// model's layer events go to the ZeRO state and the reparametrisations) -> the gradients to
// their placements, summed over ranks and micro-steps -> global grad norm, the mean and the
// clipping in one scaling pass, loss and norm checked -> optimizer step on the local parts -> the
// updated parameters published (and the reparametrisations' model weights written) -> metrics.
// Where values and gradients live between these phases, and the communication that moves them,
// is the ZeRO state's.
// log.trace records chosen steps as a timeline of these phases, the micro-steps, the layers and
// the collectives (engine/run_trace.h); log.tensorboard writes the metrics for TensorBoard.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/sharding_plan.h"
#include "engine/batch_geometry.h"
#include "engine/checkpoint/checkpointer.h"
#include "engine/config.h"
#include "engine/lr_schedule.h"
#include "engine/metrics.h"
#include "engine/reparam/reparam.h"
#include "engine/run_trace.h"
#include "engine/stage_schedule.h"
#include "engine/training_health.h"
#include "engine/zero_state.h"
#include "model/gpt.h"
#include "optim/optimizer_set.h"

namespace data {
class TrainLoader;
class ValLoader;
}  // namespace data

namespace engine {

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
  // Builds everything on `backend` (the device the engine chose, engine/device_select.h).
  // `control` carries scalars, barriers and the checkpoint protocol (host buffers, MPI);
  // `tensors` moves parameters and gradients (buffers of the backend's device: NCCL on a GPU).
  // On the CPU both are the same MPI communicator.
  Trainer(Config config, comm::Communicator& control, comm::Communicator& tensors,
          core::Backend& backend);
  ~Trainer();

  const Config& config() const { return config_; }
  model::Gpt& model() { return *gpt_; }
  const comm::ShardingPlan& plan() const { return *plan_; }
  const BatchGeometry& geometry() const { return geometry_; }
  // The reparametrisations of trainables the config asked for (engine/reparam/reparam.h).
  const std::vector<std::unique_ptr<Reparam>>& reparams() const { return reparams_; }
  int64_t step() const { return counters_.step; }  // optimizer steps done
  // train.stages: the schedule, and what the step being taken (or the next one, between steps)
  // reads from its stage: windows, multi-token and prefix-loss weights, rows. The model side
  // reads these from here; the long window is already applied (Gpt::set_attention_window).
  const StageSchedule& stage_schedule() const { return stages_; }
  const StageSettings& stage_settings() const { return stage_settings_; }

  // Restores parameters, optimizer state and the step counter from a checkpoint folder (any
  // world size).
  void load_checkpoint(const std::string& dir);
  // Sets the parameters from trained weights (train.init_from: engine/model_loading.h's
  // sources). Optimizer state and the step counter are untouched (a fresh run's). Shapes are
  // checked against the model config; a mismatch is refused naming the tensor.
  void init_params_from(const std::string& source);
  // Saves a checkpoint of the current state (collective); returns its folder.
  std::string save_checkpoint();

  // One optimizer step; returns its record (losses, norm, timing...).
  StepRecord train_step();
  // Mean validation loss over train.val_tokens tokens (collective); a checkpoint saved at this
  // step records it (checkpoint.keep_best).
  double evaluate();
  // The whole run: resume per checkpoint.resume, warm-up, steps, evals, checkpoints, metrics.
  TrainSummary run();
  // Whether run() got past its set-up (resume or init_from, the log files) to the training.
  bool started() const { return started_; }

 private:
  void print_banner() const;
  // The step's micro-steps and tokens, and with train.stages its stage's settings (the long
  // window set on the model).
  void apply_stage(int64_t step);
  // The long window of `step`'s stage (train.stages with model.window): see trainer.cpp.
  void apply_stage_window(int64_t step);
  void warm_up();
  // The phases of train_step: forward and backward over the micro-batches (the loss summed on
  // the device); the gradients' mean and clip factor, computed and applied on the device
  // (returns whether there is one: false when it is 1); the optimizer step (the factor passed
  // to the optimizers that fold it) and the publish.
  void forward_backward();
  bool clip_grads();
  void optimizer_step(double lr_scale, bool scaled);
  // 1 / (ranks x micro-steps), the factor that makes the reduced sums the mean gradient
  // (train.rank_sum_loss: times each rank's tokens).
  double gradient_mean() const;
  // The step's loss (mean over the global batch) and gradient norm (before the clip), read
  // back from step_sums_: the one read of a step.
  struct StepSums {
    double loss = 0;
    double grad_norm = 0;
  };
  StepSums read_step_sums();
  // One micro-step's backward; `last` marks the step's last micro-step.
  void backward(bool last);
  void on_layer_event(model::Gpt::LayerEvent event, int layer);
  // log.trace: a layer's forward or backward as a span, from its kBefore* event to its kAfter*.
  void trace_layer(model::Gpt::LayerEvent event, int layer);
  // log.trace on a GPU: the step's phases in the device's order of work, from marks made at the
  // phase boundaries (marks[0] at the step's start, host time begin_us).
  void trace_device_phases(const std::vector<std::pair<std::string, double>>& phases,
                           const std::vector<core::TimeMark>& marks, double begin_us);

  Config config_;
  // log.trace (all null when off): the timeline of the traced steps, and the communicators that
  // record into it (wrapping the control and tensor communicators given).
  std::unique_ptr<RunTrace> trace_;
  core::Tracer* tracer_ = nullptr;
  std::unique_ptr<comm::Communicator> traced_control_;
  std::unique_ptr<comm::Communicator> traced_tensors_;
  comm::Communicator& comm_;     // control: host scalars, barriers, checkpoints
  comm::Communicator& tensors_;  // parameters and gradients on the backend's device
  core::Backend& backend_;
  BatchGeometry geometry_;
  std::unique_ptr<model::Gpt> gpt_;
  std::unique_ptr<optim::OptimizerSet> optim_;
  std::vector<std::unique_ptr<Reparam>> reparams_;
  std::unique_ptr<comm::ShardingPlan> plan_;
  std::unique_ptr<ZeroState> zero_;
  std::unique_ptr<data::TrainLoader> loader_;
  std::unique_ptr<data::ValLoader> val_loader_;
  std::unique_ptr<Checkpointer> checkpointer_;
  TrainingHealth health_;
  LrSchedule schedule_;
  // train.stages: the record's batch stages (off: enabled() false), and what the step being
  // taken reads from its stage.
  StageSchedule stages_;
  StageSettings stage_settings_;
  int64_t windows_set_ = -1;      // the last stage whose long window the model has taken
  int64_t step_micro_steps_ = 1;  // the step's micro-steps on each rank
  int64_t step_tokens_ = 0;       // the step's tokens, all ranks
  RunCounters counters_;
  bool started_ = false;
  std::optional<std::pair<int64_t, double>> last_val_;  // (step, validation loss)
  std::vector<int64_t> expert_rows_;  // MoE: the last step's rows per expert, over the ranks
  // On the backend's device: {loss sum, gradient sum of squares} of the step, reduced over the
  // ranks in one all-reduce, and the gradient scale computed from them.
  core::Tensor step_sums_;
  core::Tensor grad_scale_;
  double flops_per_token_ = 0;
  double layer_begin_us_ = 0;  // log.trace: the start of the layer running now
};

}  // namespace engine
