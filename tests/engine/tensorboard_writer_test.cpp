// The TensorBoard event file's pieces: CRC-32C against its check value and a second known vector,
// the TFRecord framing, the hand-encoded Event bytes, the scalars of a step, and the file on disk.
// (tests/e2e/instruments.py reads a run's file with an independent protobuf decoder.)
#include "engine/tensorboard_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

namespace {

uint32_t u32_at(const std::string& s, size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

TEST(TensorBoard, Crc32cKnownValues) {
  EXPECT_EQ(engine::crc32c("123456789"), 0xe3069283u);            // the CRC-32C check value
  EXPECT_EQ(engine::crc32c(std::string(32, '\0')), 0x8a9136aau);  // RFC 3720 B.4: 32 zero bytes
  EXPECT_EQ(engine::crc32c(""), 0u);
  const uint32_t c = engine::crc32c("abc");
  EXPECT_EQ(engine::masked_crc32c("abc"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, RecordFraming) {
  const std::string data = "hello event";
  const std::string rec = engine::tfrecord(data);
  ASSERT_EQ(rec.size(), 8 + 4 + data.size() + 4);
  uint64_t length = 0;
  std::memcpy(&length, rec.data(), 8);
  EXPECT_EQ(length, data.size());
  EXPECT_EQ(u32_at(rec, 8), engine::masked_crc32c(rec.substr(0, 8)));
  EXPECT_EQ(rec.substr(12, data.size()), data);
  EXPECT_EQ(u32_at(rec, 12 + data.size()), engine::masked_crc32c(data));
}

TEST(TensorBoard, EventBytes) {
  // wall_time 1.0 (field 1, fixed64), step 3 (field 2, varint), summary (field 5) with one value:
  // tag "a" (field 1), simple_value 2.0f (field 2, fixed32).
  const std::string e = engine::scalars_event(1.0, 3, {{"a", 2.0}});
  const std::string expected(
      "\x09\x00\x00\x00\x00\x00\x00\xf0\x3f"
      "\x10\x03"
      "\x2a\x0a\x0a\x08\x0a\x01\x61\x15\x00\x00\x00\x40",
      23);
  EXPECT_EQ(e, expected);
  const std::string v = engine::file_version_event(0.0);
  EXPECT_NE(v.find("\x1a\x0d"
                   "brain.Event:2"),
            std::string::npos);
}

TEST(TensorBoard, ScalarsOfAStep) {
  engine::StepRecord r;
  r.step = 0;
  r.val_loss = 5.5;
  auto s = engine::tensorboard_scalars(r);  // the evaluation before step 1
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].first, "val/loss");
  r.step = 4;
  r.train_loss = 4.0;
  r.lr = 0.1;
  r.group_lr = {0.1, 0.2};
  r.peak_mem_bytes = 3 << 20;
  r.comm_wait_ms = 1.5;
  std::map<std::string, double> m;
  for (const auto& [tag, v] : engine::tensorboard_scalars(r))
    m[tag] = v;
  EXPECT_EQ(m.at("train/loss"), 4.0);
  EXPECT_EQ(m.at("lr/group_1"), 0.2);
  EXPECT_EQ(m.at("mem/peak_mib"), 3.0);
  EXPECT_EQ(m.at("comm/wait_ms"), 1.5);
  EXPECT_EQ(m.count("perf/mfu"), 0u);  // no peak known
  EXPECT_EQ(m.count("mem/live_mib"), 0u);
}

TEST(TensorBoard, WriterFileStartsWithTheVersionRecord) {
  const auto dir = std::filesystem::temp_directory_path() / "engine_tensorboard_test";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    engine::TensorBoardWriter writer(dir.string());
    path = writer.path();
    engine::StepRecord r;
    r.step = 1;
    r.train_loss = 3.0;
    writer.write(r);
  }
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t first = 0;
  std::memcpy(&first, bytes.data(), 8);
  const size_t second = 16 + first;
  ASSERT_GT(bytes.size(), second + 16);
  EXPECT_NE(bytes.substr(12, first).find("brain.Event:2"), std::string::npos);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data() + second, 8);
  EXPECT_EQ(bytes.size(), second + 16 + length);
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
