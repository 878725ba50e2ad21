#include "optim/soap/eigenbasis.h"

#include "core/check.h"

namespace optim {

void matmul(core::Backend& backend, const float* a, bool trans_a, const float* b, bool trans_b,
            float* c, int64_t m, int64_t n, int64_t k, float alpha, float beta) {
  core::GemmArgs args;
  args.trans_a = trans_a;
  args.trans_b = trans_b;
  args.m = m;
  args.n = n;
  args.k = k;
  args.alpha = alpha;
  args.beta = beta;
  backend.gemm(args, a, b, c);
}

core::Tensor backend_tensor(core::Backend& backend, const core::Shape& shape) {
  return core::Tensor::empty(shape, core::DType::F32, backend.allocator());
}

BackendIndices::BackendIndices(core::Backend& backend, int64_t n)
    : allocator_(backend.allocator()),
      bytes_(static_cast<size_t>(n > 0 ? n : 1) * sizeof(int32_t)),
      data_(static_cast<int32_t*>(allocator_.allocate(bytes_))) {}

BackendIndices::~BackendIndices() {
  allocator_.deallocate(data_, bytes_);
}

void rayleigh_quotients(core::Backend& backend, const float* k, const float* q, float* lam,
                        int64_t n) {
  core::Tensor kq = backend_tensor(backend, {n, n});
  matmul(backend, k, false, q, false, kq.data<float>(), n, n, n);
  backend.column_dots(lam, q, kq.data<float>(), n, n);
}

void sort_descending(core::Backend& backend, float* q, float* lam, int64_t n, int32_t* order) {
  backend.argsort_descending(order, lam, n);
  core::Tensor sorted_q = backend_tensor(backend, {n, n});
  backend.gather_columns(sorted_q.data<float>(), q, order, n, n);
  backend.copy(q, sorted_q.data<float>(), sorted_q.nbytes());
  core::Tensor sorted_lam = backend_tensor(backend, {n});
  backend.gather_rows(sorted_lam.data<float>(), lam, order, nullptr, n, 1);
  backend.copy(lam, sorted_lam.data<float>(), sorted_lam.nbytes());
}

void RefreshBatch::run(core::Backend& backend, int power_iter_steps, bool batched,
                       comm::Communicator* distribute) {
  // Eigendecompositions: ascending solver output, flipped to descending.
  const int ranks = distribute ? distribute->size() : 1;
  const int rank = distribute ? distribute->rank() : 0;
  ENGINE_CHECK(!distribute || distribute->device() == backend.device(),
               "distributed eigenbasis refresh: the communicator moves " +
                   distribute->device().str() + " buffers but the factors are on " +
                   backend.device().str() + " (backend " + backend.name() + ")");
  std::vector<core::Tensor> w, v;
  std::vector<core::EighTask> eigh_tasks;
  std::vector<const FactorRefresh*> eigh_jobs;
  for (const FactorRefresh& j : jobs_) {
    if (!j.eigh) continue;
    w.push_back(backend_tensor(backend, {j.n}));
    v.push_back(backend_tensor(backend, {j.n, j.n}));
    eigh_jobs.push_back(&j);
  }
  for (size_t i = 0; i < eigh_jobs.size(); ++i)
    if (static_cast<int>(i % ranks) == rank)
      eigh_tasks.push_back(
          {eigh_jobs[i]->k, w[i].data<float>(), v[i].data<float>(), eigh_jobs[i]->n});
  if (batched) {
    backend.eigh_many(eigh_tasks);
  } else {
    for (const core::EighTask& t : eigh_tasks)
      backend.eigh_many({&t, 1});
  }
  for (size_t i = 0; i < eigh_jobs.size(); ++i) {
    const FactorRefresh& j = *eigh_jobs[i];
    const int owner = static_cast<int>(i % ranks);
    if (owner != rank) continue;
    backend.reverse_columns(j.lam, w[i].data<float>(), 1, j.n);
    backend.reverse_columns(j.q, v[i].data<float>(), j.n, j.n);
  }
  if (ranks > 1) {
    std::vector<std::unique_ptr<comm::Work>> pending;
    for (size_t i = 0; i < eigh_jobs.size(); ++i) {
      const FactorRefresh& j = *eigh_jobs[i];
      const int owner = static_cast<int>(i % ranks);
      pending.push_back(distribute->broadcast_async(j.q, j.n * j.n, owner));
      pending.push_back(distribute->broadcast_async(j.lam, j.n, owner));
    }
    for (auto& work : pending)
      work->wait();
  }

  // QR power iteration: each round, all K Q products, then all QRs.
  std::vector<const FactorRefresh*> qr_jobs;
  for (const FactorRefresh& j : jobs_)
    if (!j.eigh) qr_jobs.push_back(&j);
  std::vector<core::Tensor> kq;
  for (const FactorRefresh* j : qr_jobs)
    kq.push_back(backend_tensor(backend, {j->n, j->n}));
  for (int round = 0; round < power_iter_steps && !qr_jobs.empty(); ++round) {
    std::vector<core::QrTask> tasks;
    for (size_t i = 0; i < qr_jobs.size(); ++i) {
      const FactorRefresh& j = *qr_jobs[i];
      matmul(backend, j.k, false, j.q, false, kq[i].data<float>(), j.n, j.n, j.n);
      tasks.push_back({kq[i].data<float>(), j.q, j.n, j.n});
    }
    if (batched) {
      backend.qr_many(tasks);
    } else {
      for (const core::QrTask& t : tasks)
        backend.qr_many({&t, 1});
    }
  }
  for (const FactorRefresh* j : qr_jobs) {
    if (!j->sort_after) continue;
    rayleigh_quotients(backend, j->k, j->q, j->lam, j->n);
    BackendIndices order(backend, j->n);
    sort_descending(backend, j->q, j->lam, j->n, order.get());
  }
}

}  // namespace optim
