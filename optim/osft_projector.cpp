#include "optim/osft_projector.h"

#include <Eigen/Dense>
#include <algorithm>

#include "engine/core/check.h"
#include "optim/osft_factors.h"

namespace optim {

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapF = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using ConstMapF =
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

}  // namespace

OsftProjector::OsftProjector(comm::Communicator* comm, int64_t v_high_cache_bytes, RowSplit split)
    : comm_(comm), v_high_cache_bytes_(v_high_cache_bytes), split_(split ? split : osft_rows) {}

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
  if (world == 1) {
    for (size_t i = 0; i < targets_.size(); ++i) {
      const Target& t = targets_[i];
      const float* p = t.V_high_rows.numel() ? t.V_high_rows.data<float>() : nullptr;
      v_full_[i].assign(p, p + t.k_high * t.cols);
    }
    return;
  }
  // One all-gather of every target's rows: rank p contributes its rows of each target in
  // target order; counts come from the global shapes.
  std::vector<int64_t> counts(static_cast<size_t>(world), 0);
  for (int p = 0; p < world; ++p)
    for (const Target& t : targets_)
      counts[static_cast<size_t>(p)] += split_(t.k_high, world, p).size() * t.cols;
  std::vector<float> send;
  send.reserve(static_cast<size_t>(counts[static_cast<size_t>(rank())]));
  for (const Target& t : targets_) {
    const float* p = t.V_high_rows.numel() ? t.V_high_rows.data<float>() : nullptr;
    send.insert(send.end(), p, p + t.V_high_rows.numel());
  }
  int64_t total = 0;
  for (int64_t c : counts)
    total += c;
  std::vector<float> recv(static_cast<size_t>(total));
  comm_->all_gather(send.data(), recv.data(), counts);
  for (size_t i = 0; i < targets_.size(); ++i)
    v_full_[i].assign(static_cast<size_t>(targets_[i].k_high * targets_[i].cols), 0.0f);
  size_t offset = 0;
  for (int p = 0; p < world; ++p)
    for (size_t i = 0; i < targets_.size(); ++i) {
      const Target& t = targets_[i];
      const comm::Range rows = split_(t.k_high, world, p);
      std::copy_n(recv.begin() + static_cast<std::ptrdiff_t>(offset), rows.size() * t.cols,
                  v_full_[i].begin() + rows.begin * t.cols);
      offset += static_cast<size_t>(rows.size() * t.cols);
    }
}

void OsftProjector::project(std::span<float* const> u, std::span<float* const> v) {
  ENGINE_CHECK(u.size() == targets_.size() && v.size() == targets_.size(),
               "osft: project got " + std::to_string(u.size()) + "/" + std::to_string(v.size()) +
                   " parts for " + std::to_string(targets_.size()) + " targets");
  if (!cache_ || !projected_) gather_v_high();
  projected_ = true;

  // U: partial coefficients U_high,p^T X_U,p of every target, summed over ranks in one call.
  size_t total = 0;
  for (const Target& t : targets_)
    total += static_cast<size_t>(t.k_high * t.k_low);
  partial_.assign(total, 0.0);
  std::vector<int64_t> local_rows(targets_.size());
  size_t offset = 0;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& t = targets_[i];
    const int64_t n = rows(t.rows).size();
    local_rows[i] = n;
    if (n > 0) {
      ENGINE_CHECK(u[i] != nullptr, "osft: target '" + t.name + "' has no U part on this rank");
      const MatD uh = ConstMapF(t.U_high_rows.data<float>(), n, t.k_high).cast<double>();
      const MatD x = ConstMapF(u[i], n, t.k_low).cast<double>();
      Eigen::Map<MatD>(partial_.data() + offset, t.k_high, t.k_low) = uh.transpose() * x;
    }
    offset += static_cast<size_t>(t.k_high * t.k_low);
  }
  total_ = partial_;
  if (world_size() > 1 && total > 0)
    comm_->all_reduce(total_.data(), static_cast<int64_t>(total), comm::ReduceOp::Sum);

  offset = 0;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& t = targets_[i];
    const int64_t n = local_rows[i];
    if (n > 0) {
      const MatD uh = ConstMapF(t.U_high_rows.data<float>(), n, t.k_high).cast<double>();
      MapF x(u[i], n, t.k_low);
      const Eigen::Map<const MatD> c(total_.data() + offset, t.k_high, t.k_low);
      x = (x.cast<double>() - uh * c).cast<float>();
    }
    offset += static_cast<size_t>(t.k_high * t.k_low);

    // V: rows of X_V need the whole V_high.
    const int64_t rv = rows(t.k_low).size();
    if (rv > 0) {
      ENGINE_CHECK(v[i] != nullptr, "osft: target '" + t.name + "' has no V part on this rank");
      const MatD vh = ConstMapF(v_full_[i].data(), t.k_high, t.cols).cast<double>();
      MapF x(v[i], rv, t.cols);
      const MatD xd = x.cast<double>();
      x = (xd - (xd * vh.transpose()) * vh).cast<float>();
    }
  }
}

}  // namespace optim
