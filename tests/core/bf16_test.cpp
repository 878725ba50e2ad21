// bf16 on the CPU: the rounding of kernel_math.h against a float64 reference, the backend's
// conversions, the bf16 GEMM (oneDNN and the fallback) against the f32 GEMM of the same bf16
// values, and the instruction-set detection. bf16_isa_forced_fallback runs the Bf16Isa cases
// again with ENGINE_CPU_NO_BF16=1 (tests/core/CMakeLists.txt), so the fallback is checked on
// machines that have the instructions too.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/cpu_isa.h"
#include "core/cpu/onednn_gemm.h"
#include "core/kernel_math.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "tests/core/gemm_bar.h"
#include "tests/test_util.h"

namespace {

namespace kmath = core::kmath;
using core::bf16;
using core::GemmArgs;

// The reference: the bf16 value nearest to x in float64 arithmetic, ties to even, written from
// the format's definition rather than from bits. bf16 keeps 8 significant bits; a value in
// [2^(e-1), 2^e) is a multiple of 2^(e-8), and below the smallest normal 2^-126 every value is a
// multiple of 2^-133 (the subnormal step). Past the largest finite bf16, (2 - 2^-7) 2^127, the
// rounded value is infinity.
double reference_bf16(double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| = m 2^e, 0.5 <= m < 1
  const int quantum = std::max(e - 8, -133);
  const double q = std::ldexp(std::nearbyint(std::ldexp(x, -quantum)), quantum);  // ties to even
  const double largest = std::ldexp(255.0, 120);                                  // 0x7F7F
  if (std::fabs(q) > largest) return std::copysign(INFINITY, x);
  return q;
}

float from_bits(uint32_t u) {
  return kmath::float_from_bits(u);
}

TEST(Bf16Rounding, NearestTiesToEvenAgainstAFloat64Reference) {
  // Every bf16 (the upper 16 bits) with the dropped half at the cases that decide the rounding:
  // zero, just above zero, just below, exactly and just above half, the largest; and a few
  // seeded others. This covers zeros, subnormals, the smallest normals, overflow to infinity
  // and NaN payloads.
  std::vector<uint32_t> lows = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  core::Rng rng(24);
  for (int i = 0; i < 4; ++i)
    lows.push_back(static_cast<uint32_t>(rng.next_below(0x10000)));
  int64_t checked = 0, nans = 0;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) {
      const float x = from_bits((hi << 16) | lo);
      const bf16 got = kmath::bf16_from_float(x);
      const float value = kmath::float_from_bf16(got);
      if (std::isnan(x)) {
        ++nans;
        ASSERT_TRUE(std::isnan(value)) << std::hex << hi << lo;
        ASSERT_EQ(std::signbit(value), std::signbit(x));
        ASSERT_EQ(got.bits & 0x0040, 0x0040) << "NaN is returned quiet";
        continue;
      }
      const double want = reference_bf16(static_cast<double>(x));
      ASSERT_EQ(static_cast<double>(value), want)
          << "x = " << x << " (bits " << std::hex << ((hi << 16) | lo) << ")";
      ASSERT_EQ(std::signbit(value), std::signbit(x)) << "signed zeros keep their sign";
      ++checked;
    }
  }
  std::printf("[ measured ] %lld floats rounded as the float64 reference, %lld NaNs kept\n",
              static_cast<long long>(checked), static_cast<long long>(nans));
}

TEST(Bf16Rounding, NamedCases) {
  const float inf = std::numeric_limits<float>::infinity();
  auto round = [](float x) { return kmath::float_from_bf16(kmath::bf16_from_float(x)); };
  EXPECT_EQ(round(1.0f), 1.0f);
  EXPECT_EQ(round(1.0f + 0x1p-8f), 1.0f);                       // half-way, even below
  EXPECT_EQ(round(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);         // half-way, even above
  EXPECT_EQ(round(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // just above half-way
  EXPECT_EQ(round(inf), inf);
  EXPECT_EQ(round(-inf), -inf);
  EXPECT_EQ(round(FLT_MAX), inf);  // rounds past the largest bf16
  EXPECT_EQ(round(std::ldexp(255.0f, 120)), std::ldexp(255.0f, 120));
  EXPECT_EQ(round(0x1p-133f), 0x1p-133f);  // the smallest bf16 subnormal
  EXPECT_EQ(round(0x1p-134f), 0.0f);       // half of it: ties to even (zero)
  EXPECT_EQ(round(0x1.8p-134f), 0x1p-133f);
  EXPECT_TRUE(std::isnan(round(std::numeric_limits<float>::quiet_NaN())));
  // A signalling NaN whose payload sits in the dropped bits would carry into infinity.
  EXPECT_TRUE(std::isnan(round(from_bits(0x7F800001u))));
  EXPECT_TRUE(std::isnan(round(from_bits(0xFF80FFFFu))));
}

TEST(Bf16Rounding, WideningIsExact) {
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    const float x = kmath::float_from_bf16(bf16{static_cast<uint16_t>(hi)});
    const uint32_t bits = kmath::float_bits(x);
    ASSERT_EQ(bits, hi << 16);
    if (!std::isnan(x)) {
      ASSERT_EQ(kmath::bf16_from_float(x).bits, hi) << "round trip";
    }
  }
}

TEST(Bf16Tensor, ConvertsToAndFromF32) {
  const core::Tensor t =
      core::Tensor::from_vector({2, 2}, std::vector<float>{1.0f, -2.5f, 0.1f, 3e38f});
  const core::Tensor b = t.to(core::DType::BF16);
  EXPECT_EQ(b.dtype(), core::DType::BF16);
  const std::vector<float> back = b.to_vector();
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(static_cast<double>(back[i]), reference_bf16(t.data<float>()[i]));
}

// ---- the backend's conversions -------------------------------------------------------------

std::vector<float> awkward_values(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  core::Rng rng(seed);
  for (int64_t i = 0; i < n; ++i)
    x[i] = from_bits(static_cast<uint32_t>(rng.next_u64()));  // every kind of float
  const float specials[] = {0.0f,    -0.0f,  INFINITY,   -INFINITY,  NAN,
                            FLT_MAX, 1e-40f, -0x1p-134f, 1.00390625f};
  for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i)
    x[i] = specials[i];
  return x;
}

TEST(Bf16Backend, ConversionsAreTheElementMath) {
  core::Backend& be = core::cpu_backend();
  const int64_t n = 100003;  // above the parallel threshold, odd
  const std::vector<float> x = awkward_values(n, 5);
  std::vector<bf16> b(n);
  std::vector<float> back(n);
  be.f32_to_bf16(b.data(), x.data(), n);
  be.bf16_to_f32(back.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(b[i].bits, kmath::bf16_from_float(x[i]).bits) << i;
    ASSERT_EQ(kmath::float_bits(back[i]), static_cast<uint32_t>(b[i].bits) << 16) << i;
  }
}

// ---- the bf16 GEMM -------------------------------------------------------------------------

struct Operands {
  std::vector<bf16> a, b;
  std::vector<float> c0;  // C before the GEMM (beta C is added)
};

// Random bf16 operands covering the whole strided extent of each (padding included).
Operands random_operands(const GemmArgs& r, uint64_t seed) {
  auto extent = [](int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
    return std::max<int64_t>(1, (batch - 1) * stride + rows * ld);
  };
  Operands o;
  const int64_t na = extent(r.batch, r.stride_a, r.trans_a ? r.k : r.m, r.lda);
  const int64_t nb = extent(r.batch, r.stride_b, r.trans_b ? r.n : r.k, r.ldb);
  const int64_t nc = extent(r.batch, r.stride_c, r.m, r.ldc);
  for (int64_t i = 0; i < na; ++i)
    o.a.push_back(kmath::bf16_from_float(static_cast<float>(core::rng_normal(seed, i))));
  for (int64_t i = 0; i < nb; ++i)
    o.b.push_back(kmath::bf16_from_float(static_cast<float>(core::rng_normal(seed + 1, i))));
  for (int64_t i = 0; i < nc; ++i)
    o.c0.push_back(static_cast<float>(core::rng_normal(seed + 2, i)));
  return o;
}

// Both f32 accumulations (u = 2^-24) of the same exact products: within twice gamma_(k+2)
// (tests/core/gemm_bar.h).
double worst_over_bar(const GemmArgs& r, const Operands& o, const std::vector<float>& got,
                      const std::vector<float>& want) {
  return core::test::worst_over_gemm_bar<bf16>(r, o.a, o.b, o.c0, got, want,
                                               &kmath::float_from_bf16,
                                               2 * core::test::gamma_bound(r.k + 2, 0x1p-24));
}

// The f32 GEMM (OpenBLAS) of the same bf16 values: the reference both bf16 paths are held to.
std::vector<float> f32_reference(const GemmArgs& r, const Operands& o) {
  std::vector<float> a(o.a.size()), b(o.b.size()), c = o.c0;
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = kmath::float_from_bf16(o.a[i]);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = kmath::float_from_bf16(o.b[i]);
  core::cpu::gemm(r, a.data(), b.data(), c.data());
  return c;
}

std::vector<GemmArgs> gemm_cases() {
  std::vector<GemmArgs> cases;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      cases.push_back({.trans_a = ta, .trans_b = tb, .m = 37, .n = 29, .k = 53});
  // The model's forms at small sizes: y = x W^T, dx = dy W, dW += dy^T x.
  cases.push_back({.trans_b = true, .m = 128, .n = 192, .k = 64});
  cases.push_back({.m = 128, .n = 64, .k = 192});
  cases.push_back({.trans_a = true, .m = 192, .n = 64, .k = 128, .beta = 1.0f});
  cases.push_back({.m = 9, .n = 7, .k = 300, .alpha = 0.5f, .beta = -2.0f});
  cases.push_back({.m = 6, .n = 5, .k = 4, .lda = 9, .ldb = 7, .ldc = 8});
  cases.push_back({.trans_a = true,
                   .m = 5,
                   .n = 6,
                   .k = 7,
                   .lda = 11,
                   .ldc = 9,
                   .batch = 3,
                   .stride_a = 80,
                   .stride_b = 42,
                   .stride_c = 50});
  cases.push_back({.m = 4,
                   .n = 3,
                   .k = 5,
                   .batch = 4,
                   .stride_a = 0,
                   .stride_b = 15,
                   .stride_c = 12});  // one A for every member
  cases.push_back({.m = 1, .n = 1, .k = 1});
  return cases;
}

void check_paths(bool onednn) {
  double worst = 0;
  uint64_t seed = 100;
  for (const GemmArgs& args : gemm_cases()) {
    const GemmArgs r = core::resolve_gemm_args(args);
    const Operands o = random_operands(r, seed += 10);
    std::vector<float> c = o.c0;
    if (onednn)
      core::cpu::onednn_gemm(r, o.a.data(), o.b.data(), c.data());
    else
      core::cpu::gemm_bf16_as_f32(r, o.a.data(), o.b.data(), c.data());
    const std::vector<float> want = f32_reference(r, o);
    const double w = worst_over_bar(r, o, c, want);
    EXPECT_LE(w, 1.0) << "m " << r.m << " n " << r.n << " k " << r.k << " batch " << r.batch;
    worst = std::max(worst, w);
    if (!onednn) {
      EXPECT_EQ(c, want) << "the fallback is the f32 GEMM itself";
    }
    // Elements outside C (the padding of its rows) are left alone.
    for (int64_t i = 0; r.batch == 1 && i < static_cast<int64_t>(c.size()); ++i) {
      if (i / r.ldc >= r.m || i % r.ldc >= r.n) {
        ASSERT_EQ(c[i], o.c0[i]) << "padding element " << i;
      }
    }
  }
  std::printf(
      "[ measured ] %s bf16 GEMM vs the f32 GEMM of the same values: at most %.3g of "
      "the accumulation-order bar\n",
      onednn ? "oneDNN" : "fallback", worst);
}

TEST(Bf16Gemm, OneDnnMatchesTheF32GemmOfTheSameValues) {
  if (!core::cpu::cpu_bf16_gemm_slow_reason().empty())
    GTEST_SKIP() << "oneDNN's bf16 matmul is used only with bf16 instructions: "
                 << core::cpu::cpu_bf16_gemm_slow_reason();
  check_paths(true);
}

TEST(Bf16Gemm, FallbackIsTheF32GemmOfTheWidenedValues) {
  check_paths(false);
}

TEST(Bf16Gemm, ModelShapeWithinTheBar) {
  // One of the model's large forms (the head's dW += dlogits^T lnf at N = 256), through the
  // backend: whichever path this machine takes.
  const GemmArgs r =
      core::resolve_gemm_args({.trans_a = true, .m = 1000, .n = 64, .k = 256, .beta = 1.0f});
  const Operands o = random_operands(r, 7);
  std::vector<float> c = o.c0;
  core::cpu_backend().gemm(r, o.a.data(), o.b.data(), c.data());
  const double w = worst_over_bar(r, o, c, f32_reference(r, o));
  std::printf("[ measured ] head dW shape: %.3g of the accumulation-order bar\n", w);
  EXPECT_LE(w, 1.0);
}

TEST(Bf16Gemm, EmptyInnerDimensionScalesC) {
  for (float beta : {0.0f, 0.5f}) {
    std::vector<float> c = {1, 2, NAN, 4, 5, 6};
    core::cpu_backend().gemm(GemmArgs{.m = 2, .n = 3, .k = 0, .beta = beta},
                             static_cast<const bf16*>(nullptr), static_cast<const bf16*>(nullptr),
                             c.data());
    for (int i = 0; i < 6; ++i)
      if (i != 2 || beta == 0.0f) {
        EXPECT_EQ(c[i], beta == 0.0f ? 0.0f : beta * (i + 1)) << i;
      }
  }
}

// TF32 is a GPU format: the CPU's f32 GEMM computes f32 with the flag set, bit for bit.
TEST(Bf16Gemm, Tf32FlagLeavesTheCpuGemmF32) {
  GemmArgs g{.trans_b = true, .m = 33, .n = 17, .k = 64, .beta = 0.5f};
  std::vector<float> a(33 * 64), b(17 * 64), c(33 * 17);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<float>(core::rng_normal(1, i));
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<float>(core::rng_normal(2, i));
  for (size_t i = 0; i < c.size(); ++i)
    c[i] = static_cast<float>(core::rng_normal(3, i));
  std::vector<float> f32 = c, tf32 = c;
  core::cpu_backend().gemm(g, a.data(), b.data(), f32.data());
  g.tf32 = true;
  core::cpu_backend().gemm(g, a.data(), b.data(), tf32.data());
  EXPECT_EQ(tf32, f32);
}

TEST(Bf16Gemm, RefusesWhatTheF32GemmRefuses) {
  std::vector<bf16> x(64);
  std::vector<float> c(64);
  const GemmArgs bad{.m = 4, .n = 4, .k = 4, .lda = 3};
  EXPECT_THROW(core::cpu_backend().gemm(bad, x.data(), x.data(), c.data()), core::Error);
}

// ---- instruction-set detection (also run with ENGINE_CPU_NO_BF16=1) ------------------------

// The kernel's view: the flags of /proc/cpuinfo (the kernel lists only what it enables).
bool cpuinfo_has(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;)
      if (w == flag) return true;
    return false;
  }
  return false;
}

TEST(Bf16Isa, DetectionAgreesWithProcCpuinfo) {
  std::ifstream probe("/proc/cpuinfo");
  if (!probe) GTEST_SKIP() << "no /proc/cpuinfo";
  const core::cpu::CpuBf16Isa isa = core::cpu::detect_cpu_bf16_isa();
  EXPECT_EQ(isa.avx512_bf16, cpuinfo_has("avx512_bf16"));
  EXPECT_EQ(isa.amx_bf16, cpuinfo_has("amx_bf16") && cpuinfo_has("amx_tile"));
  std::printf("[ measured ] this CPU: avx512_bf16 %d, amx_bf16 %d\n", isa.avx512_bf16,
              isa.amx_bf16);
}

TEST(Bf16Isa, SlowReasonFollowsTheInstructionsAndTheEnvironment) {
  const char* env = std::getenv(core::cpu::kNoBf16Env);
  const bool forced = env && std::string(env) == "1";
  const core::cpu::CpuBf16Isa isa = core::cpu::detect_cpu_bf16_isa();
  const std::string reason = core::cpu_backend().bf16_gemm_slow_reason();
  if (forced) {
    EXPECT_NE(reason.find(core::cpu::kNoBf16Env), std::string::npos) << reason;
  } else {
    EXPECT_EQ(reason.empty(), isa.avx512_bf16 || isa.amx_bf16) << reason;
  }
  EXPECT_FALSE(core::cpu_backend().tf32_gemm_slow_reason().empty()) << "no TF32 on a CPU";
  std::printf("[ measured ] bf16 GEMMs here: %s\n", reason.empty() ? "fast" : reason.c_str());
}

// The one-line description that logs and benchmark tables carry: the vector tier and bf16 as
// /proc/cpuinfo lists them, bf16 marked off where it is forced off, and the OpenBLAS kernel in use.
TEST(Bf16Isa, DescribeCpuNamesTheInstructionsAndTheBlasKernel) {
  std::ifstream probe("/proc/cpuinfo");
  if (!probe) GTEST_SKIP() << "no /proc/cpuinfo";
  const std::string d = core::cpu::describe_cpu();
  std::printf("[ measured ] this CPU: %s\n", d.c_str());
  const std::string vector = cpuinfo_has("avx512f") ? "AVX-512"
                             : cpuinfo_has("avx2")  ? "AVX2"
                             : cpuinfo_has("avx")   ? "AVX"
                                                    : "no AVX";
  EXPECT_NE(d.find(", " + vector), std::string::npos) << d;
  // The family and model numbers, which tell processors of one name apart (AMD EPYC: Zen 3 to 5).
  std::string family, model;
  for (std::string line; std::getline(probe, line) && !line.empty();) {
    const std::string key = line.substr(0, line.find_first_of("\t:"));
    const std::string value = line.substr(line.find(": ") + 2);
    if (key == "cpu family") family = value;
    if (key == "model") model = value;
  }
  if (!family.empty() && !model.empty()) {
    EXPECT_NE(d.find("(family " + family + ", model " + model + ")"), std::string::npos) << d;
  }
  const core::cpu::CpuBf16Isa isa = core::cpu::detect_cpu_bf16_isa();
  const bool has_bf16 = isa.avx512_bf16 || isa.amx_bf16;
  EXPECT_EQ(d.find("no bf16 instructions") == std::string::npos, has_bf16) << d;
  const char* env = std::getenv(core::cpu::kNoBf16Env);
  const bool forced = env && std::string(env) == "1";
  EXPECT_EQ(d.find("(off: ENGINE_CPU_NO_BF16=1)") != std::string::npos, forced && has_bf16) << d;
  EXPECT_NE(d.find(std::string("OpenBLAS ") + openblas_get_corename() + " kernels"),
            std::string::npos)
      << d;
  EXPECT_NE(std::string(core::cpu_backend().name()).find(d), std::string::npos)
      << "the backend's name carries it: " << core::cpu_backend().name();
}

TEST(Bf16Isa, BackendGemmTakesThePathTheReasonSays) {
  // Without bf16 instructions (or with them forced off) the backend's bf16 GEMM is the
  // fallback, bit for bit; with them it is oneDNN's.
  const GemmArgs r = core::resolve_gemm_args({.trans_b = true, .m = 64, .n = 48, .k = 96});
  const Operands o = random_operands(r, 31);
  std::vector<float> got = o.c0, fallback = o.c0;
  core::cpu_backend().gemm(r, o.a.data(), o.b.data(), got.data());
  core::cpu::gemm_bf16_as_f32(r, o.a.data(), o.b.data(), fallback.data());
  if (core::cpu_backend().bf16_gemm_slow_reason().empty()) {
    std::vector<float> onednn = o.c0;
    core::cpu::onednn_gemm(r, o.a.data(), o.b.data(), onednn.data());
    EXPECT_EQ(got, onednn);
  } else {
    EXPECT_EQ(got, fallback);
  }
}

}  // namespace

// ENGINE_CPU_NO_BF16=true, yes or abc was taken as "no" without a word (only 1 counted): any value
// but 0, 1 or empty is refused by name.
TEST(Bf16Isa, NoBf16AcceptsOnly0Or1) {
  const char* env = std::getenv(core::cpu::kNoBf16Env);
  const std::string saved = env != nullptr ? env : "";
  for (const char* value : {"true", "yes", "abc"}) {
    ::setenv(core::cpu::kNoBf16Env, value, 1);
    const std::string msg = test_util::error_of([] { core::cpu::cpu_no_bf16_requested(); });
    EXPECT_NE(msg.find(std::string("ENGINE_CPU_NO_BF16=") + value + ": must be 1"),
              std::string::npos)
        << msg;
  }
  ::setenv(core::cpu::kNoBf16Env, "1", 1);
  EXPECT_TRUE(core::cpu::cpu_no_bf16_requested());
  ::setenv(core::cpu::kNoBf16Env, "0", 1);
  EXPECT_FALSE(core::cpu::cpu_no_bf16_requested());
  if (env != nullptr)
    ::setenv(core::cpu::kNoBf16Env, saved.c_str(), 1);
  else
    ::unsetenv(core::cpu::kNoBf16Env);
}
