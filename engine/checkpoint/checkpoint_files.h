// Checkpoints: a directory per step, one safetensors file per rank, a manifest written last.
//
//   <root>/step_00000120/
//     rank_00000.safetensors   this rank's slices (parameters, optimizer state), F32
//     rank_00001.safetensors
//     manifest.yaml            step, world size, effective config, trainer state (data
//                              position, RNG), every file's size and FNV-1a 64 checksum, and
//                              every slice's place in its global tensor
//
// Writing: rank 0 creates <root>/step_XXXXXXXX.tmp, every rank writes its file there, rank 0
// checksums them, writes the manifest and renames the folder to its final name; an interrupted
// write leaves only a .tmp folder, never a half-written step_ folder, and the older checkpoints
// stay until the new one is complete (then the oldest beyond `keep`, except with `keep_best` the
// one with the lowest validation loss, are renamed to step_XXXXXXXX.old and removed, so a
// removal cut short leaves no half-removed step_ folder; leftover .tmp and .old folders go too).
//
// A slice is the index range [begin, end) along one dimension `dim` of a global tensor (Shard
// placements) or the whole tensor (begin 0, end = the dimension). Reading assembles any range
// from whichever files hold it, so a run resumes on a different world size.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"

namespace engine {

// FNV-1a 64 of a byte range (continuing from `hash`) and of a whole file.
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t fnv1a64(const void* data, size_t bytes, uint64_t hash = kFnvOffset);
uint64_t fnv1a64_file(const std::string& path);

// One slice a rank saves: `local` holds indices [begin, begin + local.size(dim)) along `dim` of
// a tensor of `global_shape` (all other dimensions whole).
struct SavedSlice {
  std::string name;
  core::Shape global_shape;
  int dim = 0;
  int64_t begin = 0;
  core::Tensor local;
};

struct SliceInfo {
  std::string name;
  core::Shape global_shape;
  int dim = 0;
  int64_t begin = 0;
  int64_t end = 0;
  std::string file;
};

struct FileInfo {
  std::string file;  // name inside the checkpoint folder
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

// The manifest state key of the validation loss measured at the step a checkpoint was saved
// (absent when that step had no evaluation).
inline constexpr const char* kValLossKey = "train.val_loss";

struct Manifest {
  int64_t step = 0;
  int world_size = 1;
  std::string config_yaml;                   // the effective config of the run that saved it
  std::map<std::string, std::string> state;  // data position, RNG states, counters
  std::map<std::string, int64_t> counters;   // integer state saved by the ranks (merged)
  std::vector<FileInfo> files;
  std::vector<SliceInfo> slices;
};

std::string checkpoint_dir_name(int64_t step);  // "step_00000120"
std::string rank_file_name(int rank);           // "rank_00003.safetensors"

// ---- writing (collective protocol driven by the trainer) ----------------------------------------
// Rank 0, first: removes a stale staging folder of this step and creates it; returns its path.
std::string prepare_staging(const std::string& root, int64_t step);
std::string staging_path(const std::string& root, int64_t step);
// Every rank, after prepare_staging (and a barrier): writes its slices and integer counters
// (e.g. optimizer step counts) to its file.
void write_rank_file(const std::string& staging, int rank, const std::vector<SavedSlice>& slices,
                     const std::map<std::string, int64_t>& counters = {});
// Rank 0, after every rank wrote (a barrier): checksums the files, collects their slices and
// counters, writes the manifest, renames the folder to its final name (replacing an older
// checkpoint of the same step) and prunes all but the newest `keep`; with `keep_best` the
// checkpoint whose manifest records the lowest validation loss (kValLossKey; the oldest of
// equals) is kept besides them. `manifest.files` and `.slices` are filled here. Returns the final
// path.
std::string commit_checkpoint(const std::string& root, Manifest manifest, int keep,
                              bool keep_best = false);

// ---- reading ------------------------------------------------------------------------------------
// Complete checkpoint folders under root (step_XXXXXXXX with a manifest), oldest first.
std::vector<std::string> list_checkpoints(const std::string& root);
// Parses the manifest of a checkpoint folder; throws naming the file on any problem.
Manifest read_manifest(const std::string& dir);
// Checks that every file of the manifest exists with its size and checksum; throws naming the
// first file that does not match.
void verify_checkpoint(const std::string& dir);
// step_XXXXXXXX folders under root without a manifest (no checkpoint: list_checkpoints passes
// them over), oldest first.
std::vector<std::string> incomplete_checkpoints(const std::string& root);
// The checkpoint to resume from: "" -> "" (fresh start); "auto" -> the newest complete checkpoint
// under root (warning of each step folder without a manifest it passes over), or "" when there
// is none; anything else is a checkpoint path. The chosen one is verified (files and tensor
// headers); a corrupt or incomplete one is refused with resume_refusal.
std::string resolve_resume(const std::string& root, const std::string& resume);
// The one line refusing a damaged checkpoint `chosen`: "cannot resume from CHOSEN: REASON; the
// next older checkpoint is DIR (resume from it with --set checkpoint.resume=DIR)", or "; there is
// no older checkpoint in ROOT".
std::string resume_refusal(const std::string& root, const std::string& chosen,
                           const std::string& reason);

class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);  // verifies first
  ~CheckpointReader();
  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const;
  const core::Shape& global_shape(const std::string& name) const;
  // Fills `out` (host f32, contiguous) with indices [begin, begin + out.size(dim)) along `dim`
  // of tensor `name`; every other dimension must be whole. Throws naming the tensor when the
  // shapes disagree or the saved slices do not cover the range.
  void read(const std::string& name, int dim, int64_t begin, const core::Tensor& out) const;
  // The whole tensor.
  core::Tensor read_full(const std::string& name) const;

 private:
  const core::SafetensorsReader& reader(const std::string& file) const;
  std::string dir_;
  Manifest manifest_;
  std::map<std::string, std::vector<const SliceInfo*>> by_name_;
  mutable std::map<std::string, std::unique_ptr<core::SafetensorsReader>> readers_;
};

}  // namespace engine
