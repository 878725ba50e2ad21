// bench_ops: GEMM throughput of the CPU backend next to OpenBLAS's cblas_sgemm and Eigen's GEMM
// (same run, same buffers) at the model's shapes, with the backend's bf16 GEMM (bf16 inputs, f32
// accumulation: oneDNN, on AMX tiles where the CPU has them) beside them and each D's rate over
// all of its shapes (the step's GEMM mix: the rate a training step's GEMMs could reach), and the
// time of causal attention forward + backward with each way of spreading heads over threads.
//
//   bench_ops [--threads N] [--json] [--reps R] [--dims 256,384,512,768]
//             [--tokens 2048] [--only gemm|attention|ops] [--clock wall|cpu]
//
// Every GEMM is timed at least `reps` times (short ones more) after one warm-up, the three
// implementations interleaved so that load from other processes hits them alike; the best time
// counts.
#include <cblas.h>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/clock.h"
#include "core/cpu/attention_kernels.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace {

struct Options {
  int threads = 0;  // 0: leave OMP_NUM_THREADS alone
  bool json = false;
  int reps = 3;
  std::vector<int64_t> dims = {256, 384, 512, 768};
  std::string only;        // "gemm", "attention" or "ops": run that section alone
  bool cpu_clock = false;  // --clock cpu: the thread's CPU time (one thread only)
  int64_t tokens = 2048;   // N = B*T of the GEMM shapes and the fused ops
};

// Set once from the options: time with the calling thread's CPU clock instead of wall time.
// On a machine shared with other work the CPU clock leaves out the time the thread was not
// scheduled, which wall time cannot; it is only meaningful with one thread.
bool g_cpu_clock = false;

constexpr const char* kUsage =
    "usage: bench_ops [--threads N] [--json] [--reps R] [--dims 256,384,512,768]\n"
    "                 [--tokens 2048] [--only gemm|attention|ops] [--clock wall|cpu]\n";

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr, "bench_ops: %s\n%s", error.c_str(), kUsage);
  std::exit(2);
}

int64_t parse_int(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    long long v = std::stoll(text, &used);
    if (used != text.size() || v <= 0) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    usage(flag + " wants a positive integer, got '" + text + "'");
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_int(a, value()));
    } else if (a == "--reps") {
      o.reps = static_cast<int>(parse_int(a, value()));
    } else if (a == "--clock") {
      std::string c = value();
      if (c != "wall" && c != "cpu") usage("--clock wants wall or cpu, got '" + c + "'");
      o.cpu_clock = c == "cpu";
    } else if (a == "--only") {
      o.only = value();
      if (o.only != "gemm" && o.only != "attention" && o.only != "ops") {
        usage("--only wants gemm, attention or ops, got '" + o.only + "'");
      }
    } else if (a == "--tokens") {
      o.tokens = parse_int(a, value());
    } else if (a == "--dims") {
      o.dims.clear();
      std::stringstream ss(value());
      for (std::string item; std::getline(ss, item, ',');)
        o.dims.push_back(parse_int(a, item));
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  return o;
}

double seconds(const std::function<void()>& fn) {
  if (g_cpu_clock) {
    double t0 = core::thread_cpu_seconds();
    fn();
    return core::thread_cpu_seconds() - t0;
  }
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One GEMM shape of the model: C[m, n] (+)= op(A) op(B).
struct Shape {
  std::string op;
  int64_t m, n, k;
  bool ta, tb;
  float beta;
};

struct GemmResult {
  double backend, openblas, eigen, backend_bf16;  // GFLOP/s
  double seconds_f32, seconds_bf16;               // the backend's best times
};

GemmResult time_gemm(const Shape& s, int reps) {
  int64_t a_rows = s.ta ? s.k : s.m, a_cols = s.ta ? s.m : s.k;
  int64_t b_rows = s.tb ? s.n : s.k, b_cols = s.tb ? s.k : s.n;
  core::Tensor a = core::Tensor::empty({a_rows, a_cols}), b = core::Tensor::empty({b_rows, b_cols});
  core::Tensor c = core::Tensor::zeros({s.m, s.n});
  core::fill_uniform(a, 1, -1.0f, 1.0f);
  core::fill_uniform(b, 2, -1.0f, 1.0f);
  float *pa = a.data<float>(), *pb = b.data<float>(), *pc = c.data<float>();
  std::vector<core::bf16> a16(static_cast<size_t>(a.numel())), b16(static_cast<size_t>(b.numel()));
  core::cpu_backend().f32_to_bf16(a16.data(), pa, a.numel());
  core::cpu_backend().f32_to_bf16(b16.data(), pb, b.numel());

  core::GemmArgs g;
  g.trans_a = s.ta, g.trans_b = s.tb, g.m = s.m, g.n = s.n, g.k = s.k, g.beta = s.beta;
  auto run_backend = [&] { core::cpu_backend().gemm(g, pa, pb, pc); };
  auto run_backend_bf16 = [&] { core::cpu_backend().gemm(g, a16.data(), b16.data(), pc); };
  auto run_openblas = [&] {
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(s.m), static_cast<blasint>(s.n), static_cast<blasint>(s.k),
                1.0f, pa, static_cast<blasint>(a_cols), pb, static_cast<blasint>(b_cols), s.beta,
                pc, static_cast<blasint>(s.n));
  };
  Eigen::Map<const RowMat> ea(pa, a_rows, a_cols), eb(pb, b_rows, b_cols);
  Eigen::Map<RowMat> ec(pc, s.m, s.n);
  auto run_eigen = [&] {
    auto product = [&](const auto& x, const auto& y) {
      if (s.beta == 0.0f) {
        ec.noalias() = x * y;
      } else {
        ec.noalias() += x * y;
      }
    };
    if (s.ta && s.tb) {
      product(ea.transpose(), eb.transpose());
    } else if (s.ta) {
      product(ea.transpose(), eb);
    } else if (s.tb) {
      product(ea, eb.transpose());
    } else {
      product(ea, eb);
    }
  };
  // Warm-up, which also sizes the sample count: short GEMMs get up to 40 samples each (about
  // 0.3 s), so the best time is not one unlucky scheduling slice on a shared machine.
  double warm = seconds(run_backend);
  run_openblas();
  run_eigen();
  run_backend_bf16();
  int samples = std::max(reps, std::min(40, static_cast<int>(0.3 / std::max(warm, 1e-6))));
  double tb = 1e30, to = 1e30, te = 1e30, t16 = 1e30;
  for (int r = 0; r < samples; ++r) {
    tb = std::min(tb, seconds(run_backend));
    to = std::min(to, seconds(run_openblas));
    te = std::min(te, seconds(run_eigen));
    t16 = std::min(t16, seconds(run_backend_bf16));
  }
  double flop = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * s.k;
  return {flop / tb * 1e-9, flop / to * 1e-9, flop / te * 1e-9, flop / t16 * 1e-9, tb, t16};
}

// Forward + backward of causal attention, milliseconds (best of reps).
double time_attention(core::cpu::HeadParallel mode, int64_t B, int64_t H, int64_t T, int64_t hd,
                      int reps) {
  int64_t BH = B * H, n = BH * T * hd;
  std::vector<float> q(n), k(n), v(n), out(n), dout(n), dq(n), dk(n), dv(n);
  std::vector<float> lse(BH * T);
  for (int64_t i = 0; i < n; ++i) {
    q[i] = static_cast<float>(core::rng_normal(3, i));
    k[i] = static_cast<float>(core::rng_normal(4, i));
    v[i] = static_cast<float>(core::rng_normal(5, i));
    dout[i] = static_cast<float>(core::rng_normal(6, i));
  }
  float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto run = [&] {
    core::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, hd,
                                 scale, mode);
    core::cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                  lse.data(), q.data(), k.data(), v.data(), BH, T, hd, scale, mode);
  };
  run();
  double best = 1e30;
  for (int r = 0; r < reps; ++r)
    best = std::min(best, seconds(run));
  return best * 1e3;
}

// Milliseconds (best of reps) of the fused ops at one model size: N tokens, width D, Vp columns.
struct OpTime {
  std::string op;
  double ms;
};

std::vector<OpTime> time_fused_ops(int64_t N, int64_t D, int64_t Vp, int reps) {
  core::Backend& be = core::cpu_backend();
  int64_t V = Vp - 47;
  auto buffer = [](int64_t n, uint64_t seed) {
    core::Tensor t = core::Tensor::empty({n});
    core::fill_normal(t, seed, 0.0f, 1.0f);
    return t;
  };
  core::Tensor x = buffer(N * D, 7), g = buffer(N * D, 8), y = buffer(N * D, 9),
               dx = buffer(N * D, 10), w = buffer(D, 11), b = buffer(D, 12), dw = buffer(D, 13),
               db = buffer(D, 14), mean = buffer(N, 15), rstd = buffer(N, 16),
               h = buffer(N * 4 * D, 17), dh = buffer(N * 4 * D, 18), gh = buffer(N * 4 * D, 19),
               logits = buffer(N * Vp, 20), dlogits = buffer(N * Vp, 21), losses = buffer(N, 22);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i)
    targets[i] = static_cast<int32_t>((i * 7919) % V);
  auto f = [](const core::Tensor& t) { return t.data<float>(); };
  // bf16 precision's logits (d logits are written over them).
  std::vector<core::bf16> logits_bf16(static_cast<size_t>(N * Vp));
  be.f32_to_bf16(logits_bf16.data(), f(logits), N * Vp);
  std::vector<std::pair<std::string, std::function<void()>>> ops = {
      {"layernorm.fwd",
       [&] { be.layernorm_forward(f(y), f(mean), f(rstd), f(x), f(w), f(b), N, D, 1e-5f); }},
      {"layernorm.bwd",
       [&] {
         be.layernorm_backward(f(dx), f(dw), f(db), f(g), f(x), f(w), f(mean), f(rstd), N, D);
       }},
      {"rmsnorm.fwd", [&] { be.rmsnorm_forward(f(y), f(rstd), f(x), N, D, 1e-6f); }},
      {"rmsnorm.bwd", [&] { be.rmsnorm_backward(f(dx), f(g), f(x), f(rstd), N, D); }},
      {"gelu.fwd [N,4D]", [&] { be.gelu_forward(f(dh), f(h), N * 4 * D); }},
      {"gelu.bwd [N,4D]", [&] { be.gelu_backward(f(dh), f(h), f(gh), N * 4 * D); }},
      {"relu2.fwd [N,4D]", [&] { be.relu2_forward(f(dh), f(h), N * 4 * D); }},
      {"relu2.bwd [N,4D]", [&] { be.relu2_backward(f(dh), f(h), f(gh), N * 4 * D); }},
      {"cross_entropy [N,Vp] softcap 15",
       [&] {
         be.cross_entropy(f(losses), f(dlogits), f(logits), targets.data(), N, V, Vp, 15.0f,
                          1.0f / N);
       }},
      {"cross_entropy [N,Vp] no softcap",
       [&] {
         be.cross_entropy(f(losses), f(dlogits), f(logits), targets.data(), N, V, Vp, 0.0f,
                          1.0f / N);
       }},
      {"cross_entropy bf16 [N,Vp] in place", [&] {
         be.cross_entropy(f(losses), logits_bf16.data(), logits_bf16.data(), targets.data(), N, V,
                          Vp, 0.0f, 1.0f / N);
       }}};
  std::vector<OpTime> out;
  for (auto& [name, fn] : ops) {
    fn();
    double best = 1e30;
    for (int r = 0; r < reps; ++r)
      best = std::min(best, seconds(fn));
    out.push_back({name, best * 1e3});
  }
  return out;
}

constexpr int64_t kVp = 50304;  // GPT-2 vocabulary padded to a multiple of 64

void run_gemm_table(const Options& opt, int threads) {
  if (!opt.json) {
    std::printf("%5s %-16s %6s %6s %6s %10s %10s %10s %8s %10s\n", "D", "gemm", "m", "n", "k",
                "backend", "openblas", "eigen", "ratio", "be bf16");
    std::printf("%5s %-16s %6s %6s %6s %10s %10s %10s %8s %10s\n", "", "", "", "", "", "GFLOP/s",
                "GFLOP/s", "GFLOP/s", "be/oblas", "GFLOP/s");
  }
  double worst_ratio = 1e30;
  for (int64_t D : opt.dims) {
    double flop_d = 0, seconds_f32_d = 0, seconds_bf16_d = 0;  // over all of D's shapes
    // (name, out, in) of each linear layer: y[N, out] = x[N, in] W[out, in]^T.
    struct Layer {
      const char* name;
      int64_t out, in;
    };
    const Layer layers[] = {{"qkv", 3 * D, D},
                            {"attn.proj", D, D},
                            {"mlp.fc", 4 * D, D},
                            {"mlp.proj", D, 4 * D},
                            {"lm_head", kVp, D}};
    for (const Layer& l : layers) {
      const Shape shapes[] = {
          {std::string(l.name) + ".fwd", opt.tokens, l.out, l.in, false, true, 0.0f},  // x W^T
          {std::string(l.name) + ".dx", opt.tokens, l.in, l.out, false, false, 0.0f},  // dY W
          {std::string(l.name) + ".dw", l.out, l.in, opt.tokens, true, false, 1.0f},   // dY^T X
      };
      for (const Shape& s : shapes) {
        GemmResult r = time_gemm(s, opt.reps);
        double ratio = r.backend / r.openblas;
        flop_d += 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * s.k;
        seconds_f32_d += r.seconds_f32;
        seconds_bf16_d += r.seconds_bf16;
        worst_ratio = std::min(worst_ratio, ratio);
        if (opt.json) {
          std::printf(
              "{\"kind\":\"gemm\",\"threads\":%d,\"clock\":\"%s\",\"d\":%lld,\"op\":\"%s\",\"m\":%"
              "lld,\"n\":%lld,"
              "\"k\":%lld,\"trans_a\":%s,\"trans_b\":%s,\"backend_gflops\":%.2f,"
              "\"openblas_gflops\":%.2f,\"eigen_gflops\":%.2f,\"ratio\":%.3f,"
              "\"backend_bf16_gflops\":%.2f}\n",
              threads, g_cpu_clock ? "cpu" : "wall", static_cast<long long>(D), s.op.c_str(),
              static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
              s.ta ? "true" : "false", s.tb ? "true" : "false", r.backend, r.openblas, r.eigen,
              ratio, r.backend_bf16);
        } else {
          std::printf("%5lld %-16s %6lld %6lld %6lld %10.1f %10.1f %10.1f %8.3f %10.1f\n",
                      static_cast<long long>(D), s.op.c_str(), static_cast<long long>(s.m),
                      static_cast<long long>(s.n), static_cast<long long>(s.k), r.backend,
                      r.openblas, r.eigen, ratio, r.backend_bf16);
        }
        std::fflush(stdout);
      }
    }
    // The rate of D's whole GEMM mix (total FLOPs over total best time), each precision: what a
    // step's GEMMs reach at most, the denominator of a step's share of the GEMM rate.
    const double mix_f32 = flop_d / seconds_f32_d * 1e-9, mix_bf16 = flop_d / seconds_bf16_d * 1e-9;
    if (opt.json) {
      std::printf(
          "{\"kind\":\"gemm_mix\",\"threads\":%d,\"clock\":\"%s\",\"d\":%lld,\"n_tokens\":%lld,"
          "\"backend_gflops\":%.2f,\"backend_bf16_gflops\":%.2f}\n",
          threads, g_cpu_clock ? "cpu" : "wall", static_cast<long long>(D),
          static_cast<long long>(opt.tokens), mix_f32, mix_bf16);
    } else {
      std::printf("%5lld %-16s %27s %10.1f %30s %10.1f\n", static_cast<long long>(D), "all (mix)",
                  "", mix_f32, "", mix_bf16);
    }
  }
  if (!opt.json) std::printf("worst GEMM ratio backend/openblas: %.3f\n\n", worst_ratio);
}

void run_attention(const Options& opt, int threads) {
  const int64_t B = 8, H = 4, T = 256, hd = 64;
  if (!opt.json) {
    std::printf("attention forward+backward, B=%lld H=%lld T=%lld hd=%lld:\n",
                static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(T),
                static_cast<long long>(hd));
  }
  struct Mode {
    const char* key;
    const char* name;
    core::cpu::HeadParallel mode;
  };
  const Mode modes[] = {
      {"heads", "heads: one head per thread, 1-thread GEMMs", core::cpu::HeadParallel::kHeads},
      {"gemm", "gemm: heads in turn, threaded GEMMs", core::cpu::HeadParallel::kGemm},
      {"auto", "auto: the backend's choice", core::cpu::HeadParallel::kAuto}};
  for (const Mode& m : modes) {
    double ms = time_attention(m.mode, B, H, T, hd, opt.reps);
    if (opt.json) {
      std::printf(
          "{\"kind\":\"attention\",\"threads\":%d,\"clock\":\"%s\",\"mode\":\"%s\",\"B\":%lld,"
          "\"H\":%lld,"
          "\"T\":%lld,\"hd\":%lld,\"fwd_bwd_ms\":%.3f}\n",
          threads, g_cpu_clock ? "cpu" : "wall", m.key, static_cast<long long>(B),
          static_cast<long long>(H), static_cast<long long>(T), static_cast<long long>(hd), ms);
    } else {
      std::printf("  %-46s %8.2f ms\n", m.name, ms);
    }
  }
  if (!opt.json) std::printf("\n");
}

void run_ops(const Options& opt, int threads) {
  const int64_t kOpsD = opt.dims.back();
  if (!opt.json) {
    std::printf("fused ops, N=%lld D=%lld Vp=%lld:\n", static_cast<long long>(opt.tokens),
                static_cast<long long>(kOpsD), static_cast<long long>(kVp));
  }
  for (const OpTime& t : time_fused_ops(opt.tokens, kOpsD, kVp, opt.reps)) {
    if (opt.json) {
      std::printf(
          "{\"kind\":\"op\",\"threads\":%d,\"clock\":\"%s\",\"op\":\"%s\",\"N\":%lld,\"D\":%lld,"
          "\"ms\":%.3f}\n",
          threads, g_cpu_clock ? "cpu" : "wall", t.op.c_str(), static_cast<long long>(opt.tokens),
          static_cast<long long>(kOpsD), t.ms);
    } else {
      std::printf("  %-46s %8.2f ms\n", t.op.c_str(), t.ms);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse(argc, argv);
  if (opt.threads > 0) omp_set_num_threads(opt.threads);
  int threads = omp_get_max_threads();
  if (opt.cpu_clock && threads != 1) usage("--clock cpu needs one thread (--threads 1)");
  g_cpu_clock = opt.cpu_clock;
  Eigen::setNbThreads(threads);
  if (!opt.json) {
    std::printf("bench_ops: %s, Eigen %d threads, N = %lld tokens, best of >= %d, %s clock\n\n",
                core::cpu_backend().name(), Eigen::nbThreads(), static_cast<long long>(opt.tokens),
                opt.reps, opt.cpu_clock ? "thread CPU" : "wall");
  }
  if (opt.only.empty() || opt.only == "gemm") run_gemm_table(opt, threads);
  if (opt.only.empty() || opt.only == "attention") run_attention(opt, threads);
  if (opt.only.empty() || opt.only == "ops") run_ops(opt, threads);
  return 0;
}
