// Registry: optimizer name -> factory building it from a strict YAML map of hyperparameters.
//
// The built-in names are registry.cpp's (Registry::global().names(); an unknown name in a config
// lists them). Each optimizer's keys and their defaults are its config struct's, read by its
// from_yaml (AdamWConfig in optim/adamw/adamw.h, MuonConfig in optim/muon/muon.h, SoapConfig in
// optim/soap/soap.h, ...); every group also has `params`, `optimizer` and `optional`, and any
// other key is an error naming it and its line.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optim/hyper_reader.h"
#include "optim/optimizer.h"

namespace optim {

// Reads its hyperparameters from the reader (every key it accepts); the registry then refuses
// whatever key was left unread.
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(HyperReader&)>;

class Registry {
 public:
  // The process-wide registry holding the built-in optimizers.
  static Registry& global();

  void add(const std::string& name, OptimizerFactory factory);
  bool contains(const std::string& name) const { return factories_.count(name) != 0; }
  std::vector<std::string> names() const;

  // Builds `name`; an unknown name lists the known ones, an unknown or mistyped
  // hyperparameter names the key and line (reader.context() says where).
  std::unique_ptr<Optimizer> create(const std::string& name, HyperReader& reader) const;

 private:
  std::map<std::string, OptimizerFactory> factories_;
};

}  // namespace optim
