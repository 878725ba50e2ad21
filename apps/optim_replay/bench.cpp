#include "apps/optim_replay/bench.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include "comm/shard_ops.h"
#include "comm/sharding_plan.h"
#include "core/check.h"
#include "core/rng.h"
#include "optim/muon/muon.h"
#include "optim/muon/muon_ops.h"
#include "optim/muon/newton_schulz.h"
#include "optim/optimizer_set.h"

namespace replay {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds of the slowest rank for fn (called after a barrier).
template <typename F>
double timed(comm::Communicator& comm, F&& fn) {
  comm.barrier();
  const double t0 = now_s();
  fn();
  double dt = now_s() - t0;
  comm.all_reduce(&dt, 1, comm::ReduceOp::Max);
  return dt;
}

void row(bool json, int np, const std::string& part, const std::string& detail, double ms,
         double gflops) {
  if (json) {
    std::printf("{\"np\":%d,\"part\":\"%s\",\"detail\":\"%s\",\"ms\":%.4f,\"gflops\":%.2f}\n", np,
                part.c_str(), detail.c_str(), ms, gflops);
  } else {
    std::printf("%-3d %-22s %-36s %10.3f %10.2f\n", np, part.c_str(), detail.c_str(), ms, gflops);
  }
}

}  // namespace

int bench_main(const BenchOptions& o, bool json, comm::Communicator& comm) {
  const int64_t D = o.d_model, V = o.vocab;
  std::vector<comm::ParamDesc> params = {{"embed.weight", {V, D}}};
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    params.push_back({b + "attn.qkv.weight", {3 * D, D}});
    params.push_back({b + "attn.proj.weight", {D, D}});
    params.push_back({b + "mlp.fc.weight", {4 * D, D}});
    params.push_back({b + "mlp.proj.weight", {D, 4 * D}});
  }
  params.push_back({"lm_head.weight", {V, D}});

  const std::string preset =
      o.preset.empty() ? std::string(ENGINE_SOURCE_DIR) + "/configs/presets/distadam_muon.yaml"
                       : o.preset;
  YAML::Node config;
  try {
    config = YAML::LoadFile(preset);
  } catch (const YAML::Exception& e) {
    ENGINE_FAIL(preset + ": " + e.what());
  }
  ENGINE_CHECK(config["optim"] && config["optim"]["groups"], preset + ": needs optim.groups");
  optim::OptimizerSet set(config["optim"]["groups"], params);

  std::vector<comm::ParamDesc> infos;
  for (const auto& p : params)
    infos.push_back({p.name, p.shape, set.placement(p.name), 0});
  comm::ShardingPlan plan(infos, comm.size(), comm.rank(), 2);
  std::vector<core::Tensor> full, local, grad;
  std::map<std::string, std::vector<optim::ParamShard>> by_kind;
  double muon_flops = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    full.push_back(core::Tensor::empty(params[i].shape));
    core::fill_normal(full.back(), 1, 0.0f, 0.02f);
    local.push_back(core::Tensor::empty(plan.local_shape(i)));
    grad.push_back(core::Tensor::empty(plan.local_shape(i)));
    comm::copy_local_part(comm, plan, i, full[i], local[i]);
    core::fill_normal(grad[i], 2 + i, 0.0f, 1e-3f);
    if (local[i].numel() == 0) continue;
    optim::Optimizer& opt = set.optimizer(set.group_of(params[i].name));
    by_kind[opt.kind()].push_back(
        {params[i].name, params[i].shape, plan.range(i, comm.rank()).begin, local[i], grad[i]});
    if (auto* muon = dynamic_cast<optim::Muon*>(&opt)) {
      for (const optim::MatrixView& v : muon->view_of(params[i].name, params[i].shape))
        muon_flops += optim::orthogonalize_flops(v.rows, v.cols, muon->config().ns_steps, v.count);
    }
  }

  const int np = comm.size();
  if (comm.rank() == 0 && !json)
    std::printf("%-3s %-22s %-36s %10s %10s\n", "np", "part", "detail", "ms", "GFLOP/s");
  int64_t step = 0;
  std::vector<std::string> kinds;
  for (const auto& kv : by_kind)
    kinds.push_back(kv.first);
  // The union of kinds over ranks may differ from ours (a rank may own no Muon matrix): every
  // rank times every optimizer kind of the preset.
  for (const char* kind : {"adamw", "muon"}) {
    std::vector<optim::ParamShard>& parts = by_kind[kind];
    int64_t elements = 0;
    for (const auto& p : parts)
      elements += p.value.numel();
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    ctx.step = ++step;
    set.step(parts, ctx);  // warm-up: allocates state
    double best = 1e30;
    for (int r = 0; r < o.repeat; ++r) {
      ctx.step = ++step;
      best = std::min(best, timed(comm, [&] { set.step(parts, ctx); }));
    }
    int64_t total_elements = elements;
    comm.all_reduce(&total_elements, 1, comm::ReduceOp::Max);
    double flops = std::string(kind) == "muon" ? muon_flops : 0.0;
    comm.all_reduce(&flops, 1, comm::ReduceOp::Max);
    if (comm.rank() == 0)
      row(json, np, std::string(kind) + " step",
          "max local elements " + std::to_string(total_elements), best * 1e3,
          flops > 0 ? flops / best * 1e-9 : 0.0);
  }
  double gather = 1e30;
  for (int r = 0; r < o.repeat; ++r)
    gather = std::min(gather, timed(comm, [&] {
                        for (size_t i = 0; i < params.size(); ++i)
                          comm::all_gather_param(comm, plan, i, local[i], full[i]);
                      }));
  if (comm.rank() == 0) row(json, np, "all_gather params", "all parameters", gather * 1e3, 0.0);

  // The whole ZeRO-2 optimizer step as the trainer runs it: full gradients reduce-scattered to
  // their placement (each parameter into its own buffer), every optimizer, parameters gathered.
  std::vector<core::Tensor> full_grad;
  std::vector<optim::ParamShard> all_parts;
  for (size_t i = 0; i < params.size(); ++i) {
    full_grad.push_back(core::Tensor::empty(params[i].shape));
    core::fill_normal(full_grad.back(), 100 + i, 0.0f, 1e-3f);
    if (local[i].numel() > 0)
      all_parts.push_back(
          {params[i].name, params[i].shape, plan.range(i, comm.rank()).begin, local[i], grad[i]});
  }
  double whole = 1e30;
  for (int r = 0; r < o.repeat; ++r) {
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    ctx.step = ++step;
    whole = std::min(whole, timed(comm, [&] {
                       for (size_t i = 0; i < params.size(); ++i)
                         comm::reduce_grad(comm, plan, i, full_grad[i], grad[i]);
                       set.step(all_parts, ctx);
                       for (size_t i = 0; i < params.size(); ++i)
                         comm::all_gather_param(comm, plan, i, local[i], full[i]);
                     }));
  }
  if (comm.rank() == 0)
    row(json, np, "zero2 optimizer step", "reduce_scatter + step + all_gather", whole * 1e3, 0.0);

  // Newton-Schulz alone on the model's matrix shapes, and the GEMM rate for comparison.
  core::Backend& be = core::cpu_backend();
  const optim::NewtonSchulzSchedule ns = optim::ns5_schedule();
  const std::unique_ptr<optim::MuonOps> muon_ops = optim::make_muon_ops(be);
  struct Shape3 {
    int64_t k, m, n;
  };
  for (const Shape3 s :
       {Shape3{3, D, D}, Shape3{1, D, D}, Shape3{1, 4 * D, D}, Shape3{1, D, 4 * D}}) {
    core::Tensor x = core::Tensor::empty({s.k, s.m, s.n});
    double best = 1e30;
    for (int r = 0; r < o.repeat; ++r) {
      core::fill_normal(x, 7, 0.0f, 1.0f);
      best = std::min(
          best, timed(comm, [&] { muon_ops->newton_schulz(x.data<float>(), s.m, s.n, ns, s.k); }));
    }
    const std::string shape =
        std::to_string(s.k) + "x" + std::to_string(s.m) + "x" + std::to_string(s.n);
    if (comm.rank() == 0)
      row(json, np, "newton_schulz ns5", shape + " (every rank)", best * 1e3,
          optim::orthogonalize_flops(s.m, s.n, 5, s.k) / best * 1e-9);
  }
  for (const int64_t n : {D, int64_t{1024}}) {
    core::Tensor a = core::Tensor::empty({n, n}), b = core::Tensor::empty({n, n}),
                 c = core::Tensor::empty({n, n});
    core::fill_normal(a, 3, 0.0f, 1.0f);
    core::fill_normal(b, 4, 0.0f, 1.0f);
    core::GemmArgs g;
    g.m = g.n = g.k = n;
    double best = 1e30;
    for (int r = 0; r < o.repeat; ++r)
      best = std::min(best, timed(comm, [&] {
                        be.gemm(g, a.data<float>(), b.data<float>(), c.data<float>());
                      }));
    if (comm.rank() == 0)
      row(json, np, "sgemm ceiling", std::to_string(n) + "^3 (every rank)", best * 1e3,
          2.0 * n * n * n / best * 1e-9);
  }
  return 0;
}

}  // namespace replay
