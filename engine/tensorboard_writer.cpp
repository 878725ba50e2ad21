#include "engine/tensorboard_writer.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/output_file.h"

namespace engine {

namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[i] = c;
  }
  return table;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out += static_cast<char>((v >> (8 * i)) & 0xffu);
}

// Protobuf: a varint, a field's key (number << 3 | wire type), a length-delimited field.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7fu) | 0x80u);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
template <typename T>
uint64_t bits_of(T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  if constexpr (sizeof(T) == 4) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return b;
  } else {
    uint64_t b;
    std::memcpy(&b, &v, 8);
    return b;
  }
}

// Event's fields 1 (wall_time, fixed64 double) and 2 (step, varint int64).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, 1);
  put_le(e, bits_of(wall_time), 8);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  uint32_t c = 0xffffffffu;
  for (const char b : bytes)
    c = table[(c ^ static_cast<uint8_t>(b)) & 0xffu] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string length;
  put_le(length, data.size(), 8);
  std::string out = length;
  put_le(out, masked_crc32c(length), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_key(v, 2, 5);  // simple_value: fixed32 float
    put_le(v, bits_of(static_cast<float>(value)), 4);
    put_bytes(summary, 1, v);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const StepRecord& r) {
  std::vector<std::pair<std::string, double>> s;
  if (r.train_loss) s.emplace_back("train/loss", *r.train_loss);
  if (r.val_loss) s.emplace_back("val/loss", *r.val_loss);
  if (!r.train_loss) return s;
  s.emplace_back("train/lr", r.lr);
  for (size_t g = 0; g < r.group_lr.size(); ++g)
    s.emplace_back("lr/group_" + std::to_string(g), r.group_lr[g]);
  s.emplace_back("train/grad_norm", r.grad_norm);
  s.emplace_back("perf/tokens_per_s", r.tokens_per_s);
  s.emplace_back("perf/step_ms", r.step_ms);
  if (r.mfu) s.emplace_back("perf/mfu", *r.mfu);
  constexpr double kMiB = 1 << 20;
  if (r.peak_mem_bytes)
    s.emplace_back("mem/peak_mib", static_cast<double>(*r.peak_mem_bytes) / kMiB);
  if (r.live_mem_bytes)
    s.emplace_back("mem/live_mib", static_cast<double>(*r.live_mem_bytes) / kMiB);
  if (r.comm_wait_ms) s.emplace_back("comm/wait_ms", *r.comm_wait_ms);
  return s;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const double now = now_seconds();
  const std::filesystem::path folder(dir);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  path_ = (folder / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." +
                     host + "." + std::to_string(getpid())))
              .string();
  // Not through a link in the log folder (core::open_output_file: O_NOFOLLOW).
  fd_ =
      core::open_output_file(path_, O_WRONLY | O_CREAT | O_TRUNC, "the log.tensorboard event file");
  ENGINE_CHECK(append(tfrecord(file_version_event(now))),
               "log.tensorboard: cannot write " + path_ + ": " + std::strerror(errno));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

bool TensorBoardWriter::append(const std::string& record) {
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void TensorBoardWriter::write(const StepRecord& record) {
  if (fd_ < 0) return;
  if (append(tfrecord(scalars_event(now_seconds(), record.step, tensorboard_scalars(record)))))
    return;
  // A record cut off at the end is skipped by TensorBoard's reader (its CRC fails).
  spdlog::warn("log.tensorboard: writing {} failed ({}); no more TensorBoard events this run",
               path_, std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
}

}  // namespace engine
