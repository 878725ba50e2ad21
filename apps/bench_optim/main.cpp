// bench_optim: optimizer step time of the hidden matrices of a GPT (default: cpu_small, 4 layers,
// D 128: qkv [3D, D], proj [D, D], fc [4D, D], proj [D, 4D]; --d-model 768 --layers 12 is GPT-2
// 124M's set) and of its MoE variant (expert weights [E, 4D, D], [E, D, 4D]), per optimizer, where
// a SOAP-family step's time goes, and the eigenbasis refresh alone. The side-by-side with the
// reference implementation is tools/bench_soap.sh.
//
// Every step gets fresh random gradients (N(0, 1), drawn before the clock starts; parameters
// N(0, 0.02)), as the reference benchmark does: a fixed gradient would leave the factors, and so
// the eigen problems, the same from step to step. SOAP-family rows use the reference's
// defaults with lr 1e-3. Every row is the median over --repeat steps of the slowest rank, after
// --warmup steps (the first SOAP step is always an eigh): wall ms, and CPU ms (the process's CPU
// time, all threads: CPU / wall is the number of cores a row kept busy). Under mpirun each
// optimizer gets the placement it asks for; run ranks with several threads --bind-to none.
//
//   mpirun -np N bench_optim [--device cpu|cuda] [--layers 4] [--d-model 128] [--experts 4]
//                            [--repeat 5] [--warmup 2] [--only ITEM,...] [--staged] [--json]
//
// --only: the rows whose name contains one of the comma-separated items; an item "=NAME" takes
// the row NAME alone (--only '=soap qr,=rekls'), "refresh" the refresh rows.
//
// --device cuda: every tensor on GPU <local rank mod GPUs> (the timings synchronise it); TpRekls
// then gathers through the staged device collectives (comm.device_collectives: mpi), which
// --staged also selects on the CPU.
//
// Rows (part, what):
//   step <optimizer>        one optimizer step of every hidden matrix (Owned: spread over ranks)
//   phase <opt>: <phase>    where that step's time goes (optim/soap/phase_times.h): factors,
//                           solver, sort, rotate, update; timed in --repeat further steps with
//                           the backend synchronised around each phase; solver and sort sum the
//                           time of every factor's refresh over the threads that ran them
//   refresh <variant>       the eigenbasis refresh alone of all 2 x 4 x layers Kronecker factors of
//                           the dense model (K after a few steps of random gradients, the QR
//                           path starting from the eigenbasis of the factor a step before):
//                           batched (one phase over the threads / batched device calls) vs one
//                           at a time, and eigh()/qr() per matrix (CPU: threaded LAPACK; CUDA:
//                           one cuSOLVER call each, the former device path)
//   refresh tp_rekls ...    the double eigh of TpRekls: every rank solving every factor
//                           (gather-all) vs each rank its share plus broadcasts (distributed_eigh)
#include <mpi.h>
#include <omp.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/abort.h"
#include "comm/communicator.h"
#include "comm/mpi_session.h"
#include "comm/shard_ops.h"
#include "comm/sharding_plan.h"
#include "comm/staged_communicator.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/rng.h"
#include "core/transfer.h"
#include "optim/optimizer_set.h"
#include "optim/soap/eigenbasis.h"
#include "optim/soap/phase_times.h"
#include "optim/soap/soap.h"
#include "optim/soap/tp_rekls.h"

namespace {

constexpr const char* kUsage =
    "usage: mpirun -np N bench_optim [--device cpu|cuda] [--layers 4] [--d-model 128]\n"
    "                                [--experts 4] [--repeat 5] [--warmup 2] [--only ITEM,...]\n"
    "                                [--staged] [--json]\n"
    "Optimizer step time of a GPT's hidden matrices per optimizer, the SOAP family's phases and\n"
    "the eigenbasis refresh. --only: the rows whose name contains an ITEM ('=NAME': that row\n"
    "alone; 'refresh' for the refresh rows).\n"
    "The header of apps/bench_optim/main.cpp says what each row is.\n";

struct Options {
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t experts = 4;
  int repeat = 5;
  int warmup = 2;
  std::string only;
  std::string device = "cpu";
  bool staged = false;
  bool json = false;
  bool help = false;
};

// Where the benchmark runs: the backend, the communicator of its tensors and the model's name.
struct Bench {
  Options o;
  comm::Communicator& world;
  core::Backend& backend;
  comm::Communicator& tensors;
  std::string model;
};

struct Timing {
  double wall_ms = 0;
  double cpu_ms = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Medians over `repeat` runs of the slowest rank's wall and CPU time for fn, after `warmup`
// untimed runs; prepare() runs untimed before each.
Timing median_ms(Bench& b, int warmup, int repeat, const std::function<void()>& prepare,
                 const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) {
    prepare();
    fn();
  }
  std::vector<double> wall, cpu;
  for (int i = 0; i < repeat; ++i) {
    prepare();
    b.backend.synchronize();
    b.world.barrier();
    const double t0 = core::wall_seconds(), c0 = core::process_cpu_seconds();
    fn();
    b.backend.synchronize();
    double dt[2] = {core::wall_seconds() - t0, core::process_cpu_seconds() - c0};
    b.world.all_reduce(dt, 2, comm::ReduceOp::Max);
    wall.push_back(dt[0] * 1e3);
    cpu.push_back(dt[1] * 1e3);
  }
  return {median(wall), median(cpu)};
}

// --only A,B: the rows whose name contains A or B; an item =NAME takes the row NAME alone.
bool wanted(const Options& o, const std::string& what) {
  if (o.only.empty()) return true;
  size_t start = 0;
  while (start <= o.only.size()) {
    const size_t end = std::min(o.only.find(',', start), o.only.size());
    const std::string item = o.only.substr(start, end - start);
    if (!item.empty() && item[0] == '=' ? what == item.substr(1)
                                        : what.find(item) != std::string::npos)
      return true;
    start = end + 1;
  }
  return false;
}

void row(const Bench& b, const std::string& part, const std::string& what, const std::string& model,
         const Timing& t) {
  if (b.world.rank() != 0) return;
  if (b.o.json)
    std::printf(
        "{\"impl\":\"engine\",\"device\":\"%s\",\"np\":%d,\"threads\":%d,\"part\":\"%s\","
        "\"what\":\"%s\",\"model\":\"%s\",\"ms\":%.3f,\"cpu_ms\":%.3f}\n",
        b.o.device.c_str(), b.world.size(), omp_get_max_threads(), part.c_str(), what.c_str(),
        model.c_str(), t.wall_ms, t.cpu_ms);
  else
    std::printf("%-3d %-3d %-8s %-44s %-10s %10.2f %10.2f\n", b.world.size(), omp_get_max_threads(),
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

// A host tensor's copy in the backend's memory.
core::Tensor on_backend(core::Backend& backend, const core::Tensor& host) {
  core::Tensor t = core::Tensor::empty(host.shape(), core::DType::F32, backend.allocator());
  core::write_from_host(backend, t, host);
  return t;
}

// The SOAP-family optimizer of a set's only group, to time its phases (null for the others).
void set_phase_times(optim::OptimizerSet& set, optim::SoapPhaseTimes* times) {
  optim::Optimizer& opt = set.optimizer(0);
  if (auto* soap = dynamic_cast<optim::Soap*>(&opt)) soap->set_phase_times(times);
  if (auto* tp = dynamic_cast<optim::TpRekls*>(&opt)) tp->set_phase_times(times);
}

// Times one optimizer step of `params` under `group` (a YAML map without params); with
// `phases`, then where the step's time goes.
void bench_step(Bench& b, const std::string& what, const std::string& group, bool moe,
                bool phases = false) {
  if (!wanted(b.o, what)) return;
  comm::Communicator& comm = b.world;
  const std::vector<comm::ParamDesc> params = hidden_matrices(b.o, moe);
  const YAML::Node groups = YAML::Load("- {params: ['*'], " + group + "}");
  optim::OptimizerSet set(groups, params);
  std::vector<comm::ParamDesc> infos;
  for (const auto& p : params)
    infos.push_back({p.name, p.shape, set.placement(p.name), 0});
  const comm::ShardingPlan plan(infos, comm.size(), comm.rank(), 1);
  std::vector<core::Tensor> values, grads, host_grads;
  std::vector<core::Tensor> full;
  for (size_t i = 0; i < params.size(); ++i) {
    full.push_back(core::Tensor::empty(params[i].shape));
    core::fill_normal(full[i], 11 + i, 0.0f, 0.02f);
    core::Tensor local = core::Tensor::empty(plan.local_shape(i));
    comm::copy_local_part(comm, plan, i, full[i], local);
    values.push_back(on_backend(b.backend, local));
    host_grads.push_back(core::Tensor::empty(plan.local_shape(i)));
    grads.push_back(on_backend(b.backend, host_grads[i]));
  }
  int64_t t = 0;
  // Fresh gradients for the next step (untimed).
  const auto prepare = [&] {
    for (size_t i = 0; i < params.size(); ++i) {
      core::fill_normal(full[i], 1000 * static_cast<uint64_t>(t + 1) + i, 0.0f, 1.0f);
      comm::copy_local_part(comm, plan, i, full[i], host_grads[i]);
      core::write_from_host(b.backend, grads[i], host_grads[i]);
    }
  };
  const auto step = [&] {
    std::vector<optim::ParamShard> shards;
    for (size_t i = 0; i < params.size(); ++i)
      if (values[i].numel() > 0)
        shards.push_back({params[i].name, params[i].shape, plan.range(i, comm.rank()).begin,
                          values[i], grads[i]});
    optim::StepContext ctx;
    ctx.backend = &b.backend;
    ctx.step = ++t;
    ctx.comm = &b.tensors;
    set.step(shards, ctx);
  };
  row(b, "step", what, moe ? "moe" : b.model, median_ms(b, b.o.warmup, b.o.repeat, prepare, step));
  if (!phases) return;
  optim::SoapPhaseTimes times;
  set_phase_times(set, &times);
  std::vector<std::vector<double>> wall(optim::kSoapPhases), cpu(optim::kSoapPhases);
  for (int r = 0; r < b.o.repeat; ++r) {
    prepare();
    times = {};
    step();
    for (int p = 0; p < optim::kSoapPhases; ++p) {
      double dt[2] = {times.wall_s[p], times.cpu_s[p]};
      comm.all_reduce(dt, 2, comm::ReduceOp::Max);
      wall[p].push_back(dt[0] * 1e3);
      cpu[p].push_back(dt[1] * 1e3);
    }
  }
  set_phase_times(set, nullptr);
  for (int p = 0; p < optim::kSoapPhases; ++p)
    row(b, "phase", what + ": " + optim::soap_phase_name(static_cast<optim::SoapPhase>(p)),
        moe ? "moe" : b.model, {median(wall[p]), median(cpu[p])});
}

// The 2 x 4 x layers Kronecker factors of the dense model, in the backend's memory: K, the
// eigenbasis q0 of the factor a step before (the QR path's start), and room for the result.
struct Factors {
  std::vector<core::Tensor> k, q0, q, lam;
};

// K is what a few SOAP steps of random gradients leave (0.8 of the previous factor plus 0.2 of a
// new G G^T), so the eigen problems are the ones a step solves.
Factors dense_factors(Bench& b) {
  core::Backend& cpu = core::cpu_backend();
  Factors f;
  for (const auto& p : hidden_matrices(b.o, false))
    for (const int64_t other : {p.shape[1], p.shape[0]}) {
      const int64_t d = p.shape[0] + p.shape[1] - other;
      const size_t index = f.k.size();
      core::Tensor g = core::Tensor::empty({d, 6 * other});
      core::fill_normal(g, 31 + index, 0.0f, 1.0f);
      core::Tensor prev = core::Tensor::empty({d, d}), k = core::Tensor::empty({d, d});
      optim::matmul(cpu, g.data<float>(), false, g.data<float>(), true, prev.data<float>(), d, d,
                    6 * other, 1.0f / 6);
      core::Tensor g1 = core::Tensor::empty({d, other});
      core::fill_normal(g1, 131 + index, 0.0f, 1.0f);
      std::copy_n(prev.data<float>(), d * d, k.data<float>());
      optim::matmul(cpu, g1.data<float>(), false, g1.data<float>(), true, k.data<float>(), d, d,
                    other, 0.2f, 0.8f);
      // The eigenbasis a step before, on the device (the host's eigh of 96 factors up to 3072
      // wide took longer than a GPU run's time box).
      core::Backend& be = b.backend;
      const core::Tensor prev_on = on_backend(be, prev);
      core::Tensor w = core::Tensor::empty({d}, core::DType::F32, be.allocator());
      core::Tensor v = core::Tensor::empty({d, d}, core::DType::F32, be.allocator());
      be.eigh(w.data<float>(), v.data<float>(), prev_on.data<float>(), d, 1);
      core::Tensor q0 = core::Tensor::empty({d, d}, core::DType::F32, be.allocator());
      be.reverse_columns(q0.data<float>(), v.data<float>(), d, d);
      core::Tensor q = core::Tensor::empty({d, d}, core::DType::F32, be.allocator());
      be.copy(q.data<float>(), q0.data<float>(), q.nbytes());
      f.k.push_back(on_backend(be, k));
      f.q0.push_back(std::move(q0));
      f.q.push_back(std::move(q));
      f.lam.push_back(std::move(w));
    }
  return f;
}

// The refresh rows, each named "refresh <what>" for --only (a GPU run's time box takes the four
// it needs: --only 'refresh eigh batched,refresh eigh one at a time,...').
void bench_refresh(Bench& b) {
  const auto name = [](bool eigh, const std::string& how) {
    return std::string(eigh ? "eigh " : "qr ") + how;
  };
  const auto want = [&](const std::string& what) { return wanted(b.o, "refresh " + what); };
  std::vector<std::string> rows;
  for (const bool eigh : {true, false})
    for (const char* how : {"batched", "one at a time", "() per matrix"})
      rows.push_back(name(eigh, how));
  for (const char* how : {"gather-all", "distributed_eigh"})
    rows.push_back(std::string("tp_rekls double eigh ") + how);
  if (std::none_of(rows.begin(), rows.end(), want)) return;
  core::Backend& be = b.backend;
  std::unique_ptr<optim::SoapOps> ops = optim::make_soap_ops(be);
  Factors f = dense_factors(b);
  const auto reset_bases = [&] {
    for (size_t i = 0; i < f.k.size(); ++i)
      be.copy(f.q[i].data<float>(), f.q0[i].data<float>(), f.q[i].nbytes());
  };
  const auto nothing = [] {};
  for (const bool eigh : {true, false}) {
    for (const bool batched : {true, false}) {
      const std::string what = name(eigh, batched ? "batched" : "one at a time");
      if (!want(what)) continue;
      const Timing ms = median_ms(b, 1, b.o.repeat, reset_bases, [&] {
        optim::RefreshBatch batch;
        for (size_t i = 0; i < f.k.size(); ++i)
          batch.add({f.k[i].data<float>(), f.q[i].data<float>(), f.lam[i].data<float>(),
                     f.k[i].size(0), eigh, !eigh});
        batch.run(be, *ops, 1, batched);
      });
      row(b, "refresh", what, b.model, ms);
    }
    // The backend's single-matrix solvers, one call per factor (not bit-identical to the above).
    const std::string what = name(eigh, "() per matrix");
    if (!want(what)) continue;
    const Timing ms = median_ms(b, 1, b.o.repeat, reset_bases, [&] {
      for (size_t i = 0; i < f.k.size(); ++i) {
        const int64_t d = f.k[i].size(0);
        core::Tensor scratch = optim::backend_tensor(be, {d, d});
        if (eigh) {
          be.eigh(f.lam[i].data<float>(), scratch.data<float>(), f.k[i].data<float>(), d, 1);
        } else {
          core::Tensor r = optim::backend_tensor(be, {d, d});
          optim::matmul(be, f.k[i].data<float>(), false, f.q[i].data<float>(), false,
                        scratch.data<float>(), d, d, d);
          be.qr(f.q[i].data<float>(), r.data<float>(), scratch.data<float>(), d, d, 1);
        }
      }
    });
    row(b, "refresh", what, b.model, ms);
  }
  // TpRekls' double eigh (2 x factors eighs per step): every rank all of them vs distributed.
  for (const bool distributed : {false, true}) {
    const std::string what =
        std::string("tp_rekls double eigh ") + (distributed ? "distributed_eigh" : "gather-all");
    if (!want(what)) continue;
    const Timing ms = median_ms(b, 1, b.o.repeat, nothing, [&] {
      for (int round = 0; round < 2; ++round) {
        optim::RefreshBatch batch;
        for (size_t i = 0; i < f.k.size(); ++i)
          batch.add({f.k[i].data<float>(), f.q[i].data<float>(), f.lam[i].data<float>(),
                     f.k[i].size(0), true, false});
        batch.run(be, *ops, 1, true, distributed ? &b.tensors : nullptr);
      }
    });
    row(b, "refresh", what, b.model, ms);
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
    if (a == "--help" || a == "-h")
      o.help = true;
    else if (a == "--layers")
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
    else if (a == "--device")
      o.device = next();
    else if (a == "--staged")
      o.staged = true;
    else if (a == "--json")
      o.json = true;
    else
      ENGINE_FAIL("bench_optim: unknown argument '" + a + "'\n" + kUsage);
  }
  ENGINE_CHECK(o.repeat >= 1 && o.warmup >= 0 && o.layers >= 1 && o.d_model >= 1,
               "bench_optim: --repeat >= 1, --warmup >= 0, --layers and --d-model >= 1");
  ENGINE_CHECK(o.device == "cpu" || o.device == "cuda",
               "bench_optim: --device must be cpu or cuda, got '" + o.device + "'");
  return o;
}

std::string model_name(const Options& o) {
  if (o.d_model == 128 && o.layers == 4) return "cpu_small";
  if (o.d_model == 768 && o.layers == 12) return "gpt2_124m";
  std::string name = "D";  // appended piece by piece: GCC 12 warns on the one-expression form
  name += std::to_string(o.d_model);
  name += "xL";
  name += std::to_string(o.layers);
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  return comm::run_guarded([&] {
    const Options o = parse(argc, argv);
    std::unique_ptr<comm::Communicator> world = comm::make_mpi_world();
    if (o.help) {
      if (world->rank() == 0) std::fputs(kUsage, stdout);
      return 0;
    }
    std::unique_ptr<core::Backend> cuda;
    if (o.device == "cuda") {
      const int gpus = core::cuda_device_count();
      ENGINE_CHECK(gpus > 0, "bench_optim: --device cuda, but " +
                                 std::string(core::cuda_built() ? "no GPU is visible"
                                                                : "this build has no CUDA"));
      cuda = core::make_cuda_backend(session.node_rank() % gpus);
    }
    core::Backend& backend = cuda ? *cuda : core::cpu_backend();
    std::unique_ptr<comm::Communicator> staged;
    if (cuda || o.staged) staged = comm::make_staged(*world, backend);
    Bench b{o, *world, backend, staged ? *staged : *world, model_name(o)};
    if (world->rank() == 0 && !o.json)
      std::printf("%-3s %-3s %-8s %-44s %-10s %10s %10s\n", "np", "thr", "part", "what", "model",
                  "ms", "cpu_ms");
    // The reference benchmark's settings: its defaults, lr 1e-3.
    const std::string soap = "optimizer: soap, lr: 0.001";
    const std::string tp = "optimizer: tp_rekls, lr: 0.001, partition_dim: 0";
    bench_step(b, "adamw", "optimizer: adamw, lr: 0.001", false);
    bench_step(b, "muon", "optimizer: muon, lr: 0.02, matrix_views: {}", false);
    bench_step(b, "soap qr", soap, false, true);
    bench_step(b, "soap qr one at a time", soap + ", batched_refresh: false", false);
    bench_step(b, "soap qr sort before", soap + ", qr_sort: before", false, true);
    bench_step(b, "soap eigh", soap + ", use_eigh: true", false, true);
    bench_step(b, "soap eigh one at a time", soap + ", use_eigh: true, batched_refresh: false",
               false);
    bench_step(b, "rekls", "optimizer: rekls, lr: 0.001", false, true);
    bench_step(b, "tp_rekls gather-all", tp, false);
    bench_step(b, "tp_rekls distributed_eigh", tp + ", distributed_eigh: true", false);
    bench_step(b, "adamw", "optimizer: adamw, lr: 0.001", true);
    bench_step(b, "stacked_soap", "optimizer: stacked_soap, lr: 0.001", true);
    bench_refresh(b);
    return 0;
  });
}
