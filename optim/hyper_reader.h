// HyperReader: strict reading of one YAML map of hyperparameters.
//
// Every getter marks its key as used and checks the type; finish() refuses any key that no
// getter asked for. Errors name the key, what was expected, the context ("optimizer group 2
// (muon)") and the YAML line (node.Mark().line + 1).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace optim {

class HyperReader {
 public:
  HyperReader(YAML::Node node, std::string context);

  bool has(const std::string& key) const;
  double number(const std::string& key, double fallback);
  int64_t integer(const std::string& key, int64_t fallback);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key, const std::string& fallback);
  std::vector<double> numbers(const std::string& key, const std::vector<double>& fallback);
  std::vector<std::string> strings(const std::string& key);  // required, a string or a list
  // The raw node of a nested value (undefined when absent); marks the key as used.
  YAML::Node node(const std::string& key);
  // Marks a key as used without reading it (keys handled by someone else).
  void skip(const std::string& key) { used_.insert(key); }

  // Throws naming every key that no getter used.
  void finish() const;

  // "<context>: <message> (line N)" for a key, or for the map itself when key is empty.
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  const std::string& context() const { return context_; }
  int line() const { return node_.Mark().line + 1; }

 private:
  YAML::Node get(const std::string& key);
  YAML::Node node_;
  std::string context_;
  std::set<std::string> used_;
};

// "line N" of a node, for messages.
std::string yaml_line(const YAML::Node& node);

// The key weight_decay_mode (decoupled | cautious) that AdamW and Muon share: whether it says
// cautious (`fallback` when absent).
bool cautious_weight_decay(HyperReader& reader, bool fallback);

}  // namespace optim
