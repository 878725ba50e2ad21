#include "engine/metrics.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/check.h"
#include "core/output_file.h"

namespace engine {

namespace {

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Writes all of `bytes` to fd; "" or the reason it could not (strerror).
std::string write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::strerror(errno);
    if (n == 0) return "no progress";
    done += static_cast<size_t>(n);
  }
  return "";
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

}  // namespace

std::string to_json(const StepRecord& r) {
  std::string s = "{\"step\":" + std::to_string(r.step);
  if (r.engine_version) s += ",\"engine\":" + json_string(*r.engine_version);
  if (r.engine_commit) s += ",\"commit\":" + json_string(*r.engine_commit);
  if (r.train_loss) s += ",\"train_loss\":" + json_number(*r.train_loss);
  if (r.val_loss) s += ",\"val_loss\":" + json_number(*r.val_loss);
  s += ",\"lr\":" + json_number(r.lr);
  if (!r.group_lr.empty()) {
    s += ",\"group_lr\":[";
    for (size_t i = 0; i < r.group_lr.size(); ++i) {
      if (i) s += ",";
      s += json_number(r.group_lr[i]);
    }
    s += "]";
  }
  s += ",\"grad_norm\":" + json_number(r.grad_norm);
  s += ",\"tokens\":" + std::to_string(r.tokens);
  s += ",\"elapsed_ms\":" + json_number(r.train_time_ms);
  s += ",\"step_ms\":" + json_number(r.step_ms);
  s += ",\"tokens_per_s\":" + json_number(r.tokens_per_s);
  s += ",\"gflops\":" + json_number(r.gflops);
  if (r.mfu) s += ",\"mfu\":" + json_number(*r.mfu);
  s += ",\"comm_bytes\":{";
  for (size_t i = 0; i < r.comm_bytes.size(); ++i) {
    if (i) s += ",";
    s += json_string(r.comm_bytes[i].first) + ":" + std::to_string(r.comm_bytes[i].second);
  }
  s += "}";
  if (r.comm_wait_ms) s += ",\"comm_wait_ms\":" + json_number(*r.comm_wait_ms);
  for (const auto& [key, phases] :
       {std::pair{"phase_ms", &r.phase_ms}, std::pair{"device_phase_ms", &r.device_phase_ms}}) {
    if (phases->empty()) continue;
    s += ",\"" + std::string(key) + "\":{";
    for (size_t i = 0; i < phases->size(); ++i) {
      if (i) s += ",";
      s += json_string((*phases)[i].first) + ":" + json_number((*phases)[i].second);
    }
    s += "}";
  }
  if (r.peak_mem_bytes) s += ",\"peak_mem_bytes\":" + std::to_string(*r.peak_mem_bytes);
  if (r.live_mem_bytes) s += ",\"live_mem_bytes\":" + std::to_string(*r.live_mem_bytes);
  if (!r.moe_expert_rows.empty()) {
    s += ",\"moe_expert_rows\":[";
    for (size_t i = 0; i < r.moe_expert_rows.size(); ++i) {
      if (i) s += ",";
      s += std::to_string(r.moe_expert_rows[i]);
    }
    s += "]";
  }
  return s + "}";
}

int64_t json_line_step(const std::string& line) {
  const std::string key = "\"step\":";
  auto p = line.find(key);
  if (p == std::string::npos) return -1;
  int64_t step = -1;
  const char* first = line.data() + p + key.size();
  auto res = std::from_chars(first, line.data() + line.size(), step);
  return res.ec == std::errc() ? step : -1;
}

std::string format_val_line(int64_t step, int64_t total, double val_loss, double train_time_ms) {
  double avg = train_time_ms / static_cast<double>(std::max<int64_t>(step, 1));
  return "step:" + std::to_string(step) + "/" + std::to_string(total) +
         " val_loss:" + fmt("%.4f", val_loss) + " train_time:" + fmt("%.0f", train_time_ms) +
         "ms step_avg:" + fmt("%.2f", avg) + "ms";
}

std::string format_train_line(int64_t step, int64_t total, double train_loss, double train_time_ms,
                              double lr, double tokens_per_s) {
  double avg = train_time_ms / static_cast<double>(std::max<int64_t>(step, 1));
  return "step:" + std::to_string(step) + "/" + std::to_string(total) +
         " train_loss:" + fmt("%.4f", train_loss) + " train_time:" + fmt("%.0f", train_time_ms) +
         "ms step_avg:" + fmt("%.2f", avg) + "ms lr:" + fmt("%.1e", lr) +
         " tok/s:" + fmt("%.0f", tokens_per_s);
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t keep_through_step) : path_(path) {
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  // Opened before it is read, and not through a link: a metrics.jsonl planted as a link to a
  // file outside the log folder was read and then replaced.
  fd_ = core::open_output_file(path, O_RDWR | O_CREAT | (keep_through_step < 0 ? O_TRUNC : 0),
                               "the metrics file");
  std::string kept;
  if (keep_through_step >= 0) {
    std::string text;
    char buf[1 << 16];
    for (ssize_t n; (n = ::read(fd_, buf, sizeof(buf))) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const std::string why = std::strerror(errno);
        ::close(fd_);
        fd_ = -1;
        ENGINE_FAIL("cannot read the metrics file " + path + ": " + why);
      }
      text.append(buf, static_cast<size_t>(n));
    }
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      // A whole record ends its line with '}'; anything else was cut off mid-write.
      const int64_t step = json_line_step(line);
      if (step >= 0 && step <= keep_through_step && !line.empty() && line.back() == '}')
        kept += line + '\n';
    }
  }
  std::string why;
  if (keep_through_step >= 0 && (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0))
    why = std::strerror(errno);
  else
    why = write_all(fd_, kept);
  if (!why.empty()) {
    ::close(fd_);
    fd_ = -1;
    ENGINE_FAIL("cannot write the metrics file " + path + ": " + why);
  }
  size_ = static_cast<int64_t>(kept.size());
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const StepRecord& record) {
  if (fd_ < 0) return;
  const std::string line = to_json(record) + '\n';
  const std::string why = write_all(fd_, line);
  if (why.empty()) {
    size_ += static_cast<int64_t>(line.size());
    return;
  }
  // Cut back to the last whole line, so that the file stays valid JSON Lines.
  const bool cut = ::ftruncate(fd_, static_cast<off_t>(size_)) == 0;
  ::close(fd_);
  fd_ = -1;
  spdlog::warn(
      "warning: cannot write the metrics file {} ({}) at step {}: it {}; the run goes on "
      "without it (the console shows every step)",
      path_, why, record.step, cut ? "ends with its last whole line" : "may end mid-line");
}

}  // namespace engine
