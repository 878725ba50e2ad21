#include "optim/osft/osft_factors.h"

#include <Eigen/Dense>
#include <Eigen/SVD>
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/transfer.h"

namespace optim {

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapF = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using VecD = Eigen::VectorXd;

MapF as_matrix(const core::Tensor& t, int64_t rows, int64_t cols) {
  ENGINE_CHECK(t.numel() == rows * cols && t.is_contiguous() && t.dtype() == core::DType::F32,
               "osft: expected a contiguous f32 [" + std::to_string(rows) + ", " +
                   std::to_string(cols) + "] tensor, got " + t.str());
  return MapF(t.data<float>(), rows, cols);
}

MatD to_double(const core::Tensor& t, int64_t rows, int64_t cols) {
  return as_matrix(t, rows, cols).cast<double>();
}

core::Tensor to_tensor(const MatD& m) {
  core::Tensor t = core::Tensor::empty({m.rows(), m.cols()});
  as_matrix(t, m.rows(), m.cols()) = m.cast<float>();
  return t;
}

core::Tensor to_tensor(const VecD& v) {
  core::Tensor t = core::Tensor::empty({v.size()});
  as_matrix(t, v.size(), 1).col(0) = v.cast<float>();
  return t;
}

void check_matrix(const core::Tensor& w, const char* what) {
  ENGINE_CHECK(
      w.dim() == 2 && w.dtype() == core::DType::F32 && w.is_contiguous() &&
          core::is_host_memory(w.device()),
      std::string("osft: ") + what + " must be a contiguous host f32 matrix, got " + w.str());
}

}  // namespace

int64_t osft_k_high(int64_t rows, int64_t cols, double unfreeze_rank_ratio) {
  ENGINE_CHECK(
      unfreeze_rank_ratio >= 0.0 && unfreeze_rank_ratio <= 1.0,
      "osft: unfreeze_rank_ratio must be in [0, 1], got " + std::to_string(unfreeze_rank_ratio));
  const int64_t m = std::min(rows, cols);
  const double rank_ratio = 1.0 - unfreeze_rank_ratio;  // the frozen fraction, as the reference
  int64_t k = static_cast<int64_t>(std::floor(static_cast<double>(m) * rank_ratio));
  if (k >= m) k = m - 1;
  return std::max<int64_t>(k, 0);
}

comm::Range osft_rows(int64_t n, int world_size, int rank) {
  ENGINE_CHECK(world_size > 0 && rank >= 0 && rank < world_size && n >= 0,
               "osft_rows: bad arguments n=" + std::to_string(n) +
                   " world_size=" + std::to_string(world_size) + " rank=" + std::to_string(rank));
  const int64_t chunk = (n + world_size - 1) / world_size;
  const int64_t begin = std::min(n, chunk * rank);
  return {begin, std::min(n, begin + chunk)};
}

core::Tensor& factor_by_name(OsftFactors& f, const std::string& factor) {
  if (factor == "U_high") return f.U_high;
  if (factor == "S_high") return f.S_high;
  if (factor == "V_high") return f.V_high;
  if (factor == "U_low") return f.U_low;
  if (factor == "S_low") return f.S_low;
  if (factor == "V_low") return f.V_low;
  ENGINE_FAIL("osft: unknown factor '" + factor + "'");
}

const core::Tensor& factor_by_name(const OsftFactors& f, const std::string& factor) {
  return factor_by_name(const_cast<OsftFactors&>(f), factor);
}

OsftFactors osft_decompose(const core::Tensor& weight, int64_t k_high) {
  check_matrix(weight, "a decomposed weight");
  const int64_t n = weight.size(0), m = weight.size(1), rank = std::min(n, m);
  ENGINE_CHECK(k_high > 0 && k_high < rank, "osft: k_high " + std::to_string(k_high) +
                                                " must lie in [1, " + std::to_string(rank - 1) +
                                                "] for a " + weight.str() + " weight");
  Eigen::BDCSVD<MatD> svd(to_double(weight, n, m), Eigen::ComputeThinU | Eigen::ComputeThinV);
  ENGINE_CHECK(svd.info() == Eigen::Success, "osft: the SVD of a " + weight.str() + " failed");
  MatD u = svd.matrixU();               // [n, rank]
  MatD vt = svd.matrixV().transpose();  // [rank, m]
  const VecD s = svd.singularValues();  // descending
  for (int64_t i = 0; i < rank; ++i)
    if (u.col(i).sum() < 0) {
      u.col(i) *= -1.0;
      vt.row(i) *= -1.0;
    }
  const int64_t r = rank - k_high;
  OsftFactors f;
  f.U_high = to_tensor(MatD(u.leftCols(k_high)));
  f.S_high = to_tensor(VecD(s.head(k_high)));
  f.V_high = to_tensor(MatD(vt.topRows(k_high)));
  f.U_low = to_tensor(MatD(u.rightCols(r)));
  f.S_low = to_tensor(VecD(s.tail(r)));
  f.V_low = to_tensor(MatD(vt.bottomRows(r)));
  return f;
}

std::vector<OsftFactors> osft_decompose_all(std::span<const OsftTargetWeight> targets,
                                            comm::Communicator* comm, core::Backend& backend) {
  const int world = comm ? comm->size() : 1, me = comm ? comm->rank() : 0;
  ENGINE_CHECK(comm == nullptr || comm->device() == backend.device(),
               "osft: the factors are decomposed into the memory of " +
                   std::string(backend.name()) + " but the communicator " + comm->name() +
                   " moves buffers on " + comm->device().str());
  auto owner_of = [&](size_t i) { return static_cast<int>(i % static_cast<size_t>(world)); };
  // Every rank decomposes its targets on the host (all at once), copies the factors into the
  // backend's memory and broadcasts them from there.
  std::vector<OsftFactors> host(targets.size());
  for (size_t i = 0; i < targets.size(); ++i)
    if (owner_of(i) == me) host[i] = osft_decompose(targets[i].weight, targets[i].k_high);
  std::vector<OsftFactors> out(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    const int64_t n = targets[i].weight.size(0), m = targets[i].weight.size(1);
    const int64_t k = targets[i].k_high, r = std::min(n, m) - k;
    const core::Shape shapes[] = {{n, k}, {k}, {k, m}, {n, r}, {r}, {r, m}};
    for (size_t j = 0; j < 6; ++j) {
      core::Tensor& t = factor_by_name(out[i], kOsftFactorNames[j]);
      t = core::Tensor::empty(shapes[j], core::DType::F32, backend.allocator());
      const core::Tensor& h = factor_by_name(host[i], kOsftFactorNames[j]);
      if (owner_of(i) == me) core::write_from_host(backend, t, h);
      if (world > 1) comm->broadcast(t.data<float>(), t.numel(), owner_of(i));
    }
  }
  return out;
}

void osft_reconstruct_into(OsftOps& ops, const OsftFactors& f, const core::Tensor& out,
                           int64_t row_begin) {
  const int64_t n = f.U_high.size(0), k = f.U_high.size(1), r = f.U_low.size(1);
  const int64_t m = f.V_high.size(1), rows = out.dim() == 2 ? out.size(0) : -1;
  ENGINE_CHECK(
      out.dim() == 2 && out.size(1) == m && out.is_contiguous() && out.dtype() == core::DType::F32,
      "osft: reconstruct into " + out.str() + ", expected contiguous f32 [rows, " +
          std::to_string(m) + "]");
  ENGINE_CHECK(row_begin >= 0 && row_begin + rows <= n, "osft: reconstruct rows out of range");
  ops.reconstruct(out.data<float>(), f.U_high.data<float>() + row_begin * k, f.S_high.data<float>(),
                  f.V_high.data<float>(), f.U_low.data<float>() + row_begin * r,
                  f.S_low.data<float>(), f.V_low.data<float>(), rows, m, k, r);
}

core::Tensor osft_reconstruct(const OsftFactors& f, int64_t row_begin, int64_t rows) {
  ENGINE_CHECK(rows >= 0, "osft: reconstruct rows out of range");
  core::Tensor w = core::Tensor::empty({rows, f.V_high.size(1)});
  osft_reconstruct_into(*make_osft_ops(core::cpu_backend()), f, w, row_begin);
  return w;
}

void osft_add_factor_grads(OsftOps& ops, const OsftFactors& f, const core::Tensor& dW,
                           const OsftLowGrads& grads) {
  const int64_t n = f.U_low.size(0), r = f.U_low.size(1), m = f.V_low.size(1);
  ENGINE_CHECK(dW.dim() == 2 && dW.size(0) == n && dW.size(1) == m && dW.is_contiguous(),
               "osft: the gradient " + dW.str() + " does not fit the factors [" +
                   std::to_string(n) + ", " + std::to_string(m) + "]");
  ENGINE_CHECK(
      grads.U_low.numel() == n * r && grads.S_low.numel() == r && grads.V_low.numel() == r * m,
      "osft: factor gradients " + grads.U_low.str() + ", " + grads.S_low.str() + ", " +
          grads.V_low.str() + " do not fit the factors");
  ops.factor_grads(grads.U_low.data<float>(), grads.S_low.data<float>(), grads.V_low.data<float>(),
                   dW.data<float>(), f.U_low.data<float>(), f.S_low.data<float>(),
                   f.V_low.data<float>(), n, m, r);
}

OsftLowGrads osft_factor_grads(const OsftFactors& f, const core::Tensor& dW) {
  OsftLowGrads out;
  out.U_low = core::Tensor::zeros(f.U_low.shape());
  out.S_low = core::Tensor::zeros(f.S_low.shape());
  out.V_low = core::Tensor::zeros(f.V_low.shape());
  osft_add_factor_grads(*make_osft_ops(core::cpu_backend()), f, dW, out);
  return out;
}

}  // namespace optim
