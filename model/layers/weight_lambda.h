// A matmul weight scaled by a learned scalar before its GEMM (record #89's QKV and O lambdas,
// model.qkvo_lambdas: q, k, v from a (l_qkv W_qkv)^T, the output atty (l_o W_o)^T, the record's
// pre-multiplied weights). The scaled copy l W (and in bf16 precision its bf16 copy) is made in a
// scratch shared by the blocks before the forward GEMM and made again before the backward's;
// the weight GEMM's gradient G = d (l W) goes to a zeroed scratch, from which
// d W += l G and d l += <W, G>.
#pragma once

#include <string>

#include "model/layer.h"

namespace model {

class WeightLambda {
 public:
  // `weight` [rows, cols] scaled by element `element` of the vector parameter `lambdas`; the
  // scratch is shared by name (`scratch`) among the weights of the same shape.
  WeightLambda(Context& ctx, size_t weight, size_t lambdas, int element, std::string scratch);
  void plan(ActivationPlan& plan, const Context& ctx);
  // l W as a GEMM operand (made now).
  Operand scaled(Context& ctx);
  // The zeroed scratch the weight GEMM of the backward accumulates d (l W) into.
  float* begin_grad(Context& ctx);
  // d W and d l from that scratch.
  void end_grad(Context& ctx);

 private:
  size_t weight_, lambdas_;
  int element_;
  std::string scratch_;
  int64_t numel_;
  float *scaled_ = nullptr, *grad_ = nullptr;
  core::bf16* scaled_bf16_ = nullptr;
};

}  // namespace model
