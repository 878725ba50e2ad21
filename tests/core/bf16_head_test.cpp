// bf16 precision's head on the CPU: the GEMM that writes bf16 logits (oneDNN's bf16 destination
// and the fallback's blocks rounded by round_to_bf16) against the f32 GEMM of the same values
// rounded once, and the cross-entropy on bf16 logits against the f32 one on the same (widened)
// logits. bf16_isa_forced_fallback runs the Bf16Head cases again with ENGINE_CPU_NO_BF16=1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/cpu_isa.h"
#include "core/cpu/onednn_gemm.h"
#include "core/kernel_math.h"
#include "core/rng.h"
#include "tests/core/gemm_bar.h"

namespace {

namespace kmath = core::kmath;
using core::bf16;
using core::GemmArgs;

// ---- the GEMM with a bf16 C ------------------------------------------------------------------

// The three ways to a bf16 C: oneDNN (where the CPU has the instructions), the fallback, and the
// backend's choice between them.
enum class Path { kOneDnn, kFallback, kBackend };

void run(Path path, const GemmArgs& r, const bf16* a, const bf16* b, bf16* c) {
  if (path == Path::kOneDnn) {
    core::cpu::onednn_gemm(r, a, b, c);
  } else if (path == Path::kFallback) {
    core::cpu::gemm_bf16_as_f32(r, a, b, c);
  } else {
    core::cpu_backend().gemm(r, a, b, c);
  }
}

std::vector<Path> paths() {
  std::vector<Path> p = {Path::kFallback, Path::kBackend};
  if (core::cpu::cpu_bf16_gemm_slow_reason().empty()) p.push_back(Path::kOneDnn);
  return p;
}

const char* name(Path p) {
  return p == Path::kOneDnn ? "oneDNN" : p == Path::kFallback ? "fallback" : "backend";
}

// Every transpose, leading dimensions, batches (one A for all members too), the head's form
// (y = x W^T over a padded width), more rows than one fallback block; beta 0 always.
std::vector<GemmArgs> cases() {
  std::vector<GemmArgs> c;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      c.push_back({.trans_a = ta, .trans_b = tb, .m = 37, .n = 29, .k = 53});
  c.push_back({.trans_b = true, .m = 70, .n = 136, .k = 64});  // the head: 70 rows > one block
  c.push_back({.m = 9, .n = 7, .k = 300, .alpha = 0.5f});
  c.push_back({.m = 6, .n = 5, .k = 4, .lda = 9, .ldb = 7, .ldc = 8});
  c.push_back({.trans_a = true,
               .m = 5,
               .n = 6,
               .k = 7,
               .lda = 11,
               .ldc = 9,
               .batch = 3,
               .stride_a = 80,
               .stride_b = 42,
               .stride_c = 50});
  c.push_back({.m = 4, .n = 3, .k = 5, .batch = 4, .stride_a = 0, .stride_b = 15, .stride_c = 12});
  c.push_back({.m = 1, .n = 1, .k = 1});
  return c;
}

int64_t extent(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return std::max<int64_t>(1, (batch - 1) * stride + rows * ld);
}

struct Operands {
  std::vector<bf16> a, b;
  std::vector<float> wa, wb;  // the same values widened
};

// integers: A in quarters and B whole numbers of at most 4 bits, so every product and every
// partial sum is exact in f32 (at most 2^15 in quarter steps) in any order, while the sums need
// up to 17 significant bits: their rounding to bf16 is decided by the rounding alone, ties
// included. Otherwise normal values.
Operands operands(const GemmArgs& r, uint64_t seed, bool integers) {
  Operands o;
  const int64_t na = extent(r.batch, r.stride_a, r.trans_a ? r.k : r.m, r.lda);
  const int64_t nb = extent(r.batch, r.stride_b, r.trans_b ? r.n : r.k, r.ldb);
  core::Rng rng(seed);
  auto value = [&](int64_t i, uint64_t s, float step) {
    if (integers) return step * (static_cast<float>(rng.next_below(31)) - 15.0f);
    return static_cast<float>(core::rng_normal(s, i));
  };
  for (int64_t i = 0; i < na; ++i)
    o.a.push_back(kmath::bf16_from_float(value(i, seed, 0.25f)));
  for (int64_t i = 0; i < nb; ++i)
    o.b.push_back(kmath::bf16_from_float(value(i, seed + 1, 1.0f)));
  for (bf16 x : o.a)
    o.wa.push_back(kmath::float_from_bf16(x));
  for (bf16 x : o.b)
    o.wb.push_back(kmath::float_from_bf16(x));
  return o;
}

// C with every element a signalling pattern, so elements left unwritten show.
constexpr uint16_t kUnwritten = 0x7FA1;

std::vector<bf16> fresh_c(const GemmArgs& r) {
  return std::vector<bf16>(static_cast<size_t>(extent(r.batch, r.stride_c, r.m, r.ldc)),
                           bf16{kUnwritten});
}

bool inside_c(const GemmArgs& r, int64_t i) {
  for (int64_t p = 0; p < r.batch; ++p) {
    const int64_t at = i - p * r.stride_c;
    if (at >= 0 && at / r.ldc < r.m && at % r.ldc < r.n) return true;
  }
  return false;
}

// With exact sums every path's f32 result is the exact value, so the bf16 C must be its rounding
// bit for bit (ties to even included); elements outside C stay as they were.
TEST(Bf16HeadGemm, ExactSumsAreRoundedOnceBitForBit) {
  for (Path path : paths()) {
    int64_t ties = 0, rounded = 0;
    uint64_t seed = 500;
    for (const GemmArgs& args : cases()) {
      const GemmArgs r = core::resolve_gemm_args(args);
      const Operands o = operands(r, seed += 10, true);
      std::vector<float> want(static_cast<size_t>(extent(r.batch, r.stride_c, r.m, r.ldc)));
      core::cpu::gemm(r, o.wa.data(), o.wb.data(), want.data());
      std::vector<bf16> c = fresh_c(r);
      run(path, r, o.a.data(), o.b.data(), c.data());
      for (int64_t i = 0; i < static_cast<int64_t>(c.size()); ++i) {
        if (!inside_c(r, i)) {
          ASSERT_EQ(c[i].bits, kUnwritten) << name(path) << ": wrote outside C at " << i;
          continue;
        }
        const uint32_t low = kmath::float_bits(want[i]) & 0xFFFFu;
        ties += low == 0x8000u;
        rounded += low != 0;
        ASSERT_EQ(c[i].bits, kmath::bf16_from_float(want[i]).bits)
            << name(path) << " m " << r.m << " n " << r.n << " k " << r.k << " at " << i
            << ": exact f32 " << want[i];
      }
    }
    // The operands must exercise the rounding: values that round, and ties.
    EXPECT_GT(rounded, 1000) << name(path);
    EXPECT_GT(ties, 10) << name(path);
    std::printf("[ measured ] %s: %lld rounded values, %lld ties, all bit for bit\n", name(path),
                static_cast<long long>(rounded), static_cast<long long>(ties));
  }
}

// sum_l |op(A)_il op(B)_lj| of member p: the scale of the accumulation bar.
double mass(const GemmArgs& g, const Operands& o, int64_t p, int64_t i, int64_t j) {
  double m = 0;
  for (int64_t l = 0; l < g.k; ++l) {
    const float av = o.wa[p * g.stride_a + (g.trans_a ? l * g.lda + i : i * g.lda + l)];
    const float bv = o.wb[p * g.stride_b + (g.trans_b ? j * g.ldb + l : l * g.ldb + j)];
    m += std::fabs(double(av) * bv);
  }
  return m;
}

// Random values: each bf16 element is the rounding of an f32 sum s within the accumulation bar
// of the f32 GEMM's (both within gamma_(k+2) |alpha| mass of the exact value, tests/core/
// gemm_bar.h), and rounding moves s by at most half a bf16 unit, 2^-8 |s|: so
// |got - want| <= bar + 2^-8 (|want| + bar). Where the two f32 sums agree the element is the
// f32 GEMM's rounded bit for bit; the count shows how often (the fallback: always).
TEST(Bf16HeadGemm, RandomValuesWithinOneRoundingOfTheF32Gemm) {
  for (Path path : paths()) {
    uint64_t seed = 700;
    int64_t exact = 0, total = 0;
    double worst = 0;
    for (const GemmArgs& args : cases()) {
      const GemmArgs r = core::resolve_gemm_args(args);
      const Operands o = operands(r, seed += 10, false);
      std::vector<float> want(static_cast<size_t>(extent(r.batch, r.stride_c, r.m, r.ldc)));
      core::cpu::gemm(r, o.wa.data(), o.wb.data(), want.data());
      std::vector<bf16> c = fresh_c(r);
      run(path, r, o.a.data(), o.b.data(), c.data());
      const double gamma = 2 * core::test::gamma_bound(r.k + 2, 0x1p-24);
      for (int64_t p = 0; p < r.batch; ++p) {
        for (int64_t i = 0; i < r.m; ++i) {
          for (int64_t j = 0; j < r.n; ++j) {
            const int64_t at = p * r.stride_c + i * r.ldc + j;
            ++total;
            exact += c[at].bits == kmath::bf16_from_float(want[at]).bits;
            const double bar = gamma * std::fabs(r.alpha) * mass(r, o, p, i, j);
            const double allowed = bar + 0x1p-8 * (std::fabs(want[at]) + bar) + 1e-300;
            const double d = std::fabs(double(kmath::float_from_bf16(c[at])) - want[at]);
            ASSERT_LE(d, allowed) << name(path) << " m " << r.m << " n " << r.n << " k " << r.k
                                  << " at " << at;
            worst = std::max(worst, d / allowed);
          }
        }
      }
    }
    std::printf(
        "[ measured ] %s: %lld of %lld elements bit for bit the f32 GEMM rounded; the largest "
        "difference %.3g of the bar\n",
        name(path), static_cast<long long>(exact), static_cast<long long>(total), worst);
    if (path == Path::kFallback) {
      EXPECT_EQ(exact, total) << "the fallback is the f32 GEMM rounded";
    }
  }
}

// oneDNN's bf16 C is its own f32 C rounded once by kmath's rule, bit for bit, on random values
// and on sums that fall below the smallest normal f32, 2^-126: oneDNN flushes those to zero in
// its f32 output too (the bf16 GEMM with an f32 C already did), while the fallback, which rounds
// OpenBLAS's f32 sums with round_to_bf16, keeps them as kmath does (bf16 subnormals).
TEST(Bf16HeadGemm, OneDnnRoundsItsOwnF32ResultAndFlushesSubnormals) {
  if (!core::cpu::cpu_bf16_gemm_slow_reason().empty())
    GTEST_SKIP() << "oneDNN's bf16 matmul is used only with bf16 instructions";
  uint64_t seed = 1100;
  for (const GemmArgs& args : cases()) {
    const GemmArgs r = core::resolve_gemm_args(args);
    const Operands o = operands(r, seed += 10, false);
    std::vector<float> f(static_cast<size_t>(extent(r.batch, r.stride_c, r.m, r.ldc)));
    core::cpu::onednn_gemm(r, o.a.data(), o.b.data(), f.data());
    std::vector<bf16> c = fresh_c(r);
    core::cpu::onednn_gemm(r, o.a.data(), o.b.data(), c.data());
    for (size_t i = 0; i < c.size(); ++i) {
      if (inside_c(r, static_cast<int64_t>(i))) {
        ASSERT_EQ(c[i].bits, kmath::bf16_from_float(f[i]).bits) << "at " << i;
      }
    }
  }
  // (1 + 2^-7) s - s = 2^-7 s: a subnormal f32 for s <= 2^-120.
  const GemmArgs r = core::resolve_gemm_args({.m = 1, .n = 1, .k = 2});
  for (float s : {0x1p-120f, 0x1p-124f, 0x1p-126f}) {
    const bf16 a[2] = {kmath::bf16_from_float(1.0078125f * s), kmath::bf16_from_float(-s)};
    const bf16 b[2] = {kmath::bf16_from_float(1.0f), kmath::bf16_from_float(1.0f)};
    bf16 onednn{kUnwritten}, fallback{kUnwritten};
    core::cpu::onednn_gemm(r, a, b, &onednn);
    core::cpu::gemm_bf16_as_f32(r, a, b, &fallback);
    EXPECT_EQ(onednn.bits, 0) << "s " << s;
    EXPECT_EQ(fallback.bits, kmath::bf16_from_float(0.0078125f * s).bits) << "s " << s;
    EXPECT_NE(fallback.bits, 0) << "s " << s;
  }
}

TEST(Bf16HeadGemm, BetaMustBeZeroAndAnEmptyProductZeroes) {
  std::vector<bf16> x(64, kmath::bf16_from_float(1.0f)), c(64, bf16{kUnwritten});
  EXPECT_THROW(core::cpu_backend().gemm({.m = 4, .n = 4, .k = 4, .beta = 1.0f}, x.data(), x.data(),
                                        c.data()),
               core::Error);
  core::cpu_backend().gemm({.m = 4, .n = 3, .k = 0, .ldc = 5}, x.data(), x.data(), c.data());
  for (int64_t i = 0; i < 20; ++i)
    ASSERT_EQ(c[i].bits, i % 5 < 3 ? 0 : kUnwritten) << i;
}

// ---- the cross-entropy on bf16 logits ------------------------------------------------------

struct ClassifierCase {
  int64_t N, V, Vp;
  float cap, scale;
};

// Rows of odd and even widths, padded and not (V = Vp: model.loss_over_padding's softmax over
// every padded column), GPT-2's width; the tanh cap and the sigmoid form's (model.softcap 30
// sigmoid(z / s) is (30 / 2) tanh over logits the head scales by 30 / (4 s), whose gain enters the
// scale), none.
std::vector<ClassifierCase> classifier_cases() {
  return {{37, 1000, 1024, 0.0f, 1.0f / 37}, {37, 1000, 1024, 15.0f, 0.5f},
          {5, 999, 1001, 15.0f, 1.0f / 5},   {3, 7, 7, 0.0f, 1.0f / 3},
          {4, 1, 16, 0.0f, 0.25f},           {6, 128, 128, 15.0f, 30.0f / (4 * 7.5f) / 6},
          {2, 50257, 50304, 0.0f, 1.0f / 2}, {3, 50304, 50304, 15.0f, 1.0f / 3}};
}

// The logits as the bf16 head writes them: normal values of standard deviation 3 rounded, and
// huge values in the padded columns (outside the softmax, they must not matter).
std::vector<bf16> bf16_logits(const ClassifierCase& k, uint64_t seed) {
  std::vector<bf16> z(static_cast<size_t>(k.N * k.Vp));
  for (int64_t i = 0; i < k.N * k.Vp; ++i) {
    const float v = i % k.Vp < k.V ? static_cast<float>(3.0 * core::rng_normal(seed, i)) : 1e4f;
    z[i] = kmath::bf16_from_float(v);
  }
  return z;
}

std::vector<int32_t> targets_of(const ClassifierCase& k) {
  std::vector<int32_t> t(static_cast<size_t>(k.N));
  for (int64_t n = 0; n < k.N; ++n)
    t[n] = static_cast<int32_t>((n * 7919 + 3) % k.V);
  return t;
}

// On the CPU the bf16 op is the f32 op's code on the widened logits (the same order of f32
// sums): the losses equal the f32 op's bit for bit and each d logit is the f32 op's rounded once
// (zeros in the padded columns); in place over the logits, into another buffer and with the
// losses only, all the same.
TEST(Bf16HeadClassifier, EqualsTheF32OneOnTheRoundedLogits) {
  core::Backend& be = core::cpu_backend();
  uint64_t seed = 900;
  for (const ClassifierCase& k : classifier_cases()) {
    const std::vector<bf16> z = bf16_logits(k, ++seed);
    const std::vector<int32_t> t = targets_of(k);
    std::vector<float> wide(z.size());
    for (size_t i = 0; i < z.size(); ++i)
      wide[i] = kmath::float_from_bf16(z[i]);
    std::vector<float> loss(k.N), d(z.size());
    be.cross_entropy(loss.data(), d.data(), wide.data(), t.data(), k.N, k.V, k.Vp, k.cap, k.scale);

    std::vector<float> loss_apart(k.N), loss_in_place(k.N), loss_only(k.N);
    std::vector<bf16> apart(z.size(), bf16{kUnwritten}), in_place = z;
    be.cross_entropy(loss_apart.data(), apart.data(), z.data(), t.data(), k.N, k.V, k.Vp, k.cap,
                     k.scale);
    be.cross_entropy(loss_in_place.data(), in_place.data(), in_place.data(), t.data(), k.N, k.V,
                     k.Vp, k.cap, k.scale);
    be.cross_entropy(loss_only.data(), static_cast<bf16*>(nullptr), z.data(), t.data(), k.N, k.V,
                     k.Vp, k.cap, k.scale);
    const std::string what = "N " + std::to_string(k.N) + " V " + std::to_string(k.V) + " Vp " +
                             std::to_string(k.Vp) + " cap " + std::to_string(k.cap);
    EXPECT_EQ(loss_apart, loss) << what;
    EXPECT_EQ(loss_in_place, loss) << what;
    EXPECT_EQ(loss_only, loss) << what;
    for (size_t i = 0; i < z.size(); ++i) {
      ASSERT_EQ(apart[i].bits, kmath::bf16_from_float(d[i]).bits) << what << " at " << i;
      ASSERT_EQ(in_place[i].bits, apart[i].bits) << what << " in place, at " << i;
      if (static_cast<int64_t>(i) % k.Vp >= k.V) {
        ASSERT_EQ(apart[i].bits, 0) << what << ": padded column " << i % k.Vp;
      }
    }
    for (float l : loss)
      ASSERT_TRUE(std::isfinite(l)) << what;
  }
}

TEST(Bf16HeadClassifier, RefusesATargetOutsideTheSoftmax) {
  std::vector<bf16> z(2 * 8, kmath::bf16_from_float(0.5f));
  std::vector<int32_t> t = {1, 6};
  std::vector<float> loss(2);
  EXPECT_THROW(core::cpu_backend().cross_entropy(loss.data(), z.data(), z.data(), t.data(), 2, 6, 8,
                                                 0.0f, 1.0f),
               core::Error);
}

}  // namespace
