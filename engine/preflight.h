// Checks made before a training run touches anything: does the configured model fit this
// machine's memory, and would a fresh start mix with an earlier run's output?
#pragma once

#include <cstdint>

#include "engine/config.h"

namespace engine {

// Roughly how many parameters the config's model has (double: a typo such as
// model.d_model=10000000 must not overflow).
double estimated_parameters(const Config& config);

// Throws a config error naming the model keys when the float32 parameters and gradients alone
// exceed `memory_bytes` (default: this machine's physical memory), instead of a bare
// std::bad_alloc later.
void check_model_fits_memory(const Config& config, double memory_bytes = 0);

// A fresh start (checkpoint.resume empty, or auto with no checkpoint in checkpoint.dir) into
// folders that hold another run's step_* checkpoints or metrics.jsonl would mix two runs (the
// metrics file cut, the old checkpoints left beside the new ones, rotation deleting new ones as
// older). Refused naming the folder and the choices, unless checkpoint.overwrite is true: then
// those checkpoints and the metrics file are deleted first. Call on one rank, holding the run
// lock.
void prepare_fresh_start(const Config& config);

// The files a run writes in its folders (log.txt, config.yaml, metrics.jsonl, .engine.lock) must
// not be symbolic links or other than regular files where they exist: refused naming the file,
// on rank 0 before any work (each is opened without following links too, open_run_file).
void check_run_files(const Config& config);

}  // namespace engine
