// The NCCL communicator on device buffers against the serial reference of the MPI tests: every
// collective, uneven counts with zeros, every root, split groups, and the host-buffer forms
// that go through MPI. One GPU per rank (rank r on GPU r); skips without them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_communicator.h"
#include "core/backend.h"
#include "core/tensor.h"
#include "test_data.h"

using comm::Communicator;
using comm::ReduceOp;
using comm_test::values;

namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = comm::make_mpi_world();
  return *w;
}

// This rank's GPU and the NCCL communicator over the world, made once and never destroyed: the
// communicator's MPI group must not be freed after MPI_Finalize.
struct Gpu {
  std::unique_ptr<core::Backend> backend;
  std::unique_ptr<Communicator> nccl;
};

Gpu* gpu() {
  static Gpu* g = [] {
    if (core::cuda_device_count() < world().size()) return static_cast<Gpu*>(nullptr);
    auto* made = new Gpu;
    made->backend = core::make_cuda_backend(world().rank());
    made->nccl = comm::make_nccl(world(), *made->backend);
    return made;
  }();
  return g;
}

#define REQUIRE_GPU_PER_RANK()                                                 \
  if (gpu() == nullptr)                                                        \
  GTEST_SKIP() << "needs one GPU per rank: " << world().size() << " rank(s), " \
               << core::cuda_device_count() << " CUDA device(s) visible"

// A device buffer holding `host`, and back.
core::Tensor upload(const std::vector<float>& host) {
  core::Tensor t = core::Tensor::empty({static_cast<int64_t>(host.size())}, core::DType::F32,
                                       gpu()->backend->allocator());
  if (!host.empty()) gpu()->backend->copy_from_host(t.raw_data(), host.data(), t.nbytes());
  return t;
}

std::vector<float> download(const core::Tensor& t) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  if (!host.empty()) gpu()->backend->copy_to_host(host.data(), t.raw_data(), t.nbytes());
  return host;
}

float reduce_ref(ReduceOp op, uint64_t seed, int size, int64_t i) {
  float acc = comm_test::value(seed, 0, i);
  for (int r = 1; r < size; ++r) {
    const float v = comm_test::value(seed, static_cast<uint64_t>(r), i);
    acc = op == ReduceOp::Max ? std::max(acc, v) : op == ReduceOp::Min ? std::min(acc, v) : acc + v;
  }
  return op == ReduceOp::Avg ? acc * (1.0f / static_cast<float>(size)) : acc;
}

std::vector<int64_t> counts_of(uint64_t seed, int trial, int size) {
  std::vector<int64_t> counts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r)
    counts[static_cast<size_t>(r)] = comm_test::random_count(seed + trial, r, 3000);
  if (trial == 0) std::fill(counts.begin(), counts.end(), 0);
  if (trial == 1) std::fill(counts.begin(), counts.end(), 4097);
  return counts;
}

TEST(NcclCollectives, AllReduceEveryOp) {
  REQUIRE_GPU_PER_RANK();
  Communicator& c = *gpu()->nccl;
  EXPECT_EQ(c.device(), core::Device::cuda(world().rank()));
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
      core::Tensor buf = upload(values(51, c.rank(), n));
      c.all_reduce_async(buf.data<float>(), n, op)->wait();
      const std::vector<float> got = download(buf);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i)
        bad += got[static_cast<size_t>(i)] != reduce_ref(op, 51, c.size(), i);
      EXPECT_EQ(bad, 0) << comm::reduce_op_name(op) << " n " << n;
    }
  }
}

TEST(NcclCollectives, ReduceScatterAndAllGatherUnevenCounts) {
  REQUIRE_GPU_PER_RANK();
  Communicator& c = *gpu()->nccl;
  for (int trial = 0; trial < 6; ++trial) {
    const std::vector<int64_t> counts = counts_of(61, trial, c.size());
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t mine = counts[static_cast<size_t>(c.rank())];
    int64_t offset = 0;
    for (int r = 0; r < c.rank(); ++r)
      offset += counts[static_cast<size_t>(r)];

    core::Tensor send = upload(values(61 + trial, c.rank(), total));
    core::Tensor recv = upload(std::vector<float>(static_cast<size_t>(mine), -999.0f));
    c.reduce_scatter(send.data<float>(), recv.data<float>(), counts, ReduceOp::Sum);
    const std::vector<float> got = download(recv);
    int64_t bad = 0;
    for (int64_t i = 0; i < mine; ++i)
      bad += got[static_cast<size_t>(i)] !=
             reduce_ref(ReduceOp::Sum, 61 + trial, c.size(), offset + i);
    EXPECT_EQ(bad, 0) << "reduce_scatter trial " << trial;

    core::Tensor part = upload(values(71 + trial, c.rank(), mine));
    core::Tensor all = upload(std::vector<float>(static_cast<size_t>(total), -999.0f));
    c.all_gather_async(part.data<float>(), all.data<float>(), counts)->wait();
    std::vector<float> expected;
    for (int r = 0; r < c.size(); ++r) {
      const std::vector<float> p = values(71 + trial, r, counts[static_cast<size_t>(r)]);
      expected.insert(expected.end(), p.begin(), p.end());
    }
    EXPECT_EQ(download(all), expected) << "all_gather trial " << trial;
  }
}

TEST(NcclCollectives, BroadcastFromEveryRootAndHostForms) {
  REQUIRE_GPU_PER_RANK();
  Communicator& c = *gpu()->nccl;
  for (int root = 0; root < c.size(); ++root) {
    core::Tensor buf = upload(c.rank() == root ? values(81, root, 777) : std::vector<float>(777));
    c.broadcast(buf.data<float>(), 777, root);
    EXPECT_EQ(download(buf), values(81, root, 777)) << "root " << root;
  }
  // float64 sums on the device (the step's loss and norm), ordered on the stream.
  {
    const std::vector<double> mine = {c.rank() + 1.0, 1.0 / (c.rank() + 3)};
    core::Tensor sums = core::Tensor::empty({2}, core::DType::F64, gpu()->backend->allocator());
    gpu()->backend->copy_from_host(sums.raw_data(), mine.data(), sizeof(double) * 2);
    c.all_reduce_on_device(sums.data<double>(), 2, ReduceOp::Sum);
    std::vector<double> got(2), want = mine;
    gpu()->backend->copy_to_host(got.data(), sums.raw_data(), sizeof(double) * 2);
    world().all_reduce(want.data(), 2, ReduceOp::Sum);
    EXPECT_EQ(got[0], want[0]);
    EXPECT_NEAR(got[1], want[1], 1e-15 * want[1]);  // NCCL's order of additions may differ
  }
  // Scalars stay on the host (MPI underneath).
  double d = c.rank() + 1.0;
  c.all_reduce(&d, 1, ReduceOp::Sum);
  EXPECT_EQ(d, c.size() * (c.size() + 1) / 2.0);
  int64_t k = c.rank();
  c.all_reduce(&k, 1, ReduceOp::Max);
  EXPECT_EQ(k, c.size() - 1);
  c.barrier();
}

TEST(NcclCollectives, CopyLocalAndSplitGroups) {
  REQUIRE_GPU_PER_RANK();
  Communicator& c = *gpu()->nccl;
  core::Tensor a = upload(values(91, c.rank(), 513));
  core::Tensor b = upload(std::vector<float>(513));
  c.copy_local(b.data<float>(), a.data<float>(), a.nbytes());
  EXPECT_EQ(download(b), values(91, c.rank(), 513));
  // Even and odd ranks reduce among themselves.
  std::unique_ptr<Communicator> half = c.split(c.rank() % 2, c.rank());
  core::Tensor x = upload(std::vector<float>(10, static_cast<float>(c.rank())));
  half->all_reduce(x.data<float>(), 10, ReduceOp::Sum);
  float want = 0;
  for (int r = c.rank() % 2; r < c.size(); r += 2)
    want += static_cast<float>(r);
  EXPECT_EQ(download(x), std::vector<float>(10, want));
}

}  // namespace
