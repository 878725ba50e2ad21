// Muon's ops on the CPU: Newton-Schulz through BLAS (cpu/newton_schulz.h), NorMuon's statistics
// and the cautious update as loops over muon_math.h, one parameter after the other.
// Compiled with -fmath-errno, unlike the rest of engine_optim: optim/CMakeLists.txt says why.
#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cpu/parallel_loops.h"
#include "optim/muon/cpu/newton_schulz.h"
#include "optim/muon/muon_ops.h"

namespace optim {

namespace {

class CpuMuonOps final : public MuonOps {
 public:
  void newton_schulz(float* x, int64_t m, int64_t n, const NewtonSchulzSchedule& schedule,
                     int64_t batch) override {
    cpu::newton_schulz(x, m, n, schedule, batch);
  }

  // Parameter after parameter: the normalisation, then the update.
  void update(std::span<const MuonUpdate> params, double beta2) override {
    for (const MuonUpdate& p : params) {
      if (p.second_moment != nullptr)
        normuon_normalize(p.u, p.second_moment, p.count, p.rows, p.cols, beta2);
      cautious_update(p.w, p.u, p.count * p.rows * p.cols, p.lr, p.wd);
    }
  }

 private:
  // One matrix after the other; within a matrix the squared norms are added in row-major order.
  static void normuon_normalize(float* u, float* second_moment, int64_t count, int64_t rows,
                                int64_t cols, double beta2) {
    const int64_t r = rows, c = cols;
    const bool per_row = r >= c;
    const int64_t stats = per_row ? r : c;
    const double entries = static_cast<double>(per_row ? c : r);
    std::vector<double> q(static_cast<size_t>(stats));
    std::vector<double> scale(static_cast<size_t>(stats));
    for (int64_t k = 0; k < count; ++k) {
      float* x = u + k * r * c;
      float* s = second_moment + k * stats;
      std::fill(q.begin(), q.end(), 0.0);
      double norm2 = 0;
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j) {
          const double xi = x[i * c + j];
          q[per_row ? i : j] += xi * xi;
          norm2 += xi * xi;
        }
      double scaled2 = 0;
      for (int64_t a = 0; a < stats; ++a) {
        const double sa = kmath::normuon_second_moment(s[a], q[a], entries, beta2);
        s[a] = static_cast<float>(sa);
        scale[a] = kmath::normuon_scale(sa);
        scaled2 += q[a] * scale[a] * scale[a];  // ||V * scale||^2 summed per row or column
      }
      const double keep_norm = kmath::normuon_keep_norm(norm2, scaled2);
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j)
          x[i * c + j] = kmath::normuon_apply(x[i * c + j], scale[per_row ? i : j], keep_norm);
    }
  }

  static void cautious_update(float* w, const float* u, int64_t n, double lr, double wd) {
#pragma omp parallel for schedule(static) if (n > core::cpu::kParallelMin)
    for (int64_t i = 0; i < n; ++i)
      w[i] = kmath::cautious_update_element(w[i], u[i], lr, wd);
  }
};

}  // namespace

std::unique_ptr<MuonOps> make_cpu_muon_ops(core::Backend& backend) {
  ENGINE_CHECK(backend.device().is_cpu(),
               std::string("the CPU Muon ops need the CPU backend, got ") + backend.name());
  return std::make_unique<CpuMuonOps>();
}

}  // namespace optim
