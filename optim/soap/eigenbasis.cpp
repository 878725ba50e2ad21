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

core::Tensor rayleigh_quotients(core::Backend& backend, const float* k, const float* q, float* lam,
                                int64_t n) {
  core::Tensor kq = backend_tensor(backend, {n, n});
  matmul(backend, k, false, q, false, kq.data<float>(), n, n, n);
  backend.column_dots(lam, q, kq.data<float>(), n, n);
  return kq;
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

namespace {

// Descending eigen data of one factor from the solver's ascending w [n] and v [n, n].
void take_descending(core::Backend& backend, const FactorRefresh& j, const float* w,
                     const float* v) {
  backend.reverse_columns(j.lam, w, 1, j.n);
  backend.reverse_columns(j.q, v, j.n, j.n);
}

// lam <- the Rayleigh quotients of q's columns, then both sorted descending.
void sort_by_rayleigh_quotients(core::Backend& backend, const FactorRefresh& j) {
  rayleigh_quotients(backend, j.k, j.q, j.lam, j.n);
  BackendIndices order(backend, j.n);
  sort_descending(backend, j.q, j.lam, j.n, order.get());
}

// The amortized pre-sort: P = K Q of the previous basis, lam <- the Rayleigh quotients
// q_j^T p_j, Q and lam sorted descending by them; returns P with its columns in the new order
// (K times the sorted basis, the first power round's input).
core::Tensor presort_by_rayleigh_quotients(core::Backend& backend, const FactorRefresh& j) {
  const int64_t n = j.n;
  const core::Tensor kq = rayleigh_quotients(backend, j.k, j.q, j.lam, n);
  sort_descending(backend, j.q, j.lam, n, j.sort_before_order);
  core::Tensor sorted_kq = backend_tensor(backend, {n, n});
  backend.gather_columns(sorted_kq.data<float>(), kq.data<float>(), j.sort_before_order, n, n);
  return sorted_kq;
}

// Power round `round` of one factor: Q <- qr(K Q).Q, or qr(P).Q in the first round when the
// pre-sort left P = K Q (`presorted_kq` defined).
core::QrTask power_round(const FactorRefresh& j, const core::Tensor& presorted_kq, int round) {
  if (round == 0 && presorted_kq.defined())
    return {presorted_kq.data<float>(), j.q, j.n, j.n, nullptr};
  return {j.q, j.q, j.n, j.n, j.k};
}

}  // namespace

void refresh_factor(core::Backend& backend, const FactorRefresh& j, int power_iter_steps,
                    SoapPhaseTimes* times) {
  const int64_t n = j.n;
  if (n == 0) return;
  if (j.eigh) {
    core::Tensor w = backend_tensor(backend, {n}), v = backend_tensor(backend, {n, n});
    {
      PhaseTimer timer(times, backend, SoapPhase::Solver, true);
      const core::EighTask task{j.k, w.data<float>(), v.data<float>(), n};
      backend.eigh_many({&task, 1});
    }
    PhaseTimer timer(times, backend, SoapPhase::Sort, true);
    take_descending(backend, j, w.data<float>(), v.data<float>());
    return;
  }
  core::Tensor presorted_kq;
  if (j.sort_before_order) {
    PhaseTimer timer(times, backend, SoapPhase::Sort, true);
    presorted_kq = presort_by_rayleigh_quotients(backend, j);
  }
  {
    PhaseTimer timer(times, backend, SoapPhase::Solver, true);
    for (int round = 0; round < power_iter_steps; ++round) {
      const core::QrTask task = power_round(j, presorted_kq, round);
      backend.qr_many({&task, 1});
    }
  }
  if (!j.sort_after) return;
  PhaseTimer timer(times, backend, SoapPhase::Sort, true);
  sort_by_rayleigh_quotients(backend, j);
}

void refresh_factors_batched(core::Backend& backend, std::span<const FactorRefresh> jobs,
                             int power_iter_steps, SoapPhaseTimes* times) {
  // Eigendecompositions: ascending solver output, flipped to descending.
  std::vector<core::Tensor> w, v;
  std::vector<core::EighTask> eigh_tasks;
  std::vector<const FactorRefresh*> eigh_jobs, qr_jobs;
  for (const FactorRefresh& j : jobs) {
    if (j.n == 0) continue;
    if (!j.eigh) {
      qr_jobs.push_back(&j);
      continue;
    }
    w.push_back(backend_tensor(backend, {j.n}));
    v.push_back(backend_tensor(backend, {j.n, j.n}));
    eigh_jobs.push_back(&j);
    eigh_tasks.push_back({j.k, w.back().data<float>(), v.back().data<float>(), j.n});
  }
  {
    PhaseTimer timer(times, backend, SoapPhase::Solver);
    backend.eigh_many(eigh_tasks);
  }
  {
    PhaseTimer timer(times, backend, SoapPhase::Sort);
    for (size_t i = 0; i < eigh_jobs.size(); ++i)
      take_descending(backend, *eigh_jobs[i], w[i].data<float>(), v[i].data<float>());
  }

  // QR power iteration: each round, every Q <- qr(K Q).Q as one qr_many (after the pre-sorts).
  std::vector<core::Tensor> presorted_kq(qr_jobs.size());
  {
    PhaseTimer timer(times, backend, SoapPhase::Sort);
    for (size_t i = 0; i < qr_jobs.size(); ++i)
      if (qr_jobs[i]->sort_before_order)
        presorted_kq[i] = presort_by_rayleigh_quotients(backend, *qr_jobs[i]);
  }
  {
    PhaseTimer timer(times, backend, SoapPhase::Solver);
    for (int round = 0; round < power_iter_steps && !qr_jobs.empty(); ++round) {
      std::vector<core::QrTask> tasks;
      for (size_t i = 0; i < qr_jobs.size(); ++i)
        tasks.push_back(power_round(*qr_jobs[i], presorted_kq[i], round));
      backend.qr_many(tasks);
    }
  }
  PhaseTimer timer(times, backend, SoapPhase::Sort);
  for (const FactorRefresh* j : qr_jobs)
    if (j->sort_after) sort_by_rayleigh_quotients(backend, *j);
}

void RefreshBatch::run(core::Backend& backend, SoapOps& ops, int power_iter_steps, bool batched,
                       comm::Communicator* distribute, SoapPhaseTimes* times) {
  const int ranks = distribute ? distribute->size() : 1;
  const int rank = distribute ? distribute->rank() : 0;
  ENGINE_CHECK(!distribute || distribute->device() == backend.device(),
               "distributed eigenbasis refresh: the communicator moves " +
                   distribute->device().str() + " buffers but the factors are on " +
                   backend.device().str() + " (backend " + backend.name() + ")");
  // Eigendecomposition i runs on rank i % ranks; every QR-path factor on every rank.
  std::vector<FactorRefresh> mine;
  std::vector<std::pair<const FactorRefresh*, int>> shared;  // (job, owner)
  int64_t eigh_index = 0;
  for (const FactorRefresh& j : jobs_) {
    const int owner = j.eigh ? static_cast<int>(eigh_index++ % ranks) : rank;
    if (owner == rank) mine.push_back(j);
    if (j.eigh && ranks > 1) shared.emplace_back(&j, owner);
  }
  ops.refresh(mine, power_iter_steps, batched, times);
  if (shared.empty()) return;
  std::vector<std::unique_ptr<comm::Work>> pending;
  for (const auto& [j, owner] : shared) {
    pending.push_back(distribute->broadcast_async(j->q, j->n * j->n, owner));
    pending.push_back(distribute->broadcast_async(j->lam, j->n, owner));
  }
  for (auto& work : pending)
    work->wait();
}

}  // namespace optim
