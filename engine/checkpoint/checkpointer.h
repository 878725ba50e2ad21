// Checkpointer: a training run's checkpoints (the files are checkpoint_files.h's). A save writes
// every rank's local parameters and optimizer state (sharded_state.h) and the reparametrisations'
// own tensors, staged through the host, then rank 0 the manifest with the run's counters, data
// position and validation loss, and rotates: the newest checkpoint.keep stay, and with
// checkpoint.keep_best the one with the lowest validation loss too. A load checks that the
// checkpoint fits this run (resume_check.h) and reads it back at any world size.
// model.mlp_fp8's delayed scales are per rank (each rank's last forward): saved as row `rank` of
// kFp8MlpScalesKey [world size, 3 n_layer]; a load at another world size gives rank r the saved
// row r mod the saved world size.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/sharding_plan.h"
#include "core/backend.h"
#include "engine/config.h"
#include "engine/reparam/reparam.h"
#include "engine/zero_state.h"
#include "model/gpt.h"
#include "optim/optimizer_set.h"

namespace data {
class TrainLoader;
}

namespace engine {

// The run's progress a checkpoint carries besides the tensors.
struct RunCounters {
  int64_t step = 0;  // optimizer steps done
  int64_t tokens = 0;
  double train_time_ms = 0;
};

// What a checkpoint holds, as the trainer owns it.
struct CheckpointedState {
  const comm::ShardingPlan& plan;
  ZeroState& zero;
  optim::OptimizerSet& optimizers;
  const std::vector<std::unique_ptr<Reparam>>& reparams;
  const data::TrainLoader& loader;
  model::Gpt& model;  // model.mlp_fp8's delayed scales (per rank)
};

inline constexpr const char* kFp8MlpScalesKey = "model/fp8_mlp_scales";

class Checkpointer {
 public:
  // `control` carries the protocol's barriers (host); the tensors live on `backend`.
  Checkpointer(const Config& config, comm::Communicator& control, core::Backend& backend,
               CheckpointedState state);

  // Saves a checkpoint of the state at `counters` (collective); `val_loss` is the validation
  // loss measured at this step, if any. Returns its folder.
  std::string save(const RunCounters& counters, std::optional<double> val_loss);
  // Restores the parameters, the optimizer state and the reparametrisations' tensors from
  // checkpoint folder `dir` (any world size); returns its counters.
  RunCounters load(const std::string& dir);

 private:
  // model.mlp_fp8's scales: this rank's row of the checkpoint's (see above).
  void load_fp8_mlp_scales(const CheckpointReader& reader);

  const Config& config_;
  comm::Communicator& comm_;
  core::Backend& backend_;
  CheckpointedState state_;
};

}  // namespace engine
