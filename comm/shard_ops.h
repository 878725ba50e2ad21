// The data movement of a ShardingPlan: gradients to their placement, updated parameters back to
// full tensors, and full tensors to and from local parts.
//
// Tensors are f32, contiguous, on the communicator's device. "full" has the parameter's shape on
// every rank; "local" has plan.local_shape(i) (it may have zero elements, or be undefined when
// this rank holds nothing). A local part may be a view into the full tensor (a Shard(0) slice or
// the whole tensor): the operations detect that and skip the copy.
// Shard(d) with d > 0 whose parts are not contiguous blocks is packed into rank order through a
// scratch buffer from the full tensor's allocator.
#pragma once

#include <memory>
#include <span>

#include "comm/communicator.h"
#include "comm/sharding_plan.h"
#include "core/tensor.h"

namespace comm {

// Reduce this rank's full gradient of parameter i to its placement, leaving the reduced local
// part in local_grad (op Avg: the data-parallel mean). Replicate and stages 0-1: all_reduce of
// full_grad in place, then a copy of the own part; stages 2-3: one reduce_scatter (Owned: the
// owner receives everything), full_grad is left unchanged.
std::unique_ptr<Work> reduce_grad_async(Communicator& comm, const ShardingPlan& plan, size_t i,
                                        const core::Tensor& full_grad,
                                        const core::Tensor& local_grad,
                                        ReduceOp op = ReduceOp::Avg);
void reduce_grad(Communicator& comm, const ShardingPlan& plan, size_t i,
                 const core::Tensor& full_grad, const core::Tensor& local_grad,
                 ReduceOp op = ReduceOp::Avg);

// The same for several parameters at once (a bucket), full_grads and local_grads indexed by
// parameter. Where reduce_grad would all-reduce (stages 0-1, Replicate), parameters listed one
// after the other whose full gradients lie back to back in memory share one all_reduce over
// that span; every other parameter has its own reduction.
std::unique_ptr<Work> reduce_grads_async(Communicator& comm, const ShardingPlan& plan,
                                         std::span<const size_t> params,
                                         std::span<const core::Tensor> full_grads,
                                         std::span<const core::Tensor> local_grads,
                                         ReduceOp op = ReduceOp::Avg);

// reduce_grad for a gradient that is zero outside a few rows (an embedding's: only the rows of
// the tokens seen), blocking: the ranks agree on the union of their nonzero rows (an all_reduce
// Max of a per-row flag, one float per row along dim 0) and all-reduce only those rows, packed;
// local_grad gets this rank's part of the result (zero elsewhere). Falls back to reduce_grad
// when the union holds more than max_fraction of the rows. Returns the number of rows reduced.
// CPU tensors only. The parameter must be Shard(0), Owned or Replicate (parts are blocks of rows).
// The result
// equals reduce_grad's up to the order of the sum over ranks (exactly at 2 ranks).
int64_t reduce_sparse_rows(Communicator& comm, const ShardingPlan& plan, size_t i,
                           const core::Tensor& full_grad, const core::Tensor& local_grad,
                           ReduceOp op = ReduceOp::Avg, double max_fraction = 0.25);

// Full parameter on every rank from every rank's local part: one all_gather (Replicate: a local
// copy, every rank updated the whole tensor). Also the way to gather a full tensor at any stage.
std::unique_ptr<Work> all_gather_param_async(Communicator& comm, const ShardingPlan& plan, size_t i,
                                             const core::Tensor& local, const core::Tensor& full);
void all_gather_param(Communicator& comm, const ShardingPlan& plan, size_t i,
                      const core::Tensor& local, const core::Tensor& full);

// Copy this rank's part of a full tensor known on this rank (no communication).
void copy_local_part(Communicator& comm, const ShardingPlan& plan, size_t i,
                     const core::Tensor& full, const core::Tensor& local);

}  // namespace comm
