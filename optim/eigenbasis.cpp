#include "optim/eigenbasis.h"

#include <algorithm>
#include <numeric>

#include "engine/core/check.h"

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

void rayleigh_quotients(core::Backend& backend, const float* k, const float* q, float* lam,
                        int64_t n) {
  std::vector<float> kq(static_cast<size_t>(n * n));
  matmul(backend, k, false, q, false, kq.data(), n, n, n);
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
      s += static_cast<double>(q[i * n + j]) * kq[i * n + j];
    lam[j] = static_cast<float>(s);
  }
}

std::vector<int64_t> descending_order(const float* lam, int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return lam[x] > lam[y]; });
  return order;
}

void permute_columns(float* a, int64_t rows, int64_t cols, const std::vector<int64_t>& order) {
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    float* r = a + i * cols;
    for (int64_t j = 0; j < cols; ++j)
      row[j] = r[order[j]];
    std::copy(row.begin(), row.end(), r);
  }
}

void permute_rows(float* a, int64_t rows, int64_t cols, const std::vector<int64_t>& order) {
  std::vector<float> old(a, a + rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    std::copy_n(old.data() + order[i] * cols, cols, a + i * cols);
}

void RefreshBatch::run(core::Backend& backend, int power_iter_steps, bool batched,
                       comm::Communicator* distribute) {
  // Eigendecompositions: ascending solver output, flipped to descending.
  const int ranks = distribute ? distribute->size() : 1;
  const int rank = distribute ? distribute->rank() : 0;
  std::vector<std::vector<float>> w, v;
  std::vector<core::EighTask> eigh_tasks;
  std::vector<const FactorRefresh*> eigh_jobs;
  for (const FactorRefresh& j : jobs_) {
    if (!j.eigh) continue;
    w.emplace_back(j.n);
    v.emplace_back(j.n * j.n);
    eigh_jobs.push_back(&j);
  }
  for (size_t i = 0; i < eigh_jobs.size(); ++i)
    if (static_cast<int>(i % ranks) == rank)
      eigh_tasks.push_back({eigh_jobs[i]->k, w[i].data(), v[i].data(), eigh_jobs[i]->n});
  if (batched) {
    backend.eigh_many(eigh_tasks);
  } else {
    for (const core::EighTask& t : eigh_tasks)
      backend.eigh_many({&t, 1});
  }
  for (size_t i = 0; i < eigh_jobs.size(); ++i) {
    const FactorRefresh& j = *eigh_jobs[i];
    const int64_t n = j.n;
    const int owner = static_cast<int>(i % ranks);
    if (owner != rank) continue;
    for (int64_t c = 0; c < n; ++c) {
      j.lam[c] = w[i][n - 1 - c];
      for (int64_t r = 0; r < n; ++r)
        j.q[r * n + c] = v[i][r * n + (n - 1 - c)];
    }
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
  std::vector<std::vector<float>> kq(qr_jobs.size());
  for (size_t i = 0; i < qr_jobs.size(); ++i)
    kq[i].resize(static_cast<size_t>(qr_jobs[i]->n * qr_jobs[i]->n));
  for (int round = 0; round < power_iter_steps && !qr_jobs.empty(); ++round) {
    std::vector<core::QrTask> tasks;
    for (size_t i = 0; i < qr_jobs.size(); ++i) {
      const FactorRefresh& j = *qr_jobs[i];
      matmul(backend, j.k, false, j.q, false, kq[i].data(), j.n, j.n, j.n);
      tasks.push_back({kq[i].data(), j.q, j.n, j.n});
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
    const std::vector<int64_t> order = descending_order(j->lam, j->n);
    permute_columns(j->q, j->n, j->n, order);
    std::vector<float> sorted(static_cast<size_t>(j->n));
    for (int64_t c = 0; c < j->n; ++c)
      sorted[c] = j->lam[order[c]];
    std::copy(sorted.begin(), sorted.end(), j->lam);
  }
}

}  // namespace optim
