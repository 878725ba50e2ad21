// What a resume must agree on with the checkpoint it starts from, beyond the tensors: the data
// the loader reads (shards and batch shape), each parameter's optimizer, and a step count that
// leaves something to train. Each mismatch is refused naming the checkpoint and the change,
// before anything is loaded or written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint_files.h"
#include "engine/config.h"

namespace data {
class ShardSet;
class TrainLoader;
}  // namespace data

namespace engine {

// Adds the loader's fingerprint, what it is made of, and each shard's token hash to the
// manifest's state.
void record_data_state(Manifest& manifest, const data::TrainLoader& loader);
// Refuses a loader whose shards or batch shape differ from those of the checkpoint (a
// checkpoint without a data fingerprint passes), or whose shards' tokens changed
// (check_same_content).
void check_same_data(const std::string& dir, const Manifest& manifest,
                     const data::TrainLoader& loader);
// Refuses shards whose tokens changed at the same count (the fingerprint covers counts only),
// naming the first such shard; a checkpoint without recorded content hashes passes.
void check_same_content(const std::string& dir, const Manifest& manifest,
                        const data::ShardSet& shards);
// Refuses a parameter whose optimizer (registry name) differs from the one that saved its state
// in the checkpoint (e.g. muon -> adamw, muon -> normuon): the state would not carry over.
// `params` are the model's parameter names.
void check_same_optimizers(const std::string& dir, const Manifest& manifest, const Config& config,
                           const std::vector<std::string>& params);
// Refuses a config whose model keys differ from those the checkpoint was trained with (e.g. another
// model.n_head: the tensors keep their shapes, so the weights would load into another function),
// naming each key with both values. Keys that shape only training and initialisation
// (model.zero_init_head, model.moe.aux_weight) may differ. Used by resume, eval, sample and export.
void check_same_model(const std::string& dir, const Manifest& manifest, const Config& config);
// Refuses train.steps below the checkpoint's step (there is nothing to train and the summary
// would misreport the run).
void check_steps_left(const std::string& dir, int64_t checkpoint_step, const Config& config);

}  // namespace engine
