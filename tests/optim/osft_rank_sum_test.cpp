// optim::osft_sum_over_ranks, the OSFT projector's coefficient sum on a device (whose
// communicator reduces floats only), at the world size ctest runs this with, over MPI and the
// CPU backend: every rank's float64 partial sums arrive bit for bit through the float
// all-gather and are added in rank order, on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "optim/osft/osft_projector.h"

namespace {

// The world communicator, made on first use (main is tests/comm/mpi_main.cpp).
comm::Communicator& world() {
  static std::unique_ptr<comm::Communicator> w = comm::make_mpi_world();
  return *w;
}

// Rank p's partial sum i: element 0 is 1e16 on the first rank, -1e16 on the third and 1
// elsewhere (so the order of the additions shows), the others use every mantissa bit.
double partial_of(int p, int64_t i) {
  if (i == 0) return p == 0 ? 1e16 : (p == 2 ? -1e16 : 1.0);
  return std::sqrt(2.0 + static_cast<double>(p)) / (3.0 + static_cast<double>(i)) *
         (i % 2 == 0 ? 1.0 : -1e-5);
}

TEST(OsftRankSum, GathersEveryRanksPartialsBitForBitAndAddsThemInRankOrder) {
  comm::Communicator& comm = world();
  const int size = comm.size();
  const int64_t count = 7;
  std::vector<double> partial(count), gathered(static_cast<size_t>(size * count), -1.0),
      total(count, -1.0);
  for (int64_t i = 0; i < count; ++i)
    partial[static_cast<size_t>(i)] = partial_of(comm.rank(), i);
  optim::osft_sum_over_ranks(comm, *optim::make_osft_ops(core::cpu_backend()), partial.data(),
                             total.data(), gathered.data(), count);
  for (int p = 0; p < size; ++p)
    for (int64_t i = 0; i < count; ++i) {
      const double want = partial_of(p, i), got = gathered[static_cast<size_t>(p * count + i)];
      EXPECT_EQ(std::memcmp(&got, &want, sizeof(double)), 0) << "rank " << p << " element " << i;
    }
  // The rank-order sum of the gathered values (checked above to be every rank's bits): summing
  // partial_of(p, i) itself would let the compiler fuse its product into the addition (FMA),
  // which rounds once less and misses by an ulp from 4 ranks on.
  for (int64_t i = 0; i < count; ++i) {
    double want = 0;
    for (int p = 0; p < size; ++p)
      want += gathered[static_cast<size_t>(p * count + i)];
    EXPECT_EQ(total[static_cast<size_t>(i)], want) << "element " << i;
  }
  // 1e16 + 1 - 1e16 in rank order is 0 in float64 (1 in another order).
  if (size == 3) {
    EXPECT_EQ(total[0], 0.0);
  }
}

}  // namespace
