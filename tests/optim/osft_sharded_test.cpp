// OSFT over row-sharded factors at the world size ctest runs this with: the projector equals the
// unsharded projection for gathered and cached V_high and for both row splits, k_high = 1 with
// more ranks than frozen rows does not deadlock, and the SVDs spread over the ranks equal a
// local one; an optimizer group steps on a rank that holds no rows of its factors. (The golden
// files replay through optim_replay: tests/optim ctest.)
#include <gtest/gtest.h>
#include <mpi.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/rng.h"
#include "optim/optimizer_set.h"
#include "optim/osft/osft.h"
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
    optim::OsftProjector sharded(&comm, budget, split, core::cpu_backend());
    optim::OsftProjector whole(nullptr, budget, nullptr, core::cpu_backend());
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
  const std::vector<optim::OsftFactors> spread =
      optim::osft_decompose_all(targets, &world(), core::cpu_backend());
  for (size_t i = 0; i < targets.size(); ++i) {
    optim::OsftFactors local = optim::osft_decompose(targets[i].weight, targets[i].k_high);
    for (const char* f : optim::kOsftFactorNames) {
      const core::Tensor& a = optim::factor_by_name(local, f);
      const core::Tensor& b = optim::factor_by_name(spread[i], f);
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << targets[i].name << f;
    }
  }
}

// A caller that passes only the factor rows a rank holds (the replay; a user's model sharded
// torch.chunk-style, whose trailing ranks hold no row of a small target) leaves such a rank with
// no part of the osft group at all. The group's step must still run there: its projection's
// collectives count every rank (once, that rank skipped them and the others hung or summed
// another call's data). Targets [2, 6] (k 1) and [9, 9] (k 4): with torch.chunk rows, rank 3 of
// 4, rank 5 of 6 and ranks 5-7 of 8 hold no row of either.
TEST(OsftSharded, GroupStepsOnARankWithoutRows) {
  comm::Communicator& comm = world();
  const int p = comm.size(), me = comm.rank();
  const YAML::Node groups = YAML::Load(R"(
- params: "*"
  optimizer: osft
  unfreeze_rank_ratio: 0.5
  lr: 0.01
  weight_decay: 0.01
)");
  const std::vector<comm::ParamDesc> params = {{"w", {2, 6}}, {"v", {9, 9}}};
  for (optim::RowSplit split : {&optim::osft_rows, &comm::shard_range}) {
    optim::OptimizerSet sharded(groups, params), whole(groups, params);
    auto& sharded_osft = dynamic_cast<optim::Osft&>(sharded.optimizer(0));
    sharded_osft.set_communicator(&comm, split, core::cpu_backend());
    auto& whole_osft = dynamic_cast<optim::Osft&>(whole.optimizer(0));
    whole_osft.set_communicator(nullptr, nullptr, core::cpu_backend());
    std::vector<optim::ParamShard> mine, all;  // this rank's non-empty rows; everything
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].name;
      const core::Shape& shape = params[i].shape;
      const int64_t k = sharded_osft.config().k_high_for(name, shape[0], shape[1]);
      const optim::OsftFactors f = optim::osft_decompose(random(shape, 300 + i), k);
      sharded_osft.add_target(name, shape[0], shape[1], k,
                              rows_of(f.U_high, split(shape[0], p, me)),
                              rows_of(f.V_high, split(k, p, me)));
      whole_osft.add_target(name, shape[0], shape[1], k, f.U_high, f.V_high);
      for (const char* factor : {"U_low", "S_low", "V_low"}) {
        const std::string key = name + "." + factor;
        sharded.add_alias(key, name);
        whole.add_alias(key, name);
        const core::Tensor& value = optim::factor_by_name(f, factor);
        const core::Tensor grad = random(value.shape(), 400 + 3 * i + all.size());
        all.push_back({key, value.shape(), 0, value.clone(), grad});
        const comm::Range r = split(value.size(0), p, me);
        if (r.size() > 0)
          mine.push_back({key, value.shape(), r.begin, rows_of(value, r), rows_of(grad, r)});
      }
    }
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    for (ctx.step = 1; ctx.step <= 2; ++ctx.step) {
      sharded.step(mine, ctx);
      whole.step(all, ctx);
    }
    for (const optim::ParamShard& s : mine) {
      const optim::ParamShard& w = *std::ranges::find(all, s.name, &optim::ParamShard::name);
      const comm::Range r{s.begin, s.begin + s.value.size(0)};
      const std::vector<float> a = s.value.to_vector(), b = rows_of(w.value, r).to_vector();
      for (size_t j = 0; j < a.size(); ++j)
        ASSERT_NEAR(a[j], b[j], 1e-6) << s.name << " element " << j;
    }
  }
}
