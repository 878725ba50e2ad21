#include "engine/checkpoint/checkpointer.h"

#include <cstdio>
#include <filesystem>

#include "core/check.h"
#include "data/train_loader.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/resume_check.h"
#include "engine/checkpoint/sharded_state.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

std::string double_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string state_value(const Manifest& m, const std::string& key, const std::string& dir) {
  auto it = m.state.find(key);
  ENGINE_CHECK(it != m.state.end(),
               "checkpoint " + dir + ": the manifest has no state '" + key + "'");
  return it->second;
}

}  // namespace

Checkpointer::Checkpointer(const Config& config, comm::Communicator& control,
                           core::Backend& backend, CheckpointedState state)
    : config_(config), comm_(control), backend_(backend), state_(state) {}

std::string Checkpointer::save(const RunCounters& counters, std::optional<double> val_loss) {
  const std::string& root = config_.checkpoint.dir;
  const int rank = comm_.rank();
  if (rank == 0) prepare_staging(root, counters.step);
  comm_.barrier();

  RankState state = sharded_rank_state(state_.plan, state_.zero.local_values(), state_.optimizers);
  for (const auto& reparam : state_.reparams)
    reparam->save(state.slices, rank);
  const std::vector<float> fp8_scales = state_.model.fp8_mlp_scales();
  if (!fp8_scales.empty()) {
    const int64_t n = static_cast<int64_t>(fp8_scales.size());
    state.slices.push_back({kFp8MlpScalesKey,
                            {comm_.size(), n},
                            0,
                            rank,
                            core::Tensor::from_vector({1, n}, fp8_scales)});
  }
  stage_to_host(state, backend_);
  write_rank_file(staging_path(root, counters.step), rank, state.slices, state.counters);
  comm_.barrier();

  std::string dir;
  if (rank == 0) {
    Manifest m;
    m.step = counters.step;
    m.world_size = comm_.size();
    m.config_yaml = config_to_yaml(config_);
    m.state["data.seed"] = std::to_string(config_.train.seed);
    m.state["data.step"] = std::to_string(counters.step);
    m.state["train.tokens"] = std::to_string(counters.tokens);
    m.state["train.time_ms"] = double_text(counters.train_time_ms);
    if (val_loss) m.state[kValLossKey] = double_text(*val_loss);
    record_data_state(m, state_.loader);
    dir = commit_checkpoint(root, m, static_cast<int>(config_.checkpoint.keep),
                            config_.checkpoint.keep_best);
  }
  comm_.barrier();
  return dir.empty() ? (fs::path(root) / checkpoint_dir_name(counters.step)).string() : dir;
}

void Checkpointer::load_fp8_mlp_scales(const CheckpointReader& reader) {
  const int64_t n = static_cast<int64_t>(state_.model.fp8_mlp_scales().size());
  if (n == 0) return;
  ENGINE_CHECK(reader.has(kFp8MlpScalesKey),
               std::string("the checkpoint has no ") + kFp8MlpScalesKey +
                   " (model.mlp_fp8's delayed scales): it was saved without model.mlp_fp8");
  const core::Shape& shape = reader.global_shape(kFp8MlpScalesKey);
  ENGINE_CHECK(shape.size() == 2 && shape[0] >= 1 && shape[1] == n,
               std::string(kFp8MlpScalesKey) + " has shape " + core::shape_str(shape) +
                   ", this model expects [world size, " + std::to_string(n) + "]");
  core::Tensor row = core::Tensor::empty({1, n});
  reader.read(kFp8MlpScalesKey, 0, comm_.rank() % shape[0], row);
  state_.model.set_fp8_mlp_scales(row.to_vector());
}

RunCounters Checkpointer::load(const std::string& dir) {
  const CheckpointReader reader(dir);
  const Manifest& m = reader.manifest();
  std::vector<std::string> names;
  for (size_t i = 0; i < state_.plan.num_params(); ++i)
    names.push_back(state_.plan.param(i).name);
  check_same_model(dir, m, config_);
  check_same_optimizers(dir, m, config_, names);
  check_same_data(dir, m, state_.loader);
  // The config agrees with the checkpoint's: what its files lack or hold misshapen (a tensor
  // dropped, re-signed in the manifest) is damage, refused offering the next older checkpoint.
  try {
    read_local_params(reader, state_.plan, state_.zero.local_values(), backend_);
    state_.zero.publish_params();
    for (const auto& reparam : state_.reparams)
      reparam->load(reader);
    state_.optimizers.load_state(
        read_optimizer_state(reader, state_.plan, state_.zero.local_values(), state_.optimizers));
    load_fp8_mlp_scales(reader);
  } catch (const core::Error& e) {
    throw core::Error(resume_refusal(config_.checkpoint.dir, dir, e.what()));
  }

  ENGINE_CHECK(std::stoll(state_value(m, "data.seed", dir)) == config_.train.seed,
               "checkpoint " + dir + " was trained with train.seed " +
                   state_value(m, "data.seed", dir) + ", this run has " +
                   std::to_string(config_.train.seed) + ": the data order would differ");
  RunCounters counters;
  counters.step = std::stoll(state_value(m, "data.step", dir));
  counters.tokens = std::stoll(state_value(m, "train.tokens", dir));
  counters.train_time_ms = std::stod(state_value(m, "train.time_ms", dir));
  return counters;
}

}  // namespace engine
