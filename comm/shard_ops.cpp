#include "comm/shard_ops.h"

#include <cstring>
#include <string>
#include <vector>

#include "comm/composite_work.h"
#include "core/check.h"

namespace comm {

namespace {

// Parameter i seen as [outer, extent, inner] around its split dimension; rank r's part is
// [outer, range_r, inner]. With outer == 1 the parts are contiguous blocks in rank order.
struct Geometry {
  int64_t outer = 1;
  int64_t extent = 1;
  int64_t inner = 1;
};

Geometry geometry(const ShardingPlan& plan, size_t i) {
  const core::Shape& shape = plan.param(i).shape;
  Geometry g;
  if (shape.empty()) return g;
  const int dim = plan.local_slice(i).dim;
  for (int d = 0; d < dim; ++d)
    g.outer *= shape[d];
  g.extent = shape[dim];
  for (size_t d = dim + 1; d < shape.size(); ++d)
    g.inner *= shape[d];
  return g;
}

bool is_blocked(const ShardingPlan& plan, size_t i) {
  return geometry(plan, i).outer == 1 || plan.numel(i) == 0;
}

std::string where(const Communicator& comm, const ShardingPlan& plan, size_t i, const char* op) {
  return std::string(op) + " of " + plan.param(i).name + " on rank " + std::to_string(comm.rank());
}

void check_tensor(const Communicator& comm, const ShardingPlan& plan, size_t i, const char* op,
                  const char* role, const core::Tensor& t, const core::Shape& expected) {
  if (core::shape_numel(expected) == 0 && !t.defined()) return;
  ENGINE_CHECK(t.defined(), where(comm, plan, i, op) + ": " + role + " tensor is undefined");
  ENGINE_CHECK(t.shape() == expected, where(comm, plan, i, op) + ": " + role + " is " +
                                          core::shape_str(t.shape()) + ", expected " +
                                          core::shape_str(expected));
  ENGINE_CHECK(t.dtype() == core::DType::F32,
               where(comm, plan, i, op) + ": " + role + " must be f32");
  ENGINE_CHECK(t.is_contiguous(), where(comm, plan, i, op) + ": " + role + " must be contiguous");
  ENGINE_CHECK(t.device() == comm.device(), where(comm, plan, i, op) + ": " + role + " is on " +
                                                t.device().str() + ", the communicator on " +
                                                comm.device().str());
}

float* ptr(const core::Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}

// Copies rank r's part between the full layout and a dense [outer, range_r, inner] buffer.
void copy_part(Communicator& comm, const ShardingPlan& plan, size_t i, int r, float* full,
               float* part, bool to_part) {
  const Geometry g = geometry(plan, i);
  const Range range = plan.range(i, r);
  const int64_t run = range.size() * g.inner;
  if (run == 0) return;
  for (int64_t o = 0; o < g.outer; ++o) {
    float* f = full + (o * g.extent + range.begin) * g.inner;
    float* p = part + o * run;
    if (to_part) {
      comm.copy_local(p, f, run * sizeof(float));
    } else {
      comm.copy_local(f, p, run * sizeof(float));
    }
  }
}

// Full layout <-> all ranks' parts concatenated in rank order.
void pack(Communicator& comm, const ShardingPlan& plan, size_t i, float* full, float* packed,
          bool to_packed) {
  int64_t offset = 0;
  for (int r = 0; r < plan.world_size(); ++r) {
    copy_part(comm, plan, i, r, full, packed + offset, to_packed);
    offset += plan.local_numel(i, r);
  }
}

// Whether reduce_grad all-reduces parameter i (and keeps its own part) rather than
// reduce-scattering it.
bool is_all_reduced(const ShardingPlan& plan, size_t i) {
  return plan.placement(i).is_replicate() || plan.stage() <= 1;
}

// After the all-reduce of a full gradient: this rank's part into its local gradient.
void keep_own_part(Communicator& comm, const ShardingPlan& plan, size_t i, float* full,
                   float* local) {
  if (plan.local_numel(i) == 0) return;
  if (plan.placement(i).is_replicate() || is_blocked(plan, i)) {
    const Geometry g = geometry(plan, i);
    const float* own = full + plan.range(i, plan.rank()).begin * g.inner;
    comm.copy_local(local, own, plan.local_numel(i) * sizeof(float));
  } else {
    copy_part(comm, plan, i, plan.rank(), full, local, true);
  }
}

core::Tensor scratch_like(const core::Tensor& full) {
  return core::Tensor::empty(full.shape(), core::DType::F32, full.storage()->allocator());
}

}  // namespace

std::unique_ptr<Work> reduce_grad_async(Communicator& comm, const ShardingPlan& plan, size_t i,
                                        const core::Tensor& full_grad,
                                        const core::Tensor& local_grad, ReduceOp op) {
  const char* kOp = "reduce_grad";
  ENGINE_CHECK(comm.size() == plan.world_size(),
               where(comm, plan, i, kOp) + ": communicator has " + std::to_string(comm.size()) +
                   " ranks, the plan " + std::to_string(plan.world_size()));
  check_tensor(comm, plan, i, kOp, "full gradient", full_grad, plan.param(i).shape);
  check_tensor(comm, plan, i, kOp, "local gradient", local_grad, plan.local_shape(i));
  const int64_t numel = plan.numel(i);
  float* full = ptr(full_grad);
  float* local = ptr(local_grad);

  if (is_all_reduced(plan, i)) {
    // All-reduce everything, then keep the own part.
    auto work = comm.all_reduce_async(full, numel, op);
    return std::make_unique<ThenWork>(std::move(work), [&comm, &plan, i, full, local] {
      keep_own_part(comm, plan, i, full, local);
    });
  }

  ENGINE_CHECK(!local_grad.defined() || local_grad.numel() == 0 ||
                   local_grad.storage() != full_grad.storage(),
               where(comm, plan, i, kOp) +
                   ": at stage >= 2 the local gradient must not share storage with the full one "
                   "(reduce_scatter reads one and writes the other)");
  const std::vector<int64_t>& counts = plan.counts(i);
  if (is_blocked(plan, i)) return comm.reduce_scatter_async(full, local, counts, op);
  core::Tensor packed = scratch_like(full_grad);
  pack(comm, plan, i, full, ptr(packed), true);
  auto work = comm.reduce_scatter_async(ptr(packed), local, counts, op);
  return std::make_unique<ThenWork>(std::move(work), [packed] {});
}

std::unique_ptr<Work> reduce_grads_async(Communicator& comm, const ShardingPlan& plan,
                                         std::span<const size_t> params,
                                         std::span<const core::Tensor> full_grads,
                                         std::span<const core::Tensor> local_grads, ReduceOp op) {
  auto group = std::make_unique<WorkGroup>();
  size_t k = 0;
  while (k < params.size()) {
    const size_t first = params[k];
    // The run of all-reduced parameters whose full gradients continue each other in memory.
    size_t end = k + 1;
    int64_t count = plan.numel(first);
    if (is_all_reduced(plan, first)) {
      while (end < params.size() && is_all_reduced(plan, params[end]) &&
             full_grads[params[end]].defined() && full_grads[first].defined() &&
             ptr(full_grads[params[end]]) == ptr(full_grads[first]) + count) {
        count += plan.numel(params[end]);
        ++end;
      }
    }
    if (end == k + 1) {
      group->add(reduce_grad_async(comm, plan, first, full_grads[first], local_grads[first], op));
      k = end;
      continue;
    }
    std::vector<std::pair<float*, float*>> parts;  // (full, local) of every member
    for (size_t m = k; m < end; ++m) {
      const size_t i = params[m];
      check_tensor(comm, plan, i, "reduce_grads", "full gradient", full_grads[i],
                   plan.param(i).shape);
      check_tensor(comm, plan, i, "reduce_grads", "local gradient", local_grads[i],
                   plan.local_shape(i));
      parts.emplace_back(ptr(full_grads[i]), ptr(local_grads[i]));
    }
    std::vector<size_t> members(params.begin() + k, params.begin() + end);
    auto work = comm.all_reduce_async(ptr(full_grads[first]), count, op);
    group->add(std::make_unique<ThenWork>(
        std::move(work), [&comm, &plan, members = std::move(members), parts = std::move(parts)] {
          for (size_t m = 0; m < members.size(); ++m)
            keep_own_part(comm, plan, members[m], parts[m].first, parts[m].second);
        }));
    k = end;
  }
  return group;
}

int64_t reduce_sparse_rows(Communicator& comm, const ShardingPlan& plan, size_t i,
                           const core::Tensor& full_grad, const core::Tensor& local_grad,
                           ReduceOp op, double max_fraction) {
  const char* kOp = "reduce_sparse_rows";
  check_tensor(comm, plan, i, kOp, "full gradient", full_grad, plan.param(i).shape);
  check_tensor(comm, plan, i, kOp, "local gradient", local_grad, plan.local_shape(i));
  ENGINE_CHECK(comm.device() == core::Device::cpu(),
               where(comm, plan, i, kOp) + ": scans host memory; CPU communicators only");
  ENGINE_CHECK(plan.local_slice(i).dim == 0 && !plan.param(i).shape.empty(),
               where(comm, plan, i, kOp) + ": needs parts that are blocks of rows (dim 0)");
  const int64_t rows = plan.param(i).shape[0];
  const int64_t width = rows == 0 ? 0 : plan.numel(i) / rows;
  const float* full = ptr(full_grad);
  // Rows this rank touched, then the union over ranks.
  std::vector<float> touched(rows, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = full + r * width;
    for (int64_t c = 0; c < width; ++c)
      if (row[c] != 0.0f) {
        touched[r] = 1.0f;
        break;
      }
  }
  comm.all_reduce(touched.data(), rows, ReduceOp::Max);
  std::vector<int64_t> union_rows;
  for (int64_t r = 0; r < rows; ++r)
    if (touched[r] != 0.0f) union_rows.push_back(r);
  if (static_cast<double>(union_rows.size()) > max_fraction * static_cast<double>(rows)) {
    reduce_grad(comm, plan, i, full_grad, local_grad, op);
    return rows;
  }
  const int64_t n = static_cast<int64_t>(union_rows.size());
  std::vector<float> packed(n * width);
  for (int64_t k = 0; k < n; ++k)
    std::memcpy(packed.data() + k * width, full + union_rows[k] * width, width * sizeof(float));
  comm.all_reduce(packed.data(), n * width, op);
  if (!local_grad.defined() || local_grad.numel() == 0) return n;
  const Range own = plan.local_slice(i).range;
  float* local = ptr(local_grad);
  std::memset(local, 0, local_grad.nbytes());
  for (int64_t k = 0; k < n; ++k)
    if (union_rows[k] >= own.begin && union_rows[k] < own.end)
      std::memcpy(local + (union_rows[k] - own.begin) * width, packed.data() + k * width,
                  width * sizeof(float));
  return n;
}

void reduce_grad(Communicator& comm, const ShardingPlan& plan, size_t i,
                 const core::Tensor& full_grad, const core::Tensor& local_grad, ReduceOp op) {
  reduce_grad_async(comm, plan, i, full_grad, local_grad, op)->wait();
}

std::unique_ptr<Work> all_gather_param_async(Communicator& comm, const ShardingPlan& plan, size_t i,
                                             const core::Tensor& local, const core::Tensor& full) {
  const char* kOp = "all_gather_param";
  ENGINE_CHECK(comm.size() == plan.world_size(),
               where(comm, plan, i, kOp) + ": communicator has " + std::to_string(comm.size()) +
                   " ranks, the plan " + std::to_string(plan.world_size()));
  check_tensor(comm, plan, i, kOp, "local part", local, plan.local_shape(i));
  check_tensor(comm, plan, i, kOp, "full tensor", full, plan.param(i).shape);
  if (plan.placement(i).is_replicate()) {
    comm.copy_local(ptr(full), ptr(local), plan.numel(i) * sizeof(float));
    return std::make_unique<DoneWork>();
  }
  const std::vector<int64_t>& counts = plan.counts(i);
  if (is_blocked(plan, i)) return comm.all_gather_async(ptr(local), ptr(full), counts);
  core::Tensor packed = scratch_like(full);
  auto work = comm.all_gather_async(ptr(local), ptr(packed), counts);
  float* full_ptr = ptr(full);
  return std::make_unique<ThenWork>(std::move(work), [&comm, &plan, i, packed, full_ptr] {
    pack(comm, plan, i, full_ptr, ptr(packed), false);
  });
}

void all_gather_param(Communicator& comm, const ShardingPlan& plan, size_t i,
                      const core::Tensor& local, const core::Tensor& full) {
  all_gather_param_async(comm, plan, i, local, full)->wait();
}

void copy_local_part(Communicator& comm, const ShardingPlan& plan, size_t i,
                     const core::Tensor& full, const core::Tensor& local) {
  const char* kOp = "copy_local_part";
  check_tensor(comm, plan, i, kOp, "full tensor", full, plan.param(i).shape);
  check_tensor(comm, plan, i, kOp, "local part", local, plan.local_shape(i));
  copy_part(comm, plan, i, plan.rank(), ptr(full), ptr(local), true);
}

}  // namespace comm
