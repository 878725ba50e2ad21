// The model's parameters and gradients on the device, llm.c style: each in one flat buffer with a
// view per parameter of the ParamTable (ZeRO stage 3 frees the buffers and rebinds the views
// layer by layer), and in bf16 precision a bf16 copy of each matmul weight, remade after the
// parameters change. The layers read parameters and accumulate gradients only through here.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "model/linear.h"
#include "model/param_table.h"

namespace model {

// The index of a parameter the architecture does not have.
inline constexpr size_t kNoParam = std::numeric_limits<size_t>::max();

class ParamStore {
 public:
  ParamStore(const ModelConfig& config, core::Backend& backend);

  const ParamTable& table() const { return table_; }
  const core::Tensor& params() const { return params_; }
  const core::Tensor& grads() const { return grads_; }
  core::Tensor param(size_t i) const { return param_view_.at(i); }
  core::Tensor grad(size_t i) const { return grad_view_.at(i); }

  // Parameter `name`'s index; throws core::Error naming it when absent (find: kNoParam).
  size_t index(const std::string& name) const;
  size_t find(const std::string& name) const;

  // Parameter i's values and gradient on the device (null for kNoParam); throw naming it while
  // unbound.
  const float* value(size_t i) const;
  float* grad_of(size_t i) const;
  // Parameter i as a GEMM operand: in bf16 precision with its bf16 copy (remade first if stale)
  // when use_in_bf16_gemm(i) was said.
  Operand weight(size_t i);
  // Marks parameter i a matmul weight whose GEMMs run in bf16 in bf16 precision.
  void use_in_bf16_gemm(size_t i);

  void release_storage();
  void bind_param(size_t i, core::Tensor value);
  void bind_grad(size_t i, core::Tensor grad);
  void init_weights(uint64_t seed);
  void params_updated();
  void zero_grad();

 private:
  ParamTable table_;
  core::Backend& backend_;
  bool bf16_;
  core::Tensor params_;
  core::Tensor grads_;
  std::vector<core::Tensor> param_view_;
  std::vector<core::Tensor> grad_view_;
  // bf16 precision: the bf16 copy of each matmul weight (undefined for the others, and until
  // first used), and whether it matches the parameter's current values.
  std::vector<bool> has_bf16_copy_;
  std::vector<core::Tensor> bf16_copy_;
  std::vector<bool> bf16_copy_fresh_;
};

}  // namespace model
