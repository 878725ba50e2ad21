// bench_comm: bus bandwidth of all_reduce, reduce_scatter and all_gather through
// comm::Communicator, blocking ("engine") and async + wait ("async"), next to a plain MPI loop of
// the same calls (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather) in the same run.
//
//   mpirun -np 4 bench_comm [--min-bytes 4096] [--max-bytes 67108864] [--iters N] [--json]
//
// Sizes follow nccl-tests: `size` is the full buffer (all_reduce: the buffer; reduce_scatter: the
// input of all ranks' blocks; all_gather: the output). algbw = size / time; busbw = algbw times
// 2(n-1)/n for all_reduce and (n-1)/n for reduce_scatter and all_gather, so it is comparable
// across rank counts. Time per call: see time_three (interleaved blocks, best of five).
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/abort.h"
#include "comm/communicator.h"
#include "comm/mpi_session.h"
#include "core/check.h"

namespace {

constexpr const char* kUsage =
    "usage: mpirun -np N bench_comm [--min-bytes 4096] [--max-bytes 67108864] [--iters N] "
    "[--json]\n"
    "Bus bandwidth of all_reduce, reduce_scatter and all_gather through the engine's\n"
    "communicator beside plain MPI calls (--iters 0: chosen per size).\n";

struct Options {
  int64_t min_bytes = 4096;
  int64_t max_bytes = 64 << 20;
  int iters = 0;  // 0: chosen per size
  bool json = false;
  bool help = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) {
      ENGINE_CHECK(i + 1 < argc, std::string("bench_comm: ") + name + " needs a value");
      return std::atoll(argv[++i]);
    };
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--min-bytes") {
      o.min_bytes = value("--min-bytes");
    } else if (a == "--max-bytes") {
      o.max_bytes = value("--max-bytes");
    } else if (a == "--iters") {
      o.iters = static_cast<int>(value("--iters"));
    } else {
      ENGINE_FAIL("bench_comm: unknown argument '" + a + "'\n" + kUsage);
    }
  }
  ENGINE_CHECK(o.min_bytes >= 4 && o.min_bytes <= o.max_bytes,
               "bench_comm: need 4 <= --min-bytes <= --max-bytes");
  return o;
}

// Seconds per call of three implementations of one collective (engine blocking, engine async,
// plain MPI): two warm-up calls each, then kBlocks rounds in which each implementation runs a
// timed block of iters / kBlocks calls, in a rotating order so all three see the same machine.
// A block's time is its slowest rank's mean; the best block is reported (the machine is shared,
// so the minimum is the least disturbed estimate).
constexpr int kBlocks = 5;
using Call = std::function<void()>;

std::array<double, 3> time_three(const std::array<Call, 3>& calls, int iters) {
  for (const Call& call : calls) {
    call();
    call();
  }
  const int per_block = std::max(1, iters / kBlocks);
  std::array<double, 3> best = {1e30, 1e30, 1e30};
  for (int b = 0; b < kBlocks; ++b) {
    for (int k = 0; k < 3; ++k) {
      const int j = (b + k) % 3;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int c = 0; c < per_block; ++c)
        calls[j]();
      double t = (MPI_Wtime() - t0) / per_block;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      best[j] = std::min(best[j], t);
    }
  }
  return best;
}

void fill(std::vector<float>& v, int rank) {
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>((i * 7 + rank * 3) % 17) - 8.0f;
}

struct Row {
  const char* collective;
  int64_t bytes;
  double engine_s, async_s, mpi_s, bus_factor;
  bool same_result;
};

int run(int argc, char** argv) {
  Options opt = parse(argc, argv);
  auto world = comm::make_mpi_world();
  if (opt.help) {
    if (world->rank() == 0) std::fputs(kUsage, stdout);
    return 0;
  }
  const int W = world->size(), rank = world->rank();
  const double ar_factor = 2.0 * (W - 1) / W, rs_factor = static_cast<double>(W - 1) / W;
  std::vector<Row> rows;

  for (int64_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= 2) {
    // About 256 MB moved per measurement, at least 5 and at most 200 calls.
    const int iters =
        opt.iters > 0 ? opt.iters
                      : static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / bytes, 5, 200));
    const int64_t n = bytes / 4;  // full buffer elements
    const int64_t block = n / W;  // per-rank block for reduce_scatter / all_gather
    std::vector<float> a(n), b(n), c(n), d(n);

    // all_reduce (in place for both).
    fill(a, rank);
    fill(b, rank);
    world->all_reduce(a.data(), n, comm::ReduceOp::Sum);
    MPI_Allreduce(MPI_IN_PLACE, b.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    bool same = a == b;
    auto t = time_three({[&] { world->all_reduce(a.data(), n, comm::ReduceOp::Sum); },
                         [&] { world->all_reduce_async(a.data(), n, comm::ReduceOp::Sum)->wait(); },
                         [&] {
                           MPI_Allreduce(MPI_IN_PLACE, b.data(), static_cast<int>(n), MPI_FLOAT,
                                         MPI_SUM, MPI_COMM_WORLD);
                         }},
                        iters);
    rows.push_back({"all_reduce", n * 4, t[0], t[1], t[2], ar_factor, same});

    // reduce_scatter: W equal blocks of `block` elements.
    std::vector<int64_t> counts(W, block);
    fill(a, rank);
    world->reduce_scatter(a.data(), c.data(), counts, comm::ReduceOp::Sum);
    MPI_Reduce_scatter_block(a.data(), d.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD);
    same = std::equal(c.begin(), c.begin() + block, d.begin());
    t = time_three(
        {[&] { world->reduce_scatter(a.data(), c.data(), counts, comm::ReduceOp::Sum); },
         [&] {
           world->reduce_scatter_async(a.data(), c.data(), counts, comm::ReduceOp::Sum)->wait();
         },
         [&] {
           MPI_Reduce_scatter_block(a.data(), d.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
         }},
        iters);
    rows.push_back({"reduce_scatter", block * W * 4, t[0], t[1], t[2], rs_factor, same});

    // all_gather: each rank contributes `block` elements.
    fill(c, rank);
    world->all_gather(c.data(), a.data(), counts);
    MPI_Allgather(c.data(), static_cast<int>(block), MPI_FLOAT, b.data(), static_cast<int>(block),
                  MPI_FLOAT, MPI_COMM_WORLD);
    same = std::equal(a.begin(), a.begin() + block * W, b.begin());
    t = time_three({[&] { world->all_gather(c.data(), a.data(), counts); },
                    [&] { world->all_gather_async(c.data(), a.data(), counts)->wait(); },
                    [&] {
                      MPI_Allgather(c.data(), static_cast<int>(block), MPI_FLOAT, b.data(),
                                    static_cast<int>(block), MPI_FLOAT, MPI_COMM_WORLD);
                    }},
                   iters);
    rows.push_back({"all_gather", block * W * 4, t[0], t[1], t[2], rs_factor, same});
  }

  bool all_same = true;
  for (const Row& r : rows)
    all_same = all_same && r.same_result;
  if (rank != 0) return all_same ? 0 : 1;
  if (opt.json) {
    for (const Row& r : rows) {
      std::printf(
          "{\"collective\":\"%s\",\"np\":%d,\"bytes\":%lld,\"engine_us\":%.3f,"
          "\"engine_busbw_gbs\":%.4f,\"async_us\":%.3f,\"async_busbw_gbs\":%.4f,"
          "\"mpi_us\":%.3f,\"mpi_busbw_gbs\":%.4f,\"same_result\":%s}\n",
          r.collective, W, static_cast<long long>(r.bytes), r.engine_s * 1e6,
          r.bytes / r.engine_s * r.bus_factor / 1e9, r.async_s * 1e6,
          r.bytes / r.async_s * r.bus_factor / 1e9, r.mpi_s * 1e6,
          r.bytes / r.mpi_s * r.bus_factor / 1e9, r.same_result ? "true" : "false");
    }
  } else {
    std::printf("bench_comm: %d ranks, %s; busbw in GB/s (nccl-tests definition)\n", W,
                world->name().c_str());
    std::printf("%-14s %9s | %10s %7s | %10s %7s | %10s %7s | %s\n", "collective", "bytes",
                "engine_us", "busbw", "async_us", "busbw", "mpi_us", "busbw", "check");
    for (const Row& r : rows) {
      std::printf("%-14s %9lld | %10.1f %7.3f | %10.1f %7.3f | %10.1f %7.3f | %s\n", r.collective,
                  static_cast<long long>(r.bytes), r.engine_s * 1e6,
                  r.bytes / r.engine_s * r.bus_factor / 1e9, r.async_s * 1e6,
                  r.bytes / r.async_s * r.bus_factor / 1e9, r.mpi_s * 1e6,
                  r.bytes / r.mpi_s * r.bus_factor / 1e9, r.same_result ? "ok" : "DIFFERENT");
    }
  }
  return all_same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  return comm::run_guarded([&] { return run(argc, argv); });
}
