// OSFT's ops on the CPU: the float64 products as Eigen expressions over float64 copies of the
// float inputs, the same expressions the host-only OSFT code evaluated, so CPU trajectories keep
// their bits. The CUDA ops evaluate the element formulas of osft_math.h; the CPU tests check those
// against these.
#include <Eigen/Dense>

#include <string>

#include "core/check.h"
#include "optim/osft/osft_math.h"
#include "optim/osft/osft_ops.h"

namespace optim {

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VecD = Eigen::VectorXd;
using MapF = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using ConstMapF =
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

MatD to_double(const float* p, int64_t rows, int64_t cols) {
  return ConstMapF(p, rows, cols).cast<double>();
}

VecD vector_to_double(const float* p, int64_t n) {
  return ConstMapF(p, n, 1).col(0).cast<double>();
}

// dst += float(src), element by element in float (a chain-rule term added to a gradient).
void accumulate_rounded(float* dst, const MatD& src) {
  const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rounded =
      src.cast<float>();
  const float* p = rounded.data();
  for (Eigen::Index e = 0; e < rounded.size(); ++e)
    dst[e] += p[e];
}

class CpuOsftOps final : public OsftOps {
 public:
  void reconstruct(float* w, const float* u_high, const float* s_high, const float* v_high,
                   const float* u_low, const float* s_low, const float* v_low, int64_t n, int64_t m,
                   int64_t k, int64_t r) override {
    if (n == 0 || m == 0) return;
    const MatD uh = to_double(u_high, n, k);
    const MatD ul = to_double(u_low, n, r);
    const MatD dense = uh * vector_to_double(s_high, k).asDiagonal() * to_double(v_high, k, m) +
                       ul * vector_to_double(s_low, r).asDiagonal() * to_double(v_low, r, m);
    MapF(w, n, m) = dense.cast<float>();
  }

  void factor_grads(float* du, float* ds, float* dv, const float* dw, const float* u_low,
                    const float* s_low, const float* v_low, int64_t n, int64_t m,
                    int64_t r) override {
    if (r == 0) return;
    const MatD g = to_double(dw, n, m);
    const MatD ul = to_double(u_low, n, r);
    const MatD vl = to_double(v_low, r, m);
    const VecD sl = vector_to_double(s_low, r);
    const MatD gv = g * vl.transpose();  // dW V_low^T  [n, r]
    accumulate_rounded(du, MatD(gv * sl.asDiagonal()));
    accumulate_rounded(ds, MatD(ul.cwiseProduct(gv).colwise().sum().transpose()));
    accumulate_rounded(dv, MatD(sl.asDiagonal() * (ul.transpose() * g)));
  }

  void left_coefficients(double* coeff, const float* u_high, const float* x, int64_t n, int64_t k,
                         int64_t r) override {
    if (k == 0 || r == 0) return;
    if (n == 0) {
      Eigen::Map<MatD>(coeff, k, r).setZero();
      return;
    }
    const MatD uh = to_double(u_high, n, k);
    const MatD xd = to_double(x, n, r);
    Eigen::Map<MatD>(coeff, k, r) = uh.transpose() * xd;
  }

  void project_left(float* x, const float* u_high, const double* coeff, int64_t n, int64_t k,
                    int64_t r) override {
    if (n == 0 || r == 0) return;
    const MatD uh = to_double(u_high, n, k);
    MapF xm(x, n, r);
    const Eigen::Map<const MatD> c(coeff, k, r);
    xm = (xm.cast<double>() - uh * c).cast<float>();
  }

  void project_right(float* x, const float* v_high, int64_t rows, int64_t k, int64_t m) override {
    if (rows == 0 || m == 0) return;
    const MatD vh = to_double(v_high, k, m);
    MapF xm(x, rows, m);
    const MatD xd = xm.cast<double>();
    xm = (xd - (xd * vh.transpose()) * vh).cast<float>();
  }

  void sum_partials(double* total, const double* partial, int64_t parts, int64_t count) override {
    for (int64_t i = 0; i < count; ++i)
      total[i] = kmath::osft_sum_partials_element(partial, parts, count, i);
  }
};

}  // namespace

std::unique_ptr<OsftOps> make_cpu_osft_ops(core::Backend& backend) {
  ENGINE_CHECK(backend.device().is_cpu(),
               std::string("the CPU OSFT ops need the CPU backend, got ") + backend.name());
  return std::make_unique<CpuOsftOps>();
}

}  // namespace optim
