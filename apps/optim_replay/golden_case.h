// A golden optimizer trajectory (tests/fixtures/golden/<optimizer>/<case>.safetensors) and its
// replay through the optimizers of the registry, on one rank or many.
//
// The file's metadata names the reference optimizer and its hyperparameters in the reference's
// terms; kHyperparameterMap (golden_case.cpp) is the one table translating them into optimizer
// groups of our YAML schema. Replay: start from init/*, feed grad/t/* (already averaged) to the
// placement each optimizer asks for, step, gather full parameters and compare with param/t/*.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/sharding_plan.h"
#include "core/safetensors.h"
#include "optim/optimizer_set.h"

namespace replay {

struct GoldenCase {
  std::string path;
  std::string reference_optimizer;  // metadata "optimizer"
  int64_t steps = 0;
  double suggested_atol = 0;
  std::vector<comm::ParamDesc> params;  // from init/*, in file order
  // Optimizer runs: the groups for OptimizerSet. Orthogonaliser files: the orthogonaliser
  // ("ns5" | "polar_express") applied once to each init/* tensor.
  YAML::Node groups;
  std::string orthogonalizer;
  std::shared_ptr<core::SafetensorsReader> file;
};

// Reads and translates a golden file. `optimizer` (non-empty) replaces the registry name the
// file maps to; `sets` ("key=value", value in YAML) are applied to every group afterwards.
GoldenCase load_golden(const std::string& path, const std::string& optimizer = "",
                       const std::vector<std::string>& sets = {});

// Keeps only the first `steps` steps (0: all), with the tolerance the golden README defines,
// max(1e-6, 10 x the float32-vs-float64 difference), over those steps when the file lists it
// per step (stacked_soap_3d_rect_stack is tight at step 1 only).
void truncate_steps(GoldenCase& golden, int64_t steps);

struct Difference {
  int64_t step = 0;
  std::string param;
  double max_abs = 0;  // max |ours - reference|; +infinity when a value is not finite
  double max_rel = 0;  // max_abs / max |reference|; +infinity when a value is not finite
};

// The largest difference of a replay (the first of equal ones; +infinity, i.e. a non-finite
// parameter, beats everything) and the pass rule: worst.max_abs <= atol, false for infinity.
Difference worst_difference(const std::vector<Difference>& diffs);
bool passes(const Difference& worst, double atol);

// Replays a case over `comm` (every rank calls every method).
class Replayer {
 public:
  Replayer(const GoldenCase& golden, comm::Communicator& comm);

  // Takes step t (1-based) and returns the differences of the full parameters after it.
  std::vector<Difference> step(int64_t t);
  // All steps; the differences of every step and parameter.
  std::vector<Difference> run();

  optim::OptimizerSet& optimizers() { return *set_; }
  const comm::ShardingPlan& plan() const { return *plan_; }
  // The full current value of a parameter (identical on every rank after a step).
  const core::Tensor& full(const std::string& name) const;
  // Replaces the current parameters (every rank passes the same full values).
  void set_full(const std::string& name, const core::Tensor& value);

 private:
  const GoldenCase& golden_;
  comm::Communicator& comm_;
  std::unique_ptr<optim::OptimizerSet> set_;
  std::unique_ptr<comm::ShardingPlan> plan_;
  std::vector<core::Tensor> full_;   // per parameter, full value
  std::vector<core::Tensor> local_;  // per parameter, this rank's part
};

// Writes optimizer state to / reads it from a safetensors file (counters as metadata
// "counter:<key>"), the way a checkpoint stores it.
void save_state(const optim::OptimizerState& state, const std::string& path);
optim::OptimizerState load_state(const std::string& path);

}  // namespace replay
