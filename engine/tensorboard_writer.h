// TensorBoardWriter: the console's scalars as a TensorBoard event file,
// <log.dir>/events.out.tfevents.<seconds>.<host>.<pid> (log.tensorboard; rank 0), so that
// `tensorboard --logdir runs/` compares runs.
//
// The file is a sequence of TFRecords, each: the data's length (u64, little-endian), the masked
// CRC32C of those 8 bytes (u32), the data, the masked CRC32C of the data (u32); masked(c) =
// ((c >> 15) | (c << 17)) + 0xa282ead8. Each record's data is a protobuf Event message encoded
// here by hand: wall_time (field 1, double), step (2, int64), and either file_version (3,
// string: "brain.Event:2", the first record) or summary (5, a Summary: repeated value (1), each
// a Value with tag (1, string) and simple_value (2, float)).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/metrics.h"

namespace engine {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) and TFRecord's masking of it.
uint32_t crc32c(std::string_view bytes);
uint32_t masked_crc32c(std::string_view bytes);
// One TFRecord holding `data`.
std::string tfrecord(std::string_view data);
// Encoded Event messages.
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars);

// A step's scalars as the console shows them: train/loss, val/loss, lr/group_<g> (and train/lr,
// the first group's), train/grad_norm, perf/tokens_per_s, perf/step_ms, perf/mfu, mem/peak_mib,
// mem/live_mib, comm/wait_ms; of a record without a train loss (the evaluation before step 1)
// only val/loss.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const StepRecord& record);

class TensorBoardWriter {
 public:
  // Creates a new event file in `dir` (created if missing) and writes its file_version record;
  // throws naming the file when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends the record's scalars (tensorboard_scalars) as one event. A write that fails (a full
  // disk) warns once naming the file and ends the writing; the run goes on.
  void write(const StepRecord& record);
  const std::string& path() const { return path_; }

 private:
  bool append(const std::string& record);

  std::string path_;
  int fd_ = -1;
};

}  // namespace engine
