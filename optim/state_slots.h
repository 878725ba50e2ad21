// StateSlots: the per-parameter state of an optimizer, each slot declared once.
//
// Tensors are kept as "<param>/<slot>" and integer counters as "<param>/<counter>" (the keys of
// OptimizerState, so a checkpoint stores them sharded like the parameters). The declared names
// drive creation, shape validation, save and load: an undeclared name in a loaded state is an
// error naming the optimizer and the key, as is a loaded tensor whose shape does not fit.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace optim {

class StateSlots {
 public:
  StateSlots(std::string owner, std::vector<std::string> tensor_slots,
             std::vector<std::string> counter_slots);

  // The tensor `slot` of `param`, shaped `shape`. Created zero-filled on first use (`created`,
  // when given, says so); an existing (loaded) one must have that shape.
  core::Tensor& tensor(const std::string& param, const std::string& slot, const core::Shape& shape,
                       core::Backend& backend, bool* created = nullptr);
  // The counter `name` of `param`, 0 on first use.
  int64_t& counter(const std::string& param, const std::string& name);

  void save(OptimizerState& out) const;
  // Replaces every slot with the ones of `in` (keys "<param>/<declared name>").
  void load(const OptimizerState& in);

 private:
  void check_declared(const std::string& key, const std::vector<std::string>& names,
                      const char* what) const;

  std::string owner_;
  std::vector<std::string> tensor_slots_;
  std::vector<std::string> counter_slots_;
  std::map<std::string, core::Tensor> tensors_;
  std::map<std::string, int64_t> counters_;
};

}  // namespace optim
