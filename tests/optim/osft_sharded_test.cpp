// OSFT over row-sharded factors at the world size ctest runs this with: the projector equals the
// unsharded projection for gathered and cached V_high and for both row splits, k_high = 1 with
// more ranks than frozen rows does not deadlock, and the SVDs spread over the ranks equal a
// local one. (The golden files replay through optim_replay at np 1, 2, 3: tests/optim ctest.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/rng.h"
#include "optim/osft/osft_factors.h"
#include "optim/osft/osft_projector.h"

namespace {

// The world communicator, made on first use (main is tests/comm/mpi_main.cpp).
comm::Communicator& world() {
  static std::unique_ptr<comm::Communicator> w = comm::make_mpi_world();
  return *w;
}

core::Tensor random(const core::Shape& shape, uint64_t seed) {
  core::Tensor t = core::Tensor::empty(shape);
  core::fill_normal(t, seed, 0.0f, 1.0f);
  return t;
}

core::Tensor rows_of(const core::Tensor& full, comm::Range r) {
  core::Shape shape = full.shape();
  shape[0] = r.size();
  core::Tensor out = core::Tensor::empty(shape);
  if (r.size() > 0) out.copy_from(full.slice(0, r.begin, r.size()));
  return out;
}

}  // namespace

// Targets with k_high 1 and with fewer rows than ranks: every rank joins every collective
// because the decision comes from global shapes (the reference deadlocks here). Results equal
// the unsharded projection on every rank's rows, with V_high gathered each pass or cached.
TEST(OsftSharded, ProjectionEqualsUnshardedForTinyAndEmptyShards) {
  comm::Communicator& comm = world();
  struct Case {
    int64_t rows, cols, k;
  };
  const Case cases[] = {{2, 6, 1}, {9, 9, 4}, {5, 3, 1}, {30, 12, 7}};
  // Gathered and cached V_high, torch.chunk rows and the sharding plan's balanced rows.
  for (const auto& [budget, split] :
       {std::pair{int64_t{0}, &optim::osft_rows}, std::pair{int64_t{1} << 30, &optim::osft_rows},
        std::pair{int64_t{0}, &comm::shard_range}}) {
    optim::OsftProjector sharded(&comm, budget, split);
    optim::OsftProjector whole(nullptr, budget);
    std::vector<core::Tensor> xu_full, xv_full, xu, xv;
    for (size_t i = 0; i < std::size(cases); ++i) {
      const Case& c = cases[i];
      const optim::OsftFactors f = optim::osft_decompose(random({c.rows, c.cols}, 7 + i), c.k);
      const int64_t r = std::min(c.rows, c.cols) - c.k;
      const int p = comm.size(), me = comm.rank();
      std::string name = "t";
      name += std::to_string(i);
      sharded.add_target(name, c.rows, c.cols, c.k, rows_of(f.U_high, split(c.rows, p, me)),
                         rows_of(f.V_high, split(c.k, p, me)));
      whole.add_target(name, c.rows, c.cols, c.k, f.U_high, f.V_high);
      xu_full.push_back(random({c.rows, r}, 100 + i));
      xv_full.push_back(random({r, c.cols}, 200 + i));
      xu.push_back(rows_of(xu_full.back(), split(c.rows, p, me)));
      xv.push_back(rows_of(xv_full.back(), split(r, p, me)));
    }
    EXPECT_EQ(sharded.caches_v_high(), budget > 0);
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<float*> u, v, uf, vf;
      for (size_t i = 0; i < xu.size(); ++i) {
        u.push_back(xu[i].numel() ? xu[i].data<float>() : nullptr);
        v.push_back(xv[i].numel() ? xv[i].data<float>() : nullptr);
        uf.push_back(xu_full[i].data<float>());
        vf.push_back(xv_full[i].data<float>());
      }
      sharded.project(u, v);
      whole.project(uf, vf);
      for (size_t i = 0; i < xu.size(); ++i) {
        const int64_t r = xu_full[i].size(1);
        const comm::Range ur = split(cases[i].rows, comm.size(), comm.rank());
        const comm::Range vr = split(r, comm.size(), comm.rank());
        const std::vector<float> a = xu[i].to_vector(), b = rows_of(xu_full[i], ur).to_vector();
        const std::vector<float> c = xv[i].to_vector(), d = rows_of(xv_full[i], vr).to_vector();
        for (size_t j = 0; j < a.size(); ++j)
          EXPECT_NEAR(a[j], b[j], 1e-6) << "U target " << i << " pass " << pass;
        for (size_t j = 0; j < c.size(); ++j)
          EXPECT_NEAR(c[j], d[j], 1e-6) << "V target " << i << " pass " << pass;
      }
    }
  }
}

TEST(OsftSharded, SpreadDecompositionEqualsLocal) {
  std::vector<optim::OsftTargetWeight> targets;
  for (int i = 0; i < 5; ++i) {
    std::string name = "w";
    name += std::to_string(i);
    targets.push_back({name, random({8 + i, 6}, 40 + i), 2 + i % 3});
  }
  const std::vector<optim::OsftFactors> spread = optim::osft_decompose_all(targets, &world());
  for (size_t i = 0; i < targets.size(); ++i) {
    optim::OsftFactors local = optim::osft_decompose(targets[i].weight, targets[i].k_high);
    for (const char* f : optim::kOsftFactorNames) {
      const core::Tensor& a = optim::factor_by_name(local, f);
      const core::Tensor& b = optim::factor_by_name(spread[i], f);
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << targets[i].name << f;
    }
  }
}
