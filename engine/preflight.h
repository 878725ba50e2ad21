// Checks made before a training run touches anything: does the configured model fit this
// machine's memory, and would a fresh start mix with an earlier run's output?
#pragma once

#include <cstdint>
#include <string>

#include "engine/config.h"

namespace engine {

// Roughly how many parameters the config's model has (double: a typo such as
// model.d_model=10000000 must not overflow).
double estimated_parameters(const Config& config);

// Throws a config error naming the model keys when the float32 parameters and gradients alone
// exceed `memory_bytes` (default: this machine's physical memory), instead of a bare
// std::bad_alloc later.
void check_model_fits_memory(const Config& config, double memory_bytes = 0);

// Creates log.dir and checkpoint.dir (with their parents) where they do not exist; a folder that
// cannot be created or written (a read-only parent, a file in the way, a working folder deleted
// under the run) is refused as a config error naming the key, where it was set and the reason,
// before any rank waits on another. Every rank of a training run calls it.
void prepare_run_folders(const Config& config);

// A fresh start (checkpoint.resume empty, or auto with no checkpoint in checkpoint.dir) into
// folders that hold another run's step_* checkpoints or metrics.jsonl would mix two runs (the
// metrics file cut, the old checkpoints left beside the new ones, rotation deleting new ones as
// older). Refused naming the folder and the choices, unless checkpoint.overwrite is true: then
// those checkpoints, the metrics file and the TensorBoard event files (log.tensorboard) are
// deleted first. Call on one rank, holding the run
// lock.
void prepare_fresh_start(const Config& config);

// A resume from checkpoint `resume` at step `from` while checkpoint.dir holds newer ones: the
// run's saves would replace those of the same steps and its rotation would delete its own as the
// oldest. Refused naming them and the choices, unless checkpoint.overwrite is true: then the newer
// checkpoints are deleted, with a warning naming them. Call on one rank, holding the run lock,
// once the checkpoint passed every other check (a refused resume deletes nothing).
void prepare_resume_from_older(const Config& config, const std::string& resume, int64_t from);

// The files a run writes in its folders (log.txt, config.yaml, metrics.jsonl, trace.json with
// log.trace, .engine.lock) must not be symbolic links or other than regular files where they
// exist (a character device for the files written in place): refused naming the file, on rank 0
// before any work (each writer checks again as it writes: core/output_file.h).
void check_run_files(const Config& config);

}  // namespace engine
