// The SOAP family's ops on the CPU: soap_math.h in plain loops. The sum of squares of the clip
// runs in index order, so the results are the bits of the host loops the SOAP golden files were
// first replayed with. The refresh spreads the factors over the OpenMP threads, largest first,
// and refreshes each on one thread (BLAS and LAPACK run single-threaded inside a parallel
// region), so its bits depend neither on the thread count nor on batching.
// Compiled with -fmath-errno, unlike the rest of engine_optim: optim/CMakeLists.txt says why.
#include <vector>

#include "core/check.h"
#include "core/cpu/cpu_linalg.h"
#include "core/cpu/elementwise_kernels.h"
#include "core/cpu/parallel_loops.h"
#include "optim/soap/eigenbasis.h"
#include "optim/soap/soap_ops.h"

namespace optim {

namespace {

class CpuSoapOps final : public SoapOps {
 public:
  explicit CpuSoapOps(core::Backend& backend) : backend_(backend) {}

  void adam(float* d, float* m, float* v, const float* g, int64_t n,
            const kmath::SoapAdamStep& step) override {
    if (step.raw) {
      core::cpu::elementwise<float>(
          n, [=](int64_t i) { d[i] = kmath::soap_adam_raw(m[i], v[i], g[i], step); });
      return;
    }
    // g^2 stored first, as the reference forms it (no fused multiply-add into the lerp).
    std::vector<float> g2(static_cast<size_t>(n));
    float* sq = g2.data();
    core::cpu::elementwise<float>(n, [=](int64_t i) { sq[i] = g[i] * g[i]; });
    core::cpu::elementwise<float>(
        n, [=](int64_t i) { d[i] = kmath::soap_adam_corrected(m[i], v[i], g[i], sq[i], step); });
  }

  void clip_update_rms(float* d, int64_t n, double max_rms) override {
    if (n <= 0) return;
    const float s = kmath::soap_rms_clip_scale(backend_.sum_squares_in_order(d, n), n, max_rms);
    core::cpu::scale(d, s, n);
  }

  void kl_root_weight_columns(float* out, const float* q, const float* lam, int64_t n,
                              double eps) override {
    // The weights once, then row by row (q and out are row-major).
    std::vector<float> w(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j)
      w[j] = kmath::kl_inverse_root_weight(lam[j], eps, n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        out[i * n + j] = q[i * n + j] * w[j];
  }

  void refresh(std::span<const FactorRefresh> jobs, int power_iter_steps, bool batched,
               SoapPhaseTimes* times) override {
    std::vector<SoapPhaseTimes> per_job(jobs.size());
    const auto size = [](const FactorRefresh& j) { return j.n; };
    const auto one = [&](const FactorRefresh& j, size_t i) {
      refresh_factor(backend_, j, power_iter_steps, times ? &per_job[i] : nullptr);
    };
    if (batched) {
      core::cpu::for_each_task(jobs, size, one);
    } else {
      // Each factor alone in a parallel region, so it runs on one thread as in the batched case.
      for (size_t i = 0; i < jobs.size(); ++i)
        core::cpu::for_each_task(jobs.subspan(i, 1), size,
                                 [&](const FactorRefresh& j, size_t) { one(j, i); });
    }
    if (times)
      for (const SoapPhaseTimes& t : per_job)
        times->add(t);
  }

 private:
  core::Backend& backend_;
};

}  // namespace

std::unique_ptr<SoapOps> make_cpu_soap_ops(core::Backend& backend) {
  ENGINE_CHECK(backend.device().is_cpu(),
               std::string("the CPU SOAP ops need the CPU backend, got ") + backend.name());
  return std::make_unique<CpuSoapOps>(backend);
}

}  // namespace optim
