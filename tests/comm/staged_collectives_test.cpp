// The staged device collectives (comm.device_collectives: mpi) on the CPU backend: every
// collective through the staging code gives the plain MPI communicator's result bit for bit,
// blocking and async, several in flight at once, uneven and empty blocks, on a split too.
// Inputs are non-integer floats, so a different reduction order would show (MPI's blocking and
// nonblocking algorithms differ in order, so each staged form is compared with the same plain
// form).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "comm/communicator.h"
#include "comm/staged_communicator.h"
#include "core/backend.h"
#include "core/rng.h"

using comm::Communicator;
using comm::ReduceOp;

namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = comm::make_mpi_world();
  return *w;
}

// Rank r's element i of stream `seed`: a float with a full mantissa.
std::vector<float> inputs(uint64_t seed, int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(
        std::sin(0.37 *
                 static_cast<double>(core::rng_hash(seed * 7919u + rank, static_cast<uint64_t>(i)) %
                                     100003)) *
        3.1);
  return v;
}

std::vector<int64_t> uneven_counts(int size, int trial) {
  std::vector<int64_t> counts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r)
    counts[r] = (r == size - 1 && trial % 2 == 0) ? 0 : 1 + (r * 131 + trial * 977) % 1500;
  return counts;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data() of an empty vector, even for 0 bytes (UBSan).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Runs every collective on `plain` and `staged` (the same ranks) and compares the bits.
void expect_same_as_plain(Communicator& plain, Communicator& staged, uint64_t seed) {
  const int r = plain.rank(), W = plain.size();
  for (int64_t n : {0, 1, 5, 4099}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      std::vector<float> a = inputs(seed + n, r, n), b = a, c = a, d = a;
      plain.all_reduce(a.data(), n, op);
      staged.all_reduce(b.data(), n, op);
      plain.all_reduce_async(c.data(), n, op)->wait();
      staged.all_reduce_async(d.data(), n, op)->wait();
      EXPECT_TRUE(same_bits(a, b)) << "all_reduce n=" << n << " " << comm::reduce_op_name(op);
      EXPECT_TRUE(same_bits(c, d)) << "all_reduce async n=" << n;
    }
  }
  for (int trial = 0; trial < 4; ++trial) {
    const std::vector<int64_t> counts = uneven_counts(W, trial);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const std::vector<float> send = inputs(seed + 100 + trial, r, total);
    std::vector<float> a(counts[r]), b(counts[r]), c(counts[r]), d(counts[r]);
    plain.reduce_scatter(send.data(), a.data(), counts, ReduceOp::Sum);
    staged.reduce_scatter(send.data(), b.data(), counts, ReduceOp::Sum);
    plain.reduce_scatter_async(send.data(), c.data(), counts, ReduceOp::Sum)->wait();
    staged.reduce_scatter_async(send.data(), d.data(), counts, ReduceOp::Sum)->wait();
    EXPECT_TRUE(same_bits(a, b)) << "reduce_scatter trial " << trial;
    EXPECT_TRUE(same_bits(c, d)) << "reduce_scatter async trial " << trial;

    const std::vector<float> mine = inputs(seed + 200 + trial, r, counts[r]);
    std::vector<float> ga(total), gb(total), gc(total);
    plain.all_gather(mine.data(), ga.data(), counts);
    staged.all_gather(mine.data(), gb.data(), counts);
    staged.all_gather_async(mine.data(), gc.data(), counts)->wait();
    EXPECT_TRUE(same_bits(ga, gb)) << "all_gather trial " << trial;
    EXPECT_TRUE(same_bits(ga, gc)) << "all_gather async trial " << trial;
  }
  for (int n : {1, 2, 5}) {  // the device float64 sums: staged through the host
    std::vector<double> a(static_cast<size_t>(n)), b;
    for (int i = 0; i < n; ++i)
      a[static_cast<size_t>(i)] = 1.0 / (3 + r + i);
    b = a;
    plain.all_reduce(a.data(), n, ReduceOp::Sum);
    staged.all_reduce_on_device(b.data(), n, ReduceOp::Sum);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0) << "n=" << n;
  }
  std::vector<float> x = inputs(seed + 300, r, 777), y = x;
  plain.broadcast(x.data(), 777, W - 1);
  staged.broadcast(y.data(), 777, W - 1);
  EXPECT_TRUE(same_bits(x, y)) << "broadcast";
}

}  // namespace

TEST(StagedCollectives, EqualThePlainMpiResultsBitForBit) {
  std::unique_ptr<Communicator> staged = comm::make_staged(world(), core::cpu_backend());
  EXPECT_EQ(staged->device(), core::cpu_backend().device());
  EXPECT_EQ(staged->rank(), world().rank());
  expect_same_as_plain(world(), *staged, 1);
}

TEST(StagedCollectives, SplitsStageToo) {
  std::unique_ptr<Communicator> staged = comm::make_staged(world(), core::cpu_backend());
  std::unique_ptr<Communicator> plain_half = world().split(world().rank() % 2, 0);
  std::unique_ptr<Communicator> staged_half = staged->split(world().rank() % 2, 0);
  ASSERT_EQ(staged_half->size(), plain_half->size());
  expect_same_as_plain(*plain_half, *staged_half, 2);
}

TEST(StagedCollectives, SeveralInFlightAtOnce) {
  std::unique_ptr<Communicator> staged = comm::make_staged(world(), core::cpu_backend());
  const int r = world().rank();
  std::vector<std::vector<float>> ours, ref;
  std::vector<std::unique_ptr<comm::Work>> works;
  for (int k = 0; k < 4; ++k) {
    ours.push_back(inputs(50 + k, r, 1000 + k));
    ref.push_back(ours.back());
  }
  for (int k = 0; k < 4; ++k)
    works.push_back(staged->all_reduce_async(ours[k].data(), 1000 + k, ReduceOp::Sum));
  for (int k = 3; k >= 0; --k)
    works[k]->wait();
  for (int k = 0; k < 4; ++k) {
    world().all_reduce_async(ref[k].data(), 1000 + k, ReduceOp::Sum)->wait();
    EXPECT_TRUE(same_bits(ours[k], ref[k])) << "collective " << k;
  }
  EXPECT_EQ(staged->stats()[comm::Collective::AllReduce].calls, 4);
}
