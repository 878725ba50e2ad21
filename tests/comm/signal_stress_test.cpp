// Sparse-row reductions while SIGTERM lands at random moments on random threads (issue 63: CI
// once died of a segfault in free() inside comm::reduce_sparse_rows, its heap corrupted before
// the call, while e2e_slurm's scancel check stopped an np 2 run). Every rank runs what a stopped
// training step runs: the collective watchdog's thread probing its communicator every 50 ms
// (MPI_THREAD_MULTIPLE), dense gradient reductions in flight on the main thread while the
// embedding's sparse rows are reduced, on the main thread (zero.progress=poll) or on a
// communication thread over a split communicator (zero.progress=thread), and the engine's stop
// handler (record-only, SA_RESTART) taking a signal every 100 microseconds or so. Each round's
// local parts must equal the sum of every rank's contributions exactly (small integers), and the
// heap must stay whole (the main thread grows and frees vectors meanwhile; run under ASan or TSan
// for a sharper look: ENGINE_STRESS_ROUNDS sets the rounds, default 2000).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_stream.h"
#include "comm/communicator.h"
#include "comm/shard_ops.h"
#include "comm/sharding_plan.h"
#include "comm/watchdog.h"
#include "comm/watched_communicator.h"
#include "tests/comm/test_data.h"

namespace {

using core::Tensor;

std::atomic<int64_t> g_received{0};

// As engine::install_stop_signals records a signal, without resetting the handler (a stress test
// takes thousands).
extern "C" void record_signal(int) {
  g_received.fetch_add(1, std::memory_order_relaxed);
}

constexpr int64_t kRows = 512, kWidth = 16, kDenseRows = 64;
constexpr int kTouched = 8;  // rows each rank touches a round: the union stays sparse at np 4

// The row and value rank q adds to the embedding's gradient in round r, its k-th touch.
int64_t touched_row(int64_t round, int q, int k) {
  return (round * 7 + q * 13 + k * 31) % kRows;
}

// Every rank's contributions of round r summed: what each local part must hold.
std::vector<float> expected_sparse(int64_t round, int size) {
  std::vector<float> sum(static_cast<size_t>(kRows * kWidth), 0.0f);
  for (int q = 0; q < size; ++q)
    for (int k = 0; k < kTouched; ++k)
      for (int64_t c = 0; c < kWidth; ++c)
        sum[touched_row(round, q, k) * kWidth + c] += comm_test::value(
            static_cast<uint64_t>(round), static_cast<uint64_t>(q), k * kWidth + c);
  return sum;
}

std::vector<float> rows_of(const std::vector<float>& full, comm::Range range) {
  return std::vector<float>(full.begin() + range.begin * kWidth, full.begin() + range.end * kWidth);
}

TEST(SignalStress, SparseRowReductionsUnderSignalsStayExact) {
  const char* env = std::getenv("ENGINE_STRESS_ROUNDS");
  const int64_t rounds = env != nullptr ? std::atoll(env) : 2000;
  comm::Watchdog watchdog(60.0);
  auto world = comm::make_mpi_world();
  comm::WatchedCommunicator comm(*world, watchdog);
  const int rank = comm.rank(), size = comm.size();
  std::vector<comm::ParamDesc> descs(2);
  descs[0] = {"embed.weight", {kRows, kWidth}, comm::Placement::shard(0), -1, true};
  descs[1] = {"w", {kDenseRows, kWidth}, comm::Placement::shard(0), 0, false};
  const comm::ShardingPlan plan(descs, size, rank, 2);
  std::unique_ptr<comm::Communicator> stream_comm = comm.split(0, rank);
  comm::CommStream stream;

  struct sigaction action {
  }, before{};
  action.sa_handler = record_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ASSERT_EQ(::sigaction(SIGTERM, &action, &before), 0);
  // SIGTERM to the process every 0-200 us: the kernel gives it to any thread not blocking it (the
  // main thread, the watchdog's, the communication thread, OpenMP's), inside MPI or not.
  std::atomic<bool> done{false};
  std::atomic<int64_t> sent{0};
  std::thread signaller([&] {
    std::mt19937 rng(static_cast<unsigned>(1234 + rank));
    while (!done) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
      ::kill(::getpid(), SIGTERM);
      sent.fetch_add(1);
    }
  });

  const Tensor full_sparse = Tensor::zeros({kRows, kWidth});
  const Tensor local_sparse = Tensor::empty(plan.local_shape(0));
  const Tensor full_dense = Tensor::empty({kDenseRows, kWidth});
  const Tensor local_dense = Tensor::empty(plan.local_shape(1));
  const comm::Range own_sparse = plan.local_slice(0).range;
  int64_t mismatches = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    float* g = full_sparse.data<float>();
    std::fill(g, g + kRows * kWidth, 0.0f);
    for (int k = 0; k < kTouched; ++k)
      for (int64_t c = 0; c < kWidth; ++c)
        g[touched_row(round, rank, k) * kWidth + c] += comm_test::value(
            static_cast<uint64_t>(round), static_cast<uint64_t>(rank), k * kWidth + c);
    float* d = full_dense.data<float>();
    for (int64_t e = 0; e < kDenseRows * kWidth; ++e)
      d[e] = comm_test::value(static_cast<uint64_t>(round), 100 + static_cast<uint64_t>(rank), e);
    // The dense reduction is in flight while the sparse rows are reduced, as in a backward.
    std::unique_ptr<comm::Work> dense =
        comm::reduce_grad_async(comm, plan, 1, full_dense, local_dense, comm::ReduceOp::Sum);
    int64_t reduced = 0;
    if (round % 2 == 0) {
      reduced =
          comm::reduce_sparse_rows(comm, plan, 0, full_sparse, local_sparse, comm::ReduceOp::Sum);
    } else {
      std::unique_ptr<comm::Work> sparse = stream.submit([&] {
        reduced = comm::reduce_sparse_rows(*stream_comm, plan, 0, full_sparse, local_sparse,
                                           comm::ReduceOp::Sum);
      });
      // The main thread allocates and frees meanwhile: a corrupted heap fails here or there.
      std::vector<std::vector<int64_t>> churn;
      for (int i = 0; i < 64; ++i) {
        churn.emplace_back();
        for (int j = 0; j < 1 + i * 3; ++j)
          churn.back().push_back(j);
      }
      sparse->wait();
    }
    dense->wait();
    EXPECT_GT(reduced, 0);
    EXPECT_LE(reduced, static_cast<int64_t>(kTouched) * size);
    const std::vector<float> want = rows_of(expected_sparse(round, size), own_sparse);
    if (local_sparse.to_vector() != want) ++mismatches;
    std::vector<float> dense_want;
    const comm::Range own_dense = plan.local_slice(1).range;
    for (int64_t e = own_dense.begin * kWidth; e < own_dense.end * kWidth; ++e) {
      float s = 0.0f;
      for (int q = 0; q < size; ++q)
        s += comm_test::value(static_cast<uint64_t>(round), 100 + static_cast<uint64_t>(q), e);
      dense_want.push_back(s);
    }
    if (local_dense.to_vector() != dense_want) ++mismatches;
  }
  done = true;
  signaller.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the last one is handled
  ::sigaction(SIGTERM, &before, nullptr);
  EXPECT_EQ(mismatches, 0) << "rank " << rank;
  EXPECT_GT(g_received.load(), 0) << "rank " << rank << ": no signal landed";
  if (rank == 0)
    std::printf("[ measured ] %lld rounds at np %d, %lld signals sent to rank 0, %lld handled\n",
                static_cast<long long>(rounds), size, static_cast<long long>(sent.load()),
                static_cast<long long>(g_received.load()));
}

}  // namespace
