#include "optim/osft/osft_projector.h"

#include <algorithm>

#include "core/check.h"
#include "core/transfer.h"
#include "optim/osft/osft_factors.h"

namespace optim {

namespace {

double* doubles(const std::unique_ptr<core::Storage>& s) {
  return s ? static_cast<double*>(s->data()) : nullptr;
}

}  // namespace

void osft_sum_over_ranks(comm::Communicator& comm, OsftOps& ops, const double* partial,
                         double* total, double* gathered, int64_t count) {
  // A double is two floats' worth of bytes; the all-gather copies them without arithmetic.
  const std::vector<int64_t> counts(static_cast<size_t>(comm.size()), 2 * count);
  comm.all_gather(reinterpret_cast<const float*>(partial), reinterpret_cast<float*>(gathered),
                  counts);
  ops.sum_partials(total, gathered, comm.size(), count);
}

OsftProjector::OsftProjector(comm::Communicator* comm, int64_t v_high_cache_bytes, RowSplit split,
                             core::Backend& backend)
    : comm_(comm),
      v_high_cache_bytes_(v_high_cache_bytes),
      split_(split ? split : osft_rows),
      backend_(backend),
      ops_(make_osft_ops(backend)) {
  ENGINE_CHECK(comm_ == nullptr || comm_->device() == backend_.device(),
               "osft: the factors' projection runs on " + std::string(backend_.name()) +
                   " but its shard group " + comm_->name() + " moves buffers on " +
                   comm_->device().str());
}

void OsftProjector::add_target(const std::string& name, int64_t rows, int64_t cols, int64_t k_high,
                               core::Tensor U_high_rows, core::Tensor V_high_rows) {
  ENGINE_CHECK(!projected_, "osft: target '" + name + "' added after the first projection");
  ENGINE_CHECK(k_high > 0 && k_high < std::min(rows, cols),
               "osft: target '" + name + "' has k_high " + std::to_string(k_high));
  Target t{name,
           rows,
           cols,
           k_high,
           std::min(rows, cols) - k_high,
           std::move(U_high_rows),
           std::move(V_high_rows)};
  const comm::Range u = split_(rows, world_size(), rank());
  const comm::Range v = split_(k_high, world_size(), rank());
  auto check = [&](const core::Tensor& x, int64_t r, int64_t c, const char* what) {
    ENGINE_CHECK(x.dtype() == core::DType::F32 && x.is_contiguous() && x.numel() == r * c &&
                     (r * c == 0 || x.size(0) == r),
                 "osft: target '" + name + "': this rank's " + what + " rows are " + x.str() +
                     ", expected [" + std::to_string(r) + ", " + std::to_string(c) + "] (rank " +
                     std::to_string(rank()) + " of " + std::to_string(world_size()) + ")");
    ENGINE_CHECK(r * c == 0 || x.device() == backend_.device(),
                 "osft: target '" + name + "': this rank's " + what + " rows " + x.str() +
                     " are not in the memory of " + backend_.name());
  };
  check(t.U_high_rows, u.size(), k_high, "U_high");
  check(t.V_high_rows, v.size(), cols, "V_high");
  targets_.push_back(std::move(t));
  int64_t bytes = 0;
  for (const Target& x : targets_)
    bytes += x.k_high * x.cols * static_cast<int64_t>(sizeof(float));
  cache_ = bytes <= v_high_cache_bytes_;  // from global shapes: the same on every rank
  v_full_.emplace_back();
}

void OsftProjector::gather_v_high() {
  const int world = world_size();
  if (world == 1) {  // this rank holds every row
    for (size_t i = 0; i < targets_.size(); ++i)
      v_full_[i] = targets_[i].V_high_rows;
    return;
  }
  // One all-gather of every target's rows: rank p contributes its rows of each target in
  // target order; counts come from the global shapes.
  std::vector<int64_t> counts(static_cast<size_t>(world), 0);
  for (int p = 0; p < world; ++p)
    for (const Target& t : targets_)
      counts[static_cast<size_t>(p)] += split_(t.k_high, world, p).size() * t.cols;
  int64_t total = 0;
  for (int64_t c : counts)
    total += c;
  core::Allocator& memory = backend_.allocator();
  const core::Tensor send = core::Tensor::empty(
      {std::max<int64_t>(counts[static_cast<size_t>(rank())], 1)}, core::DType::F32, memory);
  const core::Tensor recv =
      core::Tensor::empty({std::max<int64_t>(total, 1)}, core::DType::F32, memory);
  int64_t offset = 0;
  for (const Target& t : targets_) {
    if (t.V_high_rows.numel() > 0)
      backend_.copy(send.data<float>() + offset, t.V_high_rows.raw_data(), t.V_high_rows.nbytes());
    offset += t.V_high_rows.numel();
  }
  comm_->all_gather(send.data<float>(), recv.data<float>(), counts);
  for (size_t i = 0; i < targets_.size(); ++i)
    if (!v_full_[i].defined())
      v_full_[i] =
          core::Tensor::empty({targets_[i].k_high, targets_[i].cols}, core::DType::F32, memory);
  offset = 0;
  for (int p = 0; p < world; ++p)
    for (size_t i = 0; i < targets_.size(); ++i) {
      const Target& t = targets_[i];
      const comm::Range rows = split_(t.k_high, world, p);
      const int64_t n = rows.size() * t.cols;
      if (n > 0)
        backend_.copy(v_full_[i].data<float>() + rows.begin * t.cols, recv.data<float>() + offset,
                      static_cast<size_t>(n) * sizeof(float));
      offset += n;
    }
}

void OsftProjector::reduce_coefficients() {
  const size_t bytes = static_cast<size_t>(coefficient_count_) * sizeof(double);
  const int world = world_size();
  // In host memory MPI's float64 all-reduce sums the coefficients in place; a device
  // communicator reduces floats only: they are gathered, then added on the device.
  if (world == 1 || core::is_host_memory(comm_->device())) {
    backend_.copy(doubles(total_), doubles(partial_), bytes);
    if (world > 1) comm_->all_reduce(doubles(total_), coefficient_count_, comm::ReduceOp::Sum);
    return;
  }
  if (!gathered_) gathered_ = std::make_unique<core::Storage>(backend_.allocator(), bytes * world);
  osft_sum_over_ranks(*comm_, *ops_, doubles(partial_), doubles(total_), doubles(gathered_),
                      coefficient_count_);
}

void OsftProjector::project(std::span<float* const> u, std::span<float* const> v) {
  ENGINE_CHECK(u.size() == targets_.size() && v.size() == targets_.size(),
               "osft: project got " + std::to_string(u.size()) + "/" + std::to_string(v.size()) +
                   " parts for " + std::to_string(targets_.size()) + " targets");
  if (!cache_ || !projected_) gather_v_high();
  if (!projected_) {
    for (const Target& t : targets_)
      coefficient_count_ += t.k_high * t.k_low;
    const size_t bytes =
        static_cast<size_t>(std::max<int64_t>(coefficient_count_, 1)) * sizeof(double);
    partial_ = std::make_unique<core::Storage>(backend_.allocator(), bytes);
    total_ = std::make_unique<core::Storage>(backend_.allocator(), bytes);
  }
  projected_ = true;

  // U: partial coefficients U_high,p^T X_U,p of every target, summed over ranks in one call.
  std::vector<int64_t> local_rows(targets_.size());
  int64_t offset = 0;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& t = targets_[i];
    const int64_t n = rows(t.rows).size();
    local_rows[i] = n;
    double* c = doubles(partial_) + offset;
    if (n > 0) {
      ENGINE_CHECK(u[i] != nullptr, "osft: target '" + t.name + "' has no U part on this rank");
      ops_->left_coefficients(c, t.U_high_rows.data<float>(), u[i], n, t.k_high, t.k_low);
    } else {
      backend_.fill_zero(c, static_cast<size_t>(t.k_high * t.k_low) * sizeof(double));
    }
    offset += t.k_high * t.k_low;
  }
  reduce_coefficients();

  offset = 0;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& t = targets_[i];
    const int64_t n = local_rows[i];
    if (n > 0)
      ops_->project_left(u[i], t.U_high_rows.data<float>(), doubles(total_) + offset, n, t.k_high,
                         t.k_low);
    offset += t.k_high * t.k_low;

    // V: rows of X_V need the whole V_high.
    const int64_t rv = rows(t.k_low).size();
    if (rv > 0) {
      ENGINE_CHECK(v[i] != nullptr, "osft: target '" + t.name + "' has no V part on this rank");
      ops_->project_right(v[i], v_full_[i].data<float>(), rv, t.k_high, t.cols);
    }
  }
}

std::vector<double> OsftProjector::download(const core::Storage* buffer) const {
  std::vector<double> out(static_cast<size_t>(buffer ? coefficient_count_ : 0));
  if (!out.empty()) backend_.copy_to_host(out.data(), buffer->data(), out.size() * sizeof(double));
  return out;
}

std::vector<double> OsftProjector::last_partial_coefficients() const {
  return download(partial_.get());
}

std::vector<double> OsftProjector::last_coefficients() const {
  return download(total_.get());
}

}  // namespace optim
