#include "engine/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/check.h"

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

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

}  // namespace

std::string to_json(const StepRecord& r) {
  std::string s = "{\"step\":" + std::to_string(r.step);
  if (r.train_loss) s += ",\"train_loss\":" + json_number(*r.train_loss);
  if (r.val_loss) s += ",\"val_loss\":" + json_number(*r.val_loss);
  s += ",\"lr\":" + json_number(r.lr);
  s += ",\"grad_norm\":" + json_number(r.grad_norm);
  s += ",\"tokens\":" + std::to_string(r.tokens);
  s += ",\"elapsed_ms\":" + json_number(r.train_time_ms);
  s += ",\"step_ms\":" + json_number(r.step_ms);
  s += ",\"tokens_per_s\":" + json_number(r.tokens_per_s);
  s += ",\"gflops\":" + json_number(r.gflops);
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
  std::vector<std::string> kept;
  if (keep_through_step >= 0) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      int64_t step = json_line_step(line);
      if (step >= 0 && step <= keep_through_step) kept.push_back(line);
    }
  }
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  out_.open(path, std::ios::trunc);
  ENGINE_CHECK(out_.good(), "cannot write the metrics file " + path);
  for (const auto& line : kept)
    out_ << line << '\n';
  out_.flush();
}

void MetricsWriter::write(const StepRecord& record) {
  out_ << to_json(record) << '\n';
  out_.flush();
  ENGINE_CHECK(out_.good(), "writing the metrics file " + path_ + " failed");
}

}  // namespace engine
