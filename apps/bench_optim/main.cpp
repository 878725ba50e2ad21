// bench_optim: optimizer step time of the hidden matrices of the default CPU model (cpu_small:
// 4 layers, D 128: qkv [3D, D], proj [D, D], fc [4D, D], proj [D, 4D]) and of its MoE variant
// (expert weights [E, 4D, D], [E, D, 4D]), per optimizer, and the eigenbasis refresh alone.
// Every row is the median over --repeat steps of the slowest rank, after --warmup steps (the
// first SOAP step is always an eigh): wall ms, and CPU ms (the process's CPU time, all threads;
// on a shared, oversubscribed machine the CPU time of a 1-thread run is the steadier measure of
// work). Under mpirun each optimizer gets the placement it asks for.
//
//   mpirun -np N bench_optim [--layers 4] [--d-model 128] [--experts 4] [--repeat 5]
//                            [--warmup 2] [--only SUBSTRING] [--json]
//
// Rows:
//   step <optimizer>      one optimizer step of every hidden matrix (Owned: spread over ranks)
//   refresh <variant>     the eigenbasis refresh of all 2 x 16 Kronecker factors of the dense
//                         model: eigh or QR (one power step), batched (one eigh_many/qr_many
//                         phase, spread over the threads) vs one at a time (same single-threaded
//                         LAPACK calls, one after another) vs threaded LAPACK one matrix at a time
//   refresh tp_rekls ...  the double eigh of TpRekls: every rank solving every factor
//                         (gather-all) vs each rank its share plus broadcasts (distributed_eigh)
#include <mpi.h>
#include <omp.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "comm/abort.h"
#include "comm/communicator.h"
#include "comm/mpi_session.h"
#include "comm/shard_ops.h"
#include "comm/sharding_plan.h"
#include "core/check.h"
#include "core/rng.h"
#include "optim/optimizer_set.h"
#include "optim/soap/eigenbasis.h"

namespace {

struct Options {
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t experts = 4;
  int repeat = 5;
  int warmup = 2;
  std::string only;
  bool json = false;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Timing {
  double wall_ms = 0;
  double cpu_ms = 0;
};

// Medians over `repeat` runs of the slowest rank's wall and CPU time for fn, after `warmup`
// untimed runs.
Timing median_ms(comm::Communicator& comm, int warmup, int repeat,
                 const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i)
    fn();
  std::vector<double> wall, cpu;
  for (int i = 0; i < repeat; ++i) {
    comm.barrier();
    const double t0 = now_s(), c0 = cpu_s();
    fn();
    double dt[2] = {now_s() - t0, cpu_s() - c0};
    comm.all_reduce(dt, 2, comm::ReduceOp::Max);
    wall.push_back(dt[0] * 1e3);
    cpu.push_back(dt[1] * 1e3);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

void row(const Options& o, comm::Communicator& comm, const std::string& part,
         const std::string& what, const std::string& model, const Timing& t) {
  if (comm.rank() != 0) return;
  if (o.json)
    std::printf(
        "{\"impl\":\"engine\",\"np\":%d,\"threads\":%d,\"part\":\"%s\",\"what\":\"%s\","
        "\"model\":\"%s\",\"ms\":%.3f,\"cpu_ms\":%.3f}\n",
        comm.size(), omp_get_max_threads(), part.c_str(), what.c_str(), model.c_str(), t.wall_ms,
        t.cpu_ms);
  else
    std::printf("%-3d %-3d %-8s %-44s %-10s %10.2f %10.2f\n", comm.size(), omp_get_max_threads(),
                part.c_str(), what.c_str(), model.c_str(), t.wall_ms, t.cpu_ms);
  std::fflush(stdout);
}

std::vector<comm::ParamDesc> hidden_matrices(const Options& o, bool moe) {
  const int64_t D = o.d_model;
  std::vector<comm::ParamDesc> p;
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    p.push_back({b + "attn.qkv.weight", {3 * D, D}});
    p.push_back({b + "attn.proj.weight", {D, D}});
    if (moe) {
      p.push_back({b + "moe.fc.weight", {o.experts, 4 * D, D}});
      p.push_back({b + "moe.proj.weight", {o.experts, D, 4 * D}});
    } else {
      p.push_back({b + "mlp.fc.weight", {4 * D, D}});
      p.push_back({b + "mlp.proj.weight", {D, 4 * D}});
    }
  }
  return p;
}

// Times one optimizer step of `params` under `group` (a YAML map without params).
void bench_step(const Options& o, comm::Communicator& comm, const std::string& what,
                const std::string& group, bool moe) {
  if (!o.only.empty() && what.find(o.only) == std::string::npos) return;
  const std::vector<comm::ParamDesc> params = hidden_matrices(o, moe);
  const YAML::Node groups = YAML::Load("- {params: ['*'], " + group + "}");
  optim::OptimizerSet set(groups, params);
  std::vector<comm::ParamDesc> infos;
  for (const auto& p : params)
    infos.push_back({p.name, p.shape, set.placement(p.name), 0});
  const comm::ShardingPlan plan(infos, comm.size(), comm.rank(), 1);
  std::vector<core::Tensor> values, grads;
  for (size_t i = 0; i < params.size(); ++i) {
    core::Tensor full = core::Tensor::empty(params[i].shape);
    core::fill_normal(full, 11 + i, 0.0f, 0.02f);
    values.push_back(core::Tensor::empty(plan.local_shape(i)));
    comm::copy_local_part(comm, plan, i, full, values.back());
    core::fill_normal(full, 101 + i, 0.0f, 1e-3f);
    grads.push_back(core::Tensor::empty(plan.local_shape(i)));
    comm::copy_local_part(comm, plan, i, full, grads.back());
  }
  int64_t t = 0;
  const Timing ms = median_ms(comm, o.warmup, o.repeat, [&] {
    std::vector<optim::ParamShard> shards;
    for (size_t i = 0; i < params.size(); ++i)
      if (values[i].numel() > 0)
        shards.push_back({params[i].name, params[i].shape, plan.range(i, comm.rank()).begin,
                          values[i], grads[i]});
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    ctx.step = ++t;
    ctx.comm = &comm;
    set.step(shards, ctx);
  });
  row(o, comm, "step", what, moe ? "moe" : "cpu_small", ms);
}

// The 2 x 16 Kronecker factors of the dense model (random SPD, as G G^T) with bases.
struct Factors {
  std::vector<core::Tensor> k, q, lam;
};

Factors dense_factors(const Options& o) {
  Factors f;
  for (const auto& p : hidden_matrices(o, false))
    for (const int64_t d : {p.shape[0], p.shape[1]}) {
      core::Tensor g = core::Tensor::empty({d, d + 8});
      core::fill_normal(g, 31 + f.k.size(), 0.0f, 1.0f);
      core::Tensor k = core::Tensor::empty({d, d});
      optim::matmul(core::cpu_backend(), g.data<float>(), false, g.data<float>(), true,
                    k.data<float>(), d, d, d + 8);
      f.k.push_back(k);
      f.q.push_back(core::Tensor::empty({d, d}));
      f.lam.push_back(core::Tensor::empty({d}));
    }
  return f;
}

void bench_refresh(const Options& o, comm::Communicator& comm) {
  if (!o.only.empty() && std::string("refresh").find(o.only) == std::string::npos) return;
  core::Backend& be = core::cpu_backend();
  Factors f = dense_factors(o);
  auto reset_bases = [&] {  // the QR path starts from the eigenbasis of a nearby factor
    for (size_t i = 0; i < f.k.size(); ++i) {
      const int64_t d = f.k[i].size(0);
      std::fill_n(f.q[i].data<float>(), d * d, 0.0f);
      for (int64_t j = 0; j < d; ++j)
        f.q[i].data<float>()[j * d + j] = 1.0f;
    }
  };
  for (const bool eigh : {true, false}) {
    for (const bool batched : {true, false}) {
      const Timing ms = median_ms(comm, 1, o.repeat, [&] {
        reset_bases();
        optim::RefreshBatch b;
        for (size_t i = 0; i < f.k.size(); ++i)
          b.add({f.k[i].data<float>(), f.q[i].data<float>(), f.lam[i].data<float>(), f.k[i].size(0),
                 eigh, !eigh});
        b.run(be, 1, batched);
      });
      row(o, comm, "refresh",
          std::string(eigh ? "eigh" : "qr") + (batched ? " batched" : " one at a time"),
          "cpu_small", ms);
    }
    // Threaded LAPACK, one matrix at a time (not bit-identical to the above; a reference).
    const Timing ms = median_ms(comm, 1, o.repeat, [&] {
      reset_bases();
      for (size_t i = 0; i < f.k.size(); ++i) {
        const int64_t d = f.k[i].size(0);
        if (eigh) {
          be.eigh(f.lam[i].data<float>(), f.q[i].data<float>(), f.k[i].data<float>(), d, 1);
        } else {
          std::vector<float> kq(static_cast<size_t>(d * d)), r(static_cast<size_t>(d * d));
          optim::matmul(be, f.k[i].data<float>(), false, f.q[i].data<float>(), false, kq.data(), d,
                        d, d);
          be.qr(f.q[i].data<float>(), r.data(), kq.data(), d, d, 1);
        }
      }
    });
    row(o, comm, "refresh", std::string(eigh ? "eigh" : "qr") + " threaded LAPACK per matrix",
        "cpu_small", ms);
  }
  // TpRekls' double eigh (2 x 32 eighs per step): every rank all of them vs distributed.
  for (const bool distributed : {false, true}) {
    const Timing ms = median_ms(comm, 1, o.repeat, [&] {
      for (int round = 0; round < 2; ++round) {
        optim::RefreshBatch b;
        for (size_t i = 0; i < f.k.size(); ++i)
          b.add({f.k[i].data<float>(), f.q[i].data<float>(), f.lam[i].data<float>(), f.k[i].size(0),
                 true, false});
        b.run(be, 1, true, distributed ? &comm : nullptr);
      }
    });
    row(o, comm, "refresh",
        std::string("tp_rekls double eigh ") + (distributed ? "distributed_eigh" : "gather-all"),
        "cpu_small", ms);
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      ENGINE_CHECK(i + 1 < argc, "bench_optim: " + a + " needs a value");
      return argv[++i];
    };
    auto integer = [&]() -> int64_t {
      const std::string v = next();
      try {
        return std::stoll(v);
      } catch (const std::exception&) {
        ENGINE_FAIL("bench_optim: " + a + " expects an integer, got '" + v + "'");
      }
    };
    if (a == "--layers")
      o.layers = integer();
    else if (a == "--d-model")
      o.d_model = integer();
    else if (a == "--experts")
      o.experts = integer();
    else if (a == "--repeat")
      o.repeat = static_cast<int>(integer());
    else if (a == "--warmup")
      o.warmup = static_cast<int>(integer());
    else if (a == "--only")
      o.only = next();
    else if (a == "--json")
      o.json = true;
    else
      ENGINE_FAIL("bench_optim: unknown argument '" + a + "'");
  }
  ENGINE_CHECK(o.repeat >= 1 && o.warmup >= 0 && o.layers >= 1 && o.d_model >= 1,
               "bench_optim: --repeat >= 1, --warmup >= 0, --layers and --d-model >= 1");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  return comm::run_guarded([&] {
    const Options o = parse(argc, argv);
    std::unique_ptr<comm::Communicator> world = comm::make_mpi_world();
    comm::Communicator& comm = *world;
    if (comm.rank() == 0 && !o.json)
      std::printf("%-3s %-3s %-8s %-44s %-10s %10s %10s\n", "np", "thr", "part", "what", "model",
                  "ms", "cpu_ms");
    const std::string soap = "optimizer: soap, lr: 0.003, eps: 1.0e-8";
    const std::string tp = "optimizer: tp_rekls, lr: 0.003, eps: 1.0e-8, partition_dim: 0";
    bench_step(o, comm, "adamw", "optimizer: adamw, lr: 0.003", false);
    bench_step(o, comm, "muon", "optimizer: muon, lr: 0.02, matrix_views: {}", false);
    bench_step(o, comm, "soap qr batched", soap + ", batched_refresh: true", false);
    bench_step(o, comm, "soap qr one at a time", soap + ", batched_refresh: false", false);
    bench_step(o, comm, "soap eigh batched", soap + ", use_eigh: true", false);
    bench_step(o, comm, "soap eigh one at a time",
               soap + ", use_eigh: true, batched_refresh: false", false);
    bench_step(o, comm, "rekls", "optimizer: rekls, lr: 0.003, eps: 1.0e-8", false);
    bench_step(o, comm, "tp_rekls gather-all", tp, false);
    bench_step(o, comm, "tp_rekls distributed_eigh", tp + ", distributed_eigh: true", false);
    bench_step(o, comm, "adamw", "optimizer: adamw, lr: 0.003", true);
    bench_step(o, comm, "stacked_soap", "optimizer: stacked_soap, lr: 0.003, eps: 1.0e-8", true);
    bench_refresh(o, comm);
    return 0;
  });
}
