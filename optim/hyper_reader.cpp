#include "optim/hyper_reader.h"

#include <cmath>

#include "core/check.h"

namespace optim {

std::string yaml_line(const YAML::Node& node) {
  return "line " + std::to_string(node.Mark().line + 1);
}

HyperReader::HyperReader(YAML::Node node, std::string context)
    : node_(std::move(node)), context_(std::move(context)) {
  if (!node_.IsMap()) fail("", "expected a map of hyperparameters");
}

void HyperReader::fail(const std::string& key, const std::string& message) const {
  YAML::Node at = key.empty() ? node_ : node_[key];
  const YAML::Mark mark = at.IsDefined() ? at.Mark() : node_.Mark();
  ENGINE_FAIL(context_ + ": " + (key.empty() ? "" : "'" + key + "' ") + message + " (line " +
              std::to_string(mark.line + 1) + ")");
}

bool HyperReader::has(const std::string& key) const {
  return node_[key].IsDefined();
}

YAML::Node HyperReader::get(const std::string& key) {
  used_.insert(key);
  YAML::Node v = node_[key];
  if (v.IsDefined() && v.IsNull()) fail(key, "has no value");
  return v;
}

double HyperReader::number(const std::string& key, double fallback) {
  YAML::Node v = get(key);
  if (!v.IsDefined()) return fallback;
  double x = 0;
  if (!v.IsScalar() || !YAML::convert<double>::decode(v, x))
    fail(key, "must be a number, got '" + (v.IsScalar() ? v.Scalar() : std::string("...")) + "'");
  // YAML reads .nan and .inf as numbers; no hyperparameter has a meaning for them.
  if (!std::isfinite(x)) fail(key, "must be a finite number, got '" + v.Scalar() + "'");
  return x;
}

int64_t HyperReader::integer(const std::string& key, int64_t fallback) {
  YAML::Node v = get(key);
  if (!v.IsDefined()) return fallback;
  int64_t x = 0;
  if (!v.IsScalar() || !YAML::convert<int64_t>::decode(v, x))
    fail(key, "must be an integer, got '" + (v.IsScalar() ? v.Scalar() : std::string("...")) + "'");
  return x;
}

bool HyperReader::boolean(const std::string& key, bool fallback) {
  YAML::Node v = get(key);
  if (!v.IsDefined()) return fallback;
  bool x = false;
  if (!v.IsScalar() || !YAML::convert<bool>::decode(v, x))
    fail(key,
         "must be true or false, got '" + (v.IsScalar() ? v.Scalar() : std::string("...")) + "'");
  return x;
}

std::string HyperReader::string(const std::string& key, const std::string& fallback) {
  YAML::Node v = get(key);
  if (!v.IsDefined()) return fallback;
  if (!v.IsScalar()) fail(key, "must be a string");
  return v.Scalar();
}

std::vector<double> HyperReader::numbers(const std::string& key,
                                         const std::vector<double>& fallback) {
  YAML::Node v = get(key);
  if (!v.IsDefined()) return fallback;
  if (!v.IsSequence()) fail(key, "must be a list of numbers");
  std::vector<double> out;
  for (const YAML::Node& item : v) {
    double x = 0;
    if (!item.IsScalar() || !YAML::convert<double>::decode(item, x))
      fail(key, "must be a list of numbers");
    if (!std::isfinite(x))
      fail(key, "must be a list of finite numbers, got '" + item.Scalar() + "'");
    out.push_back(x);
  }
  return out;
}

std::vector<std::string> HyperReader::strings(const std::string& key) {
  YAML::Node v = get(key);
  if (!v.IsDefined()) fail("", "missing '" + key + "'");
  std::vector<std::string> out;
  if (v.IsScalar()) {
    out.push_back(v.Scalar());
  } else if (v.IsSequence()) {
    for (const YAML::Node& item : v) {
      if (!item.IsScalar()) fail(key, "must be a list of strings");
      out.push_back(item.Scalar());
    }
  } else {
    fail(key, "must be a string or a list of strings");
  }
  return out;
}

YAML::Node HyperReader::node(const std::string& key) {
  return get(key);
}

void HyperReader::finish() const {
  for (const auto& kv : node_) {
    const std::string key = kv.first.as<std::string>();
    if (!used_.count(key))
      ENGINE_FAIL(context_ + ": unknown hyperparameter '" + key + "' (line " +
                  std::to_string(kv.first.Mark().line + 1) + ")");
  }
}

bool cautious_weight_decay(HyperReader& reader, bool fallback) {
  const std::string mode = reader.string("weight_decay_mode", fallback ? "cautious" : "decoupled");
  if (mode != "decoupled" && mode != "cautious")
    reader.fail("weight_decay_mode", "must be 'decoupled' or 'cautious'");
  return mode == "cautious";
}

}  // namespace optim
