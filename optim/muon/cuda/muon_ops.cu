// Muon's ops on the CUDA backend: Newton-Schulz from the backend's batched GEMM; NorMuon's
// statistics as block reductions (float64, fixed order) and the update, muon_math.h per element
// as on the CPU, for all of a step's parameters in three launches.
#include <cuda_runtime.h>

#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "optim/muon/muon_ops.h"

namespace optim {

namespace {

using core::cuda_detail::block_allreduce;
using core::cuda_detail::DeviceBuffer;
using core::cuda_detail::first_index;
using core::cuda_detail::grid_for;
using core::cuda_detail::grid_stride;
using core::cuda_detail::kThreads;
using core::cuda_detail::Sum;
using core::cuda_detail::Sum2;
using core::cuda_detail::to_int;

// Per matrix of x [batch, size]: x *= 1 / (norm_scale * ||x||_F + norm_eps), one block each.
// The Frobenius norm is accumulated in float64.
__global__ void normalize_frobenius_kernel(float* x, int64_t size, float norm_scale,
                                           float norm_eps) {
  float* mat = x + static_cast<int64_t>(blockIdx.x) * size;
  Sum<double> ss;
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
    double v = mat[i];
    ss.value += v * v;
  }
  ss = block_allreduce(ss);
  float factor = 1.0f / (norm_scale * static_cast<float>(sqrt(ss.value)) + norm_eps);
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x)
    mat[i] *= factor;
}

// NewtonSchulzSchedule::bf16, per matrix of x [batch, size], one block each: x = r(x) / r(n + eps)
// rounded, n = r(||r(x)||_F) (times norm_scale, rounded, when it is not 1), r = kmath::ns_round.
__global__ void normalize_frobenius_bf16_kernel(float* x, int64_t size, float norm_scale,
                                                float norm_eps) {
  float* mat = x + static_cast<int64_t>(blockIdx.x) * size;
  Sum<double> ss;
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
    const float v = kmath::ns_round(mat[i]);
    mat[i] = v;
    ss.value += static_cast<double>(v) * v;
  }
  ss = block_allreduce(ss);
  float norm = kmath::ns_round(static_cast<float>(sqrt(ss.value)));
  if (norm_scale != 1.0f) norm = kmath::ns_round(norm_scale * norm);
  const float denom = kmath::ns_round(norm + norm_eps);
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x)
    mat[i] = kmath::ns_round(mat[i] / denom);
}

// The bf16 iteration's element steps over n values (kmath::ns_*): the Gram matrix rounded as
// stored, with r(c A) beside it (the record's c * A @ A is (c A) A); out = r(s x + r(out)) as the
// compiled record (kmath::ns_bf16_fused_axpy), or r(r(s x) + r(out)) as eager PyTorch.
__global__ void ns_gram_kernel(float* gram, float* scaled, int64_t n, float c) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float a = kmath::ns_round(gram[i]);
    gram[i] = a;
    scaled[i] = kmath::ns_bf16_scale(c, a);
  }
}
__global__ void ns_axpy_kernel(float* out, const float* x, int64_t n, float s, bool eager) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] =
        eager ? kmath::ns_bf16_axpy(s, x[i], out[i]) : kmath::ns_bf16_fused_axpy(s, x[i], out[i]);
}

// ---- NorMuon and the update, for all parameters at once
// ------------------------------------------
//
// Three launches whatever the number of parameters, each over a table of them in which every
// parameter owns a run of blocks (owner_of_block): the statistics (a block per row, or a thread
// per column, as the sums run on one matrix), the scales (a block per matrix), and the update
// (a chunk of elements per block: the normalisation applied, then the cautious step).

constexpr int64_t kChunk = int64_t{1} << 16;  // elements per block of the update stage

enum Stage { kStats = 0, kScales = 1, kUpdate = 2, kStages = 3 };

struct MuonJob {
  MuonUpdate p;
  bool per_row = true;
  int64_t stats = 0;       // statistics per matrix: rows when per_row, else columns
  double* q = nullptr;     // [count, stats]: sums of squares, then the scales
  double* keep = nullptr;  // [count]: the norm-keeping factors
  int64_t first_block[kStages] = {0, 0, 0};
};

template <Stage S>
__device__ inline int job_of_block(const MuonJob* jobs, int count, int64_t& b) {
  const int j =
      core::cuda_detail::owner_of_block(b, count, [jobs](int i) { return jobs[i].first_block[S]; });
  b -= jobs[j].first_block[S];
  return j;
}

// Row statistics: one block per row (the block's threads stride over its columns); column
// statistics: one thread per column walking down the rows.
__global__ void normuon_stats_kernel(const MuonJob* jobs, int count) {
  int64_t b = blockIdx.x;
  const MuonJob& job = jobs[job_of_block<kStats>(jobs, count, b)];
  const int64_t rows = job.p.rows, cols = job.p.cols;
  if (job.per_row) {
    const float* x = job.p.u + b * cols;
    Sum<double> s;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const double xj = x[j];
      s.value += xj * xj;
    }
    s = block_allreduce(s);
    if (threadIdx.x == 0) job.q[b] = s.value;
    return;
  }
  const int64_t t = b * blockDim.x + threadIdx.x;  // matrix k = t / cols, column t % cols
  if (t >= job.p.count * cols) return;
  const float* x = job.p.u + (t / cols) * rows * cols + t % cols;
  double s = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const double xi = x[i * cols];
    s += xi * xi;
  }
  job.q[t] = s;
}

// One block per matrix: the second moments from q, q replaced by the scales, the matrix's
// norm-keeping factor into keep.
__global__ void normuon_scales_kernel(const MuonJob* jobs, int count, double beta2) {
  int64_t k = blockIdx.x;
  const MuonJob& job = jobs[job_of_block<kScales>(jobs, count, k)];
  double* qk = job.q + k * job.stats;
  float* sk = job.p.second_moment + k * job.stats;
  const double entries = static_cast<double>(job.per_row ? job.p.cols : job.p.rows);
  Sum2<double> norms;  // a: ||V||^2, b: ||V * scale||^2
  for (int64_t a = threadIdx.x; a < job.stats; a += blockDim.x) {
    const double qa = qk[a];
    const double sa = kmath::normuon_second_moment(sk[a], qa, entries, beta2);
    sk[a] = static_cast<float>(sa);
    const double scale = kmath::normuon_scale(sa);
    qk[a] = scale;
    norms.a += qa;
    norms.b += qa * scale * scale;
  }
  norms = block_allreduce(norms);
  if (threadIdx.x == 0) job.keep[k] = kmath::normuon_keep_norm(norms.a, norms.b);
}

// A chunk of one parameter: u normalised (when it has second moments), then w's cautious step.
__global__ void muon_update_kernel(const MuonJob* jobs, int count) {
  int64_t chunk = blockIdx.x;
  const MuonJob& job = jobs[job_of_block<kUpdate>(jobs, count, chunk)];
  const int64_t size = job.p.rows * job.p.cols, n = job.p.count * size;
  const int64_t begin = chunk * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
  const bool normalize = job.p.second_moment != nullptr;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float u = job.p.u[i];
    if (normalize) {
      const int64_t k = i / size, e = i % size;
      const int64_t a = job.per_row ? e / job.p.cols : e % job.p.cols;
      u = kmath::normuon_apply(u, job.q[k * job.stats + a], job.keep[k]);
      job.p.u[i] = u;
    }
    job.p.w[i] = kmath::cautious_update_element(job.p.w[i], u, job.p.lr, job.p.wd);
  }
}

class CudaMuonOps final : public MuonOps {
 public:
  explicit CudaMuonOps(core::CudaBackend& backend) : backend_(backend), stream_(backend.stream()) {}

  void newton_schulz(float* x, int64_t m, int64_t n, const NewtonSchulzSchedule& schedule,
                     int64_t batch) override {
    ENGINE_CHECK(m >= 0 && n >= 0 && batch >= 0,
                 std::string(backend_.name()) + ": newton_schulz: negative size");
    if (m == 0 || n == 0 || batch == 0) return;
    // Iterate on the wide orientation X [rows, cols], rows <= cols, so X X^T is the small Gram
    // matrix; a tall input is transposed in and out.
    const bool tall = m > n;
    const int64_t rows = tall ? n : m;
    const int64_t cols = tall ? m : n;
    const int64_t size = m * n;
    core::Allocator& memory = backend_.allocator();
    DeviceBuffer<float> work_a(memory, batch * size);
    DeviceBuffer<float> work_b(memory, batch * size);
    DeviceBuffer<float> gram(memory, batch * rows * rows);
    DeviceBuffer<float> poly(memory, batch * rows * rows);
    float* cur = work_a.get();
    float* next = work_b.get();
    if (tall) {
      core::cuda_detail::transpose_batched(cur, x, batch, m, n, size, stream_);
    } else {
      backend_.copy(cur, x, static_cast<size_t>(batch * size) * sizeof(float));
    }
    const int blocks = to_int(batch, "batch", "newton_schulz");
    if (schedule.bf16) {
      normalize_frobenius_bf16_kernel<<<blocks, kThreads, 0, stream_>>>(
          cur, size, schedule.norm_scale, schedule.norm_eps);
    } else {
      normalize_frobenius_kernel<<<blocks, kThreads, 0, stream_>>>(cur, size, schedule.norm_scale,
                                                                   schedule.norm_eps);
    }
    ENGINE_CUDA_LAUNCHED();
    const int64_t gsize = rows * rows;
    // bf16: every GEMM input holds bf16 values, exact in TF32, so tensor cores change nothing.
    const bool tf32 = schedule.tf32 || schedule.bf16;
    const unsigned grid_g = grid_for(batch * gsize), grid_x = grid_for(batch * size);
    for (const auto& [ca, cb, cc] : schedule.coefficients) {
      // gram = X X^T
      backend_.gemm({.trans_b = true,
                     .m = rows,
                     .n = rows,
                     .k = cols,
                     .batch = batch,
                     .stride_a = size,
                     .stride_b = size,
                     .stride_c = gsize,
                     .tf32 = tf32},
                    cur, cur, gram.get());
      core::GemmArgs square{.m = rows,
                            .n = rows,
                            .k = rows,
                            .batch = batch,
                            .stride_a = gsize,
                            .stride_b = gsize,
                            .stride_c = gsize,
                            .tf32 = tf32};
      core::GemmArgs apply{.m = rows,
                           .n = cols,
                           .k = rows,
                           .batch = batch,
                           .stride_a = gsize,
                           .stride_b = size,
                           .stride_c = size,
                           .tf32 = tf32};
      if (schedule.bf16) {
        // next (free until B X) holds r(c A) meanwhile: rows * rows <= rows * cols.
        ns_gram_kernel<<<grid_g, kThreads, 0, stream_>>>(gram.get(), next, batch * gsize, cc);
        ENGINE_CUDA_LAUNCHED();
        backend_.gemm(square, next, gram.get(), poly.get());
        ns_axpy_kernel<<<grid_g, kThreads, 0, stream_>>>(poly.get(), gram.get(), batch * gsize, cb,
                                                         schedule.bf16_eager);
        ENGINE_CUDA_LAUNCHED();
        backend_.gemm(apply, poly.get(), cur, next);
        ns_axpy_kernel<<<grid_x, kThreads, 0, stream_>>>(next, cur, batch * size, ca,
                                                         schedule.bf16_eager);
        ENGINE_CUDA_LAUNCHED();
      } else {
        // poly = b gram + c gram^2
        backend_.copy(poly.get(), gram.get(), static_cast<size_t>(batch * gsize) * sizeof(float));
        square.alpha = cc, square.beta = cb;
        backend_.gemm(square, gram.get(), gram.get(), poly.get());
        // next = a X + poly X
        backend_.copy(next, cur, static_cast<size_t>(batch * size) * sizeof(float));
        apply.beta = ca;
        backend_.gemm(apply, poly.get(), cur, next);
      }
      std::swap(cur, next);
    }
    if (tall) {
      core::cuda_detail::transpose_batched(x, cur, batch, n, m, size, stream_);
    } else {
      backend_.copy(x, cur, static_cast<size_t>(batch * size) * sizeof(float));
    }
  }

  // The jobs of one shape packed into one buffer and orthogonalised by one batched call: each
  // matrix's arithmetic is the same as alone (the batched GEMMs compute every member apart).
  void newton_schulz_many(std::span<const NewtonSchulzJob> jobs,
                          const NewtonSchulzSchedule& schedule) override {
    std::map<std::pair<int64_t, int64_t>, std::vector<const NewtonSchulzJob*>> by_shape;
    for (const NewtonSchulzJob& j : jobs)
      if (j.count > 0 && j.rows > 0 && j.cols > 0) by_shape[{j.rows, j.cols}].push_back(&j);
    for (const auto& [shape, group] : by_shape) {
      const auto [m, n] = shape;
      if (group.size() == 1) {
        newton_schulz(group[0]->x, m, n, schedule, group[0]->count);
        continue;
      }
      int64_t count = 0;
      for (const NewtonSchulzJob* j : group)
        count += j->count;
      DeviceBuffer<float> packed(backend_.allocator(), count * m * n);
      int64_t at = 0;
      for (const NewtonSchulzJob* j : group) {
        backend_.copy(packed.get() + at, j->x,
                      static_cast<size_t>(j->count * m * n) * sizeof(float));
        at += j->count * m * n;
      }
      newton_schulz(packed.get(), m, n, schedule, count);
      at = 0;
      for (const NewtonSchulzJob* j : group) {
        backend_.copy(j->x, packed.get() + at,
                      static_cast<size_t>(j->count * m * n) * sizeof(float));
        at += j->count * m * n;
      }
    }
  }

  void update(std::span<const MuonUpdate> params, double beta2) override {
    std::vector<MuonJob> jobs;
    int64_t blocks[kStages] = {0, 0, 0};
    int64_t scratch = 0;  // doubles of q and keep over all jobs
    for (const MuonUpdate& p : params) {
      ENGINE_CHECK(p.count >= 0 && p.rows >= 0 && p.cols >= 0,
                   std::string(backend_.name()) + ": muon update: negative size");
      const int64_t n = p.count * p.rows * p.cols;
      if (n == 0) continue;
      MuonJob job;
      job.p = p;
      job.per_row = p.rows >= p.cols;
      job.stats = job.per_row ? p.rows : p.cols;
      for (int s = 0; s < kStages; ++s)
        job.first_block[s] = blocks[s];
      if (p.second_moment != nullptr) {
        blocks[kStats] +=
            job.per_row ? p.count * p.rows : (p.count * p.cols + kThreads - 1) / kThreads;
        blocks[kScales] += p.count;
        scratch += p.count * job.stats + p.count;
      }
      blocks[kUpdate] += (n + kChunk - 1) / kChunk;
      jobs.push_back(job);
    }
    if (jobs.empty()) return;
    for (int64_t b : blocks)
      ENGINE_CHECK(b <= INT_MAX, std::string(backend_.name()) + ": muon update: " +
                                     std::to_string(b) + " blocks exceed one launch");
    DeviceBuffer<double> stats(backend_.allocator(), scratch);
    double* next = stats.get();
    for (MuonJob& job : jobs) {
      if (job.p.second_moment == nullptr) continue;
      job.q = next;
      job.keep = next + job.p.count * job.stats;
      next = job.keep + job.p.count;
    }
    // The table travels with the stream (an asynchronous upload), so the host does not wait.
    DeviceBuffer<MuonJob> table(backend_.allocator(), static_cast<int64_t>(jobs.size()));
    backend_.copy_from_host(table.get(), jobs.data(), jobs.size() * sizeof(MuonJob));
    const int count = static_cast<int>(jobs.size());
    if (blocks[kStats] > 0) {
      normuon_stats_kernel<<<static_cast<unsigned>(blocks[kStats]), kThreads, 0, stream_>>>(
          table.get(), count);
      ENGINE_CUDA_LAUNCHED();
      normuon_scales_kernel<<<static_cast<unsigned>(blocks[kScales]), kThreads, 0, stream_>>>(
          table.get(), count, beta2);
      ENGINE_CUDA_LAUNCHED();
    }
    muon_update_kernel<<<static_cast<unsigned>(blocks[kUpdate]), kThreads, 0, stream_>>>(
        table.get(), count);
    ENGINE_CUDA_LAUNCHED();
  }

 private:
  core::CudaBackend& backend_;
  CUstream_st* stream_;
};

}  // namespace

std::unique_ptr<MuonOps> make_cuda_muon_ops(core::Backend& backend) {
  auto* cuda = dynamic_cast<core::CudaBackend*>(&backend);
  ENGINE_CHECK(cuda != nullptr,
               std::string("the CUDA Muon ops need a CUDA backend, got ") + backend.name());
  return std::make_unique<CudaMuonOps>(*cuda);
}

}  // namespace optim
