// ShardingPlan as a pure function of (table, world size, rank, stage): split sizes, owners,
// local shapes and the errors for bad requests. No communication.
#include "comm/sharding_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"

using comm::ParamDesc;
using comm::Placement;
using comm::Range;
using comm::ShardingPlan;
using core::Shape;

TEST(ShardRange, CoversEverythingOnceWithSizesWithinOne) {
  for (int64_t n : {0, 1, 2, 5, 50257, 50304}) {
    for (int w = 1; w <= 8; ++w) {
      int64_t next = 0, lo = n, hi = 0;
      for (int r = 0; r < w; ++r) {
        Range range = comm::shard_range(n, w, r);
        EXPECT_EQ(range.begin, next) << n << " over " << w;
        next = range.end;
        lo = std::min(lo, range.size());
        hi = std::max(hi, range.size());
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(hi - lo, 1);
    }
  }
  // 50257 rows over 3 ranks: floor(r n / 3) boundaries.
  EXPECT_EQ(comm::shard_range(50257, 3, 0), (Range{0, 16752}));
  EXPECT_EQ(comm::shard_range(50257, 3, 1), (Range{16752, 33504}));
  EXPECT_EQ(comm::shard_range(50257, 3, 2), (Range{33504, 50257}));
  EXPECT_EQ(comm::shard_range(2, 4, 0).size(), 0);
  EXPECT_THROW(comm::shard_range(5, 4, 4), core::Error);
}

TEST(ShardingPlan, LocalShapesOfShardOwnedAndReplicate) {
  std::vector<ParamDesc> params = {
      {"embed.weight", {50304, 8}, Placement::shard(0), 0},
      {"blocks.0.mlp.fc.weight", {32, 10}, Placement::shard(1), 1},
      {"blocks.0.attn.proj.weight", {8, 8}, Placement::owned(2), 1},
      {"ln_f.weight", {8}, Placement::replicate(), 2},
  };
  ShardingPlan plan(params, 3, 1, 2);
  EXPECT_EQ(plan.local_shape(0), (Shape{16768, 8}));
  EXPECT_EQ(plan.range(0, 2), (Range{33536, 50304}));
  EXPECT_EQ(plan.local_shape(1, 0), (Shape{32, 3}));
  EXPECT_EQ(plan.local_shape(1, 2), (Shape{32, 4}));
  EXPECT_EQ(plan.counts(1), (std::vector<int64_t>{96, 96, 128}));
  EXPECT_EQ(plan.local_shape(2), (Shape{0, 8}));
  EXPECT_EQ(plan.local_shape(2, 2), (Shape{8, 8}));
  EXPECT_EQ(plan.local_shape(3), (Shape{8}));
  EXPECT_EQ(plan.placement(2).str(), "Owned(2)");
  EXPECT_EQ(plan.index("ln_f.weight"), 3u);
  EXPECT_EQ(plan.layers(), (std::vector<int>{0, 1, 2}));
  // The local slice: the split dimension (0 unless Shard) and this rank's range along it.
  EXPECT_EQ(plan.local_slice(0).dim, 0);
  EXPECT_EQ(plan.local_slice(0).range, (Range{16768, 33536}));
  EXPECT_EQ(plan.local_slice(1, 2).dim, 1);
  EXPECT_EQ(plan.local_slice(1, 2).range, (Range{6, 10}));
  EXPECT_EQ(plan.local_slice(2, 1).range, (Range{0, 0}));
  EXPECT_EQ(plan.local_slice(2, 2).range, (Range{0, 8}));
  EXPECT_EQ(plan.local_slice(3, 0).dim, 0);
  EXPECT_EQ(plan.local_slice(3, 0).range, (Range{0, 8}));
  EXPECT_EQ(plan.layer_params(1), (std::vector<size_t>{1, 2}));
  EXPECT_NE(plan.describe().find("blocks.0.mlp.fc.weight [32, 10] Shard(1) local [32, 3]"),
            std::string::npos)
      << plan.describe();
}

TEST(ShardingPlan, StageZeroReplicatesEverything) {
  ShardingPlan plan({{"a", {10, 3}, Placement::shard(0), 0}, {"b", {4}, Placement::owned(), 0}}, 4,
                    3, 0);
  EXPECT_TRUE(plan.placement(0).is_replicate());
  EXPECT_TRUE(plan.placement(1).is_replicate());
  EXPECT_EQ(plan.local_shape(0), (Shape{10, 3}));
}

TEST(ShardingPlan, AutomaticOwnersBalanceElementsDeterministically) {
  // Twelve matrices of four sizes over four ranks: largest first to the least loaded rank.
  std::vector<ParamDesc> params;
  const int64_t rows[] = {64, 16, 32, 8};
  for (int k = 0; k < 12; ++k) {
    std::string name = "m";
    name += std::to_string(k);  // (not "m" + ...: GCC 12 -Wrestrict false positive)
    params.push_back({name, {rows[k % 4], 16}, Placement::owned(), 0});
  }
  ShardingPlan a(params, 4, 0, 1);
  ShardingPlan b(params, 4, 3, 1);
  // Rows 64,64,64 | 32 to rank 3, 32 again to rank 3, 32 to rank 0 | 16s to 1,2,3 | 8s to 1,2,3.
  EXPECT_EQ(a.state_numel(0), 96 * 16);
  for (int r = 1; r < 4; ++r)
    EXPECT_EQ(a.state_numel(r), 88 * 16) << "rank " << r;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(a.placement(i), b.placement(i)) << "every rank must compute the same owners";
    EXPECT_GE(a.placement(i).owner, 0);
  }
  // The three largest go to ranks 0, 1, 2 in table order.
  EXPECT_EQ(a.placement(0).owner, 0);
  EXPECT_EQ(a.placement(4).owner, 1);
  EXPECT_EQ(a.placement(8).owner, 2);
}

TEST(ShardingPlan, AutomaticOwnersAccountForShardsAndFixedOwners) {
  std::vector<ParamDesc> params = {
      {"fixed", {100}, Placement::owned(0), 0},
      {"sharded", {9}, Placement::shard(0), 0},
      {"auto", {50}, Placement::owned(), 0},
  };
  ShardingPlan plan(params, 2, 0, 2);
  EXPECT_EQ(plan.placement(2).owner, 1);
  EXPECT_EQ(plan.state_numel(0), 104);
  EXPECT_EQ(plan.state_numel(1), 55);
}

TEST(ShardingPlan, BadRequestsNameTheParameter) {
  auto message = [](std::vector<ParamDesc> params, int world, int rank, int stage) {
    try {
      ShardingPlan plan(std::move(params), world, rank, stage);
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"blocks.3.x", {4}, Placement::shard(1), 0}}, 2, 0, 2).find("blocks.3.x"),
            std::string::npos);
  EXPECT_NE(message({{"w", {4}, Placement::owned(5), 0}}, 2, 0, 2).find("Owned(5)"),
            std::string::npos);
  EXPECT_NE(message({{"w", {4}, {}, 0}, {"w", {2}, {}, 0}}, 1, 0, 1).find("w twice"),
            std::string::npos);
  EXPECT_NE(message({{"w", {4}, {}, 0}}, 2, 2, 1).find("rank 2"), std::string::npos);
  EXPECT_NE(message({{"w", {4}, {}, 0}}, 2, 0, 4).find("stage 4"), std::string::npos);
  ShardingPlan plan({{"w", {4}, {}, 0}}, 1, 0, 1);
  EXPECT_THROW(plan.index("missing"), core::Error);
}
