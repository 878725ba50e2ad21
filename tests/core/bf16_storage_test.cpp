// bf16 activation storage on the CPU (docs/precision.md): the rounding of a block of floats on
// AVX512_BF16 (vcvtne2ps2bf16) bit for bit the software rounding of kmath::bf16_from_float, and
// each op that stores bf16 (the norms, the activations and their gradients, the head merge, the
// qkv gradient) bit for bit its f32 op rounded, with the f32 statistics unchanged; the ops that
// read bf16 (the bias gradient, the row gather) the f32 op of the widened values.
// bf16_isa_forced_fallback runs these again with ENGINE_CPU_NO_BF16=1 (the software rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu/bf16_rounding.h"
#include "core/cpu/cpu_isa.h"
#include "core/kernel_math.h"
#include "core/rng.h"

namespace {

namespace kmath = core::kmath;
using core::bf16;

float from_bits(uint32_t u) {
  return kmath::float_from_bits(u);
}

// Every bf16 high half with the low halves that decide a rounding (zero, one, just below, at
// and just above half, the largest): zeros, subnormals, normals, overflow, infinities, NaNs.
std::vector<float> rounding_cases() {
  std::vector<float> x;
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      x.push_back(from_bits((hi << 16) | lo));
  return x;
}

void expect_rounded_as_kmath(const std::vector<bf16>& got, const std::vector<float>& x,
                             int64_t offset = 0) {
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i].bits, kmath::bf16_from_float(x[offset + i]).bits)
        << "element " << i << ", float bits " << std::hex << kmath::float_bits(x[offset + i]);
}

TEST(Bf16StoreRounding, SoftwarePathIsTheElementMath) {
  const std::vector<float> x = rounding_cases();
  std::vector<bf16> got(x.size());
  core::cpu::round_to_bf16_software(got.data(), x.data(), static_cast<int64_t>(x.size()));
  expect_rounded_as_kmath(got, x);
}

// The instruction flushes subnormal inputs to zero; the kernel rounds a group that holds one in
// software, so every case (and every tail length and alignment) matches kmath bit for bit.
TEST(Bf16StoreRounding, Avx512PathIsTheElementMath) {
  if (!core::cpu::detect_cpu_bf16_isa().avx512_bf16) GTEST_SKIP() << "no AVX512_BF16 here";
  const std::vector<float> x = rounding_cases();
  std::vector<bf16> got(x.size());
  core::cpu::round_to_bf16_avx512(got.data(), x.data(), static_cast<int64_t>(x.size()));
  expect_rounded_as_kmath(got, x);
  // Groups with one subnormal among normals, and every tail length from an odd offset.
  std::vector<float> mixed(101);
  for (size_t i = 0; i < mixed.size(); ++i)
    mixed[i] = i % 37 == 5 ? 0x1.8p-134f * float(i) : 1.0f + float(i) * 0x1p-9f;
  for (int64_t offset : {0, 1, 3}) {
    for (int64_t n = 0; n + offset <= 101; n += 7) {
      std::vector<bf16> out(static_cast<size_t>(n));
      core::cpu::round_to_bf16_avx512(out.data(), mixed.data() + offset, n);
      expect_rounded_as_kmath(out, mixed, offset);
    }
  }
}

TEST(Bf16StoreRounding, DispatchFollowsTheInstructionsAndTheEnvironment) {
  const char* env = std::getenv(core::cpu::kNoBf16Env);
  const bool forced_off = env && std::string(env) == "1";
  EXPECT_EQ(core::cpu::round_to_bf16_has_avx512(),
            core::cpu::detect_cpu_bf16_isa().avx512_bf16 && !forced_off);
  const std::vector<float> x = rounding_cases();
  std::vector<bf16> got(x.size());
  core::cpu::round_to_bf16(got.data(), x.data(), static_cast<int64_t>(x.size()));
  expect_rounded_as_kmath(got, x);
}

// ---- ops that store bf16 --------------------------------------------------------------------

std::vector<float> normal_values(int64_t n, uint64_t seed, double scale = 1.0) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(scale * core::rng_normal(seed, static_cast<uint64_t>(i)));
  return x;
}

std::vector<bf16> rounded(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = kmath::bf16_from_float(x[i]);
  return out;
}

std::vector<float> widened(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = kmath::float_from_bf16(x[i]);
  return out;
}

void expect_bits_equal(const std::vector<bf16>& got, const std::vector<bf16>& want,
                       const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i].bits, want[i].bits) << what << " element " << i;
}

// The same, but for the sign of a zero: a written gradient keeps the product's sign (0 x -1 is
// -0), where the f32 op's accumulation into zeros gives +0.
void expect_equal_up_to_zero_sign(const std::vector<bf16>& got, const std::vector<bf16>& want,
                                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool zeros = (got[i].bits & 0x7FFF) == 0 && (want[i].bits & 0x7FFF) == 0;
    if (!zeros) {
      ASSERT_EQ(got[i].bits, want[i].bits) << what << " element " << i;
    }
  }
}

// A bf16 output filled with NaNs first, so an element the op fails to write shows.
std::vector<bf16> unwritten(size_t n) {
  return std::vector<bf16>(n, bf16{0x7FC1});
}

// Shapes: rows of a model's width (above the thread threshold) and an odd small one.
struct RowShape {
  int64_t N, C;
};
const RowShape kRowShapes[] = {{129, 768}, {7, 33}};

TEST(Bf16Store, NormsStoreTheF32OutputRoundedAndKeepF32Statistics) {
  core::Backend& be = core::cpu_backend();
  for (const RowShape s : kRowShapes) {
    const int64_t N = s.N, C = s.C;
    const std::vector<float> x = normal_values(N * C, 1, 3.0), w = normal_values(C, 2),
                             b = normal_values(C, 3);
    std::vector<float> out(N * C), mean(N), rstd(N), mean_b(N), rstd_b(N);
    std::vector<bf16> out_b = unwritten(N * C);
    be.layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                         1e-5f);
    be.layernorm_forward(out_b.data(), mean_b.data(), rstd_b.data(), x.data(), w.data(), b.data(),
                         N, C, 1e-5f);
    expect_bits_equal(out_b, rounded(out), "layernorm");
    EXPECT_EQ(mean_b, mean);
    EXPECT_EQ(rstd_b, rstd);

    out_b = unwritten(N * C);
    be.rmsnorm_forward(out.data(), rstd.data(), x.data(), N, C, 1e-6f);
    be.rmsnorm_forward(out_b.data(), rstd_b.data(), x.data(), N, C, 1e-6f);
    expect_bits_equal(out_b, rounded(out), "rmsnorm");
    EXPECT_EQ(rstd_b, rstd);
  }
}

// The activations and their gradients; the bf16 gradient is written (=), the f32 one accumulated
// into zeros (so only the sign of a zero may differ).
TEST(Bf16Store, ActivationsAndTheirGradientsAreTheF32OnesRounded) {
  core::Backend& be = core::cpu_backend();
  for (const int64_t n : {int64_t{100003}, int64_t{5}, int64_t{512}}) {
    const std::vector<float> pre = normal_values(n, 4, 2.0), dout = normal_values(n, 5);
    for (const bool gelu : {true, false}) {
      std::vector<float> act(n), dpre(n, 0.0f);
      std::vector<bf16> act_b = unwritten(n), dpre_b = unwritten(n);
      if (gelu) {
        be.gelu_forward(act.data(), pre.data(), n);
        be.gelu_forward(act_b.data(), pre.data(), n);
        be.gelu_backward(dpre.data(), pre.data(), dout.data(), n);
        be.gelu_backward(dpre_b.data(), pre.data(), dout.data(), n);
      } else {
        be.relu2_forward(act.data(), pre.data(), n);
        be.relu2_forward(act_b.data(), pre.data(), n);
        be.relu2_backward(dpre.data(), pre.data(), dout.data(), n);
        be.relu2_backward(dpre_b.data(), pre.data(), dout.data(), n);
      }
      expect_bits_equal(act_b, rounded(act), gelu ? "gelu" : "relu2");
      expect_equal_up_to_zero_sign(dpre_b, rounded(dpre),
                                   gelu ? "gelu backward" : "relu2 backward");
    }
  }
}

TEST(Bf16Store, QkvGradientIsTheF32OneRounded) {
  core::Backend& be = core::cpu_backend();
  const int64_t B = 3, T = 37, H = 4, hd = 24, D = H * hd, N = B * T;
  const std::vector<float> dq = normal_values(N * D, 7), dk = normal_values(N * D, 8),
                           dv = normal_values(N * D, 9);
  std::vector<float> dqkv(N * 3 * D, 0.0f);
  std::vector<bf16> dqkv_b = unwritten(N * 3 * D);
  be.split_heads_backward(dqkv.data(), dq.data(), dk.data(), dv.data(), B, T, H, hd);
  be.split_heads_backward(dqkv_b.data(), dq.data(), dk.data(), dv.data(), B, T, H, hd);
  expect_equal_up_to_zero_sign(dqkv_b, rounded(dqkv), "split_heads_backward");
}

// Attention in bf16 precision (core/ops/attention.h): the output stored as bf16 is the f32
// output rounded once (bit for bit, lse the same f32); the backward reads that bf16 output (delta
// from its widened values), so its gradients are bit for bit the f32 backward's run on the
// widened output, rounded once (bf16 d q, k, v) or as they are (the f32 overload the modern
// blocks take), and within a tight bar of the f32 backward on the f32 output (the rounding of
// out moves delta by about 2^-9 of dout . out). GPT-2's layout (q, k, v strided in qkv, out
// [B, T, H hd], d q, k, v straight into a bf16 d qkv) and packed heads; no mask, documents with a
// sliding window, and the record's block windows (model.window_block: begins on block bounds);
// T across query blocks and no multiple of them; heads per thread and one head (the GEMMs
// threaded).
double norm_relative(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0.0, w = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    w += double(want[i]) * want[i];
  }
  return std::sqrt(d / w);
}

struct AttentionCase {
  int64_t B, H, T, hd;
  bool strided;
  int mask;  // 0 none, 1 documents and a sliding window, 2 documents and block windows
};

std::vector<int32_t> key_begins(const AttentionCase& c) {
  std::vector<int32_t> begin(static_cast<size_t>(c.B * c.T));
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t doc = b == 0 ? (t >= 90 ? 90 : t >= 6 ? 6 : t >= 5 ? 5 : 0) : 0;
      const int64_t window = c.mask == 1 ? std::max<int64_t>(0, t - 36)  // a window of 37
                                         : std::max<int64_t>(0, (t / 16 - 1) * 16);  // 2 blocks
      begin[b * c.T + t] = static_cast<int32_t>(std::max(doc, window));
    }
  }
  return begin;
}

TEST(Bf16Store, AttentionStoresTheF32OutputAndGradientsRounded) {
  using L = core::AttentionLayout;
  core::Backend& be = core::cpu_backend();
  const AttentionCase cases[] = {{2, 3, 150, 16, true, 0}, {2, 3, 150, 16, true, 1},
                                 {2, 2, 131, 24, true, 2}, {1, 1, 130, 64, true, 1},
                                 {3, 2, 37, 8, false, 0},  {2, 2, 70, 12, false, 2}};
  double worst_delta = 0.0, worst_total = 0.0;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " T " +
                 std::to_string(c.T) + " hd " + std::to_string(c.hd) +
                 (c.strided ? " strided" : " packed") + " mask " + std::to_string(c.mask));
    const int64_t BH = c.B * c.H, T = c.T, hd = c.hd, D = c.H * hd, n = BH * T * hd;
    const std::vector<int32_t> begin = key_begins(c);
    const core::AttentionMask mask{c.mask ? begin.data() : nullptr, c.H};
    // Strided: q, k, v at x, x + D, x + 2 D of one [B, T, 3 D] buffer (their gradients likewise);
    // packed: three [BH, T, hd] buffers one after another in the same buffer.
    const core::HeadStrides in = L::token_rows(T, hd, 3 * D);
    const core::AttentionLayout layout =
        c.strided ? core::AttentionLayout{c.H, in, in, in, L::token_rows(T, hd, D)}
                  : core::AttentionLayout{};
    const int64_t part = c.strided ? D : n;  // from q to k to v
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const std::vector<float> qkv = normal_values(3 * n, 60, 1.5), dout = normal_values(n, 61);
    const float* x = qkv.data();

    std::vector<float> out(n), lse(BH * T), lse_b(BH * T);
    std::vector<bf16> out_b = unwritten(n);
    be.attention_forward(out.data(), lse.data(), x, x + part, x + 2 * part, BH, T, hd, scale, mask,
                         false, layout);
    be.attention_forward(out_b.data(), lse_b.data(), x, x + part, x + 2 * part, BH, T, hd, scale,
                         mask, false, layout);
    expect_bits_equal(out_b, rounded(out), "attention out");
    EXPECT_EQ(lse_b, lse);

    // The f32 backward on the widened bf16 output, and on the f32 output.
    const std::vector<float> out_w = widened(out_b);
    std::vector<float> d_w = normal_values(3 * n, 62), d_f = normal_values(3 * n, 63);
    float *dw = d_w.data(), *df = d_f.data();
    be.attention_backward(dw, dw + part, dw + 2 * part, dout.data(), out_w.data(), lse.data(), x,
                          x + part, x + 2 * part, BH, T, hd, scale, mask, false, layout);
    be.attention_backward(df, df + part, df + 2 * part, dout.data(), out.data(), lse.data(), x,
                          x + part, x + 2 * part, BH, T, hd, scale, mask, false, layout);
    std::vector<bf16> d_b = unwritten(3 * n);
    bf16* db = d_b.data();
    be.attention_backward(db, db + part, db + 2 * part, dout.data(), out_b.data(), lse.data(), x,
                          x + part, x + 2 * part, BH, T, hd, scale, mask, false, layout);
    expect_bits_equal(d_b, rounded(d_w), "attention d q, k, v (bf16)");
    std::vector<float> d_m = normal_values(3 * n, 64);
    float* dm = d_m.data();
    be.attention_backward(dm, dm + part, dm + 2 * part, dout.data(), out_b.data(), lse.data(), x,
                          x + part, x + 2 * part, BH, T, hd, scale, mask, false, layout);
    EXPECT_EQ(d_m, d_w) << "attention d q, k, v (f32, from the bf16 out)";
    worst_delta = std::max(worst_delta, norm_relative(d_w, d_f));
    worst_total = std::max(worst_total, norm_relative(widened(d_b), d_f));
  }
  // Against the f32 backward on the f32 output, in norm: delta from the rounded out alone moves
  // the f32 gradients by 1.9e-3 .. 2.9e-3 (dS = P (dP - delta) cancels), the gradients' own
  // rounding adds 1.6e-3 (uniform in 2^-9 relative), 2.6e-3 .. 3.3e-3 together (measured).
  std::printf("[ measured ] bf16 attention gradients vs f32 on the f32 out: delta %.3g, all %.3g\n",
              worst_delta, worst_total);
  EXPECT_LE(worst_delta, 4e-3);
  EXPECT_LE(worst_total, 5e-3);
}

// Ops that read bf16 compute what their f32 op computes from the widened values.
TEST(Bf16Store, BiasGradientAndRowGatherReadBf16Exactly) {
  core::Backend& be = core::cpu_backend();
  for (const RowShape s : kRowShapes) {
    const int64_t N = s.N, C = s.C;
    const std::vector<bf16> dy = rounded(normal_values(N * C, 10));
    const std::vector<float> dy_f = widened(dy);
    std::vector<float> db(C, 0.25f), db_f(C, 0.25f);
    be.bias_backward(db.data(), dy.data(), N, C);
    be.bias_backward(db_f.data(), dy_f.data(), N, C);
    EXPECT_EQ(db, db_f);

    std::vector<int32_t> index(2 * N + 1);
    for (size_t i = 0; i < index.size(); ++i)
      index[i] = static_cast<int32_t>((i * 7) % N);
    const int64_t n = static_cast<int64_t>(index.size());
    std::vector<bf16> rows = unwritten(n * C);
    std::vector<float> rows_f(n * C);
    be.gather_rows(rows.data(), dy.data(), index.data(), n, C);
    be.gather_rows(rows_f.data(), dy_f.data(), index.data(), nullptr, n, C);
    EXPECT_EQ(widened(rows), rows_f);
  }
}

// ---- the residual stream (bf16 in and out)
// -------------------------------------------------------
//
// bf16 precision stores the residual stream in bf16: the norms read it widened, the mixes and the
// embedding write it rounded once, the MoE's combine adds its rows from it. Each is the f32 op on
// the widened values, its output rounded once, bit for bit.

TEST(Bf16Store, NormsOfTheBf16StreamAreTheF32NormsOfTheWidenedStream) {
  core::Backend& be = core::cpu_backend();
  for (const RowShape s : kRowShapes) {
    const int64_t N = s.N, C = s.C;
    const std::vector<bf16> x = rounded(normal_values(N * C, 21, 3.0));
    const std::vector<float> xf = widened(x), w = normal_values(C, 22), b = normal_values(C, 23),
                             dy = normal_values(N * C, 24);
    std::vector<float> out(N * C), mean(N), rstd(N), mean_b(N), rstd_b(N);
    std::vector<bf16> out_b = unwritten(N * C);
    be.layernorm_forward(out.data(), mean.data(), rstd.data(), xf.data(), w.data(), b.data(), N, C,
                         1e-5f);
    be.layernorm_forward(out_b.data(), mean_b.data(), rstd_b.data(), x.data(), w.data(), b.data(),
                         N, C, 1e-5f);
    expect_bits_equal(out_b, rounded(out), "layernorm of bf16");
    EXPECT_EQ(mean_b, mean);
    EXPECT_EQ(rstd_b, rstd);
    // The backward accumulates (+=) into d inp and the parameter gradients, f32 as in fp32.
    std::vector<float> dx(N * C, 0.5f), dw(C, 0.25f), db(C, -0.25f);
    std::vector<float> dx_b = dx, dw_b = dw, db_b = db;
    be.layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), xf.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
    be.layernorm_backward(dx_b.data(), dw_b.data(), db_b.data(), dy.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
    EXPECT_EQ(dx_b, dx);
    EXPECT_EQ(dw_b, dw);
    EXPECT_EQ(db_b, db);

    out_b = unwritten(N * C);
    be.rmsnorm_forward(out.data(), rstd.data(), xf.data(), N, C, 1e-6f);
    be.rmsnorm_forward(out_b.data(), rstd_b.data(), x.data(), N, C, 1e-6f);
    expect_bits_equal(out_b, rounded(out), "rmsnorm of bf16");
    EXPECT_EQ(rstd_b, rstd);
    std::vector<float> dr(N * C, 0.5f), dr_b = dr;
    be.rmsnorm_backward(dr.data(), dy.data(), xf.data(), rstd.data(), N, C);
    be.rmsnorm_backward(dr_b.data(), dy.data(), x.data(), rstd.data(), N, C);
    EXPECT_EQ(dr_b, dr);
  }
}

TEST(Bf16Store, StreamMixesAndEmbeddingAreTheF32OnesRounded) {
  core::Backend& be = core::cpu_backend();
  for (const RowShape s : kRowShapes) {
    const int64_t n = s.N * s.C;
    const std::vector<bf16> a = rounded(normal_values(n, 31, 2.0)),
                            b = rounded(normal_values(n, 32, 2.0));
    const std::vector<float> af = widened(a), bf = widened(b), dout = normal_values(n, 33);
    const float wa = 0.75f, wb = -1.3f;
    for (const bool with_b : {true, false}) {
      const bool with_wa = with_b;  // the skip mix has no wa; the x0 mix both
      std::vector<float> out(n);
      std::vector<bf16> out_b = unwritten(n);
      be.scalar_mix(out.data(), with_wa ? &wa : nullptr, af.data(), &wb,
                    with_b ? bf.data() : nullptr, n);
      be.scalar_mix(out_b.data(), with_wa ? &wa : nullptr, a.data(), &wb,
                    with_b ? b.data() : nullptr, n);
      expect_bits_equal(out_b, rounded(out), "scalar_mix");
      std::vector<float> da(n, 0.5f), db(n, -0.5f), da_b = da, db_b = db;
      float dwa = 0.1f, dwb = 0.2f, dwa_b = dwa, dwb_b = dwb;
      be.scalar_mix_backward(da.data(), db.data(), &dwa, &dwb, with_wa ? &wa : nullptr, af.data(),
                             &wb, with_b ? bf.data() : nullptr, dout.data(), n);
      be.scalar_mix_backward(da_b.data(), db_b.data(), &dwa_b, &dwb_b, with_wa ? &wa : nullptr,
                             a.data(), &wb, with_b ? b.data() : nullptr, dout.data(), n);
      EXPECT_EQ(da_b, da);
      EXPECT_EQ(db_b, db);
      EXPECT_EQ(dwa_b, dwa);
      EXPECT_EQ(dwb_b, dwb);
    }
    // The embedding lookup with and without positions, written as the stream's first values.
    const int64_t B = 3, T = s.N, D = s.C, V = 11;
    const std::vector<float> wte = normal_values(V * D, 34), wpe = normal_values(T * D, 35);
    std::vector<int32_t> tokens(B * T);
    for (int64_t i = 0; i < B * T; ++i)
      tokens[i] = static_cast<int32_t>((i * 5 + 3) % V);
    for (const bool positions : {true, false}) {
      std::vector<float> out(B * T * D);
      std::vector<bf16> out_b = unwritten(B * T * D);
      be.embedding_forward(out.data(), tokens.data(), wte.data(), positions ? wpe.data() : nullptr,
                           B, T, D);
      be.embedding_forward(out_b.data(), tokens.data(), wte.data(),
                           positions ? wpe.data() : nullptr, B, T, D);
      expect_bits_equal(out_b, rounded(out), "embedding_forward");
    }
  }
}

// The MoE's residual add: each token's K gated rows added to the widened base in ascending row
// order is scatter_add_rows into an f32 copy of the base, rounded once; in place too.
TEST(Bf16Store, CombineRowsIsTheF32ScatterAddRounded) {
  core::Backend& be = core::cpu_backend();
  for (const RowShape s : kRowShapes) {
    const int64_t N = s.N, D = s.C;
    for (const int64_t K : {1, 2, 3}) {
      const int64_t M = N * K;
      // Dispatch rows in a scrambled order (as experts group them): slot (t, k) -> row.
      std::vector<int32_t> slot_row(M), row_token(M);
      for (int64_t i = 0; i < M; ++i) {
        const int64_t row = (i * 7919 + 13) % M;  // a permutation: 7919 is a prime above M
        slot_row[i] = static_cast<int32_t>(row);
        row_token[row] = static_cast<int32_t>(i / K);
      }
      const std::vector<bf16> base = rounded(normal_values(N * D, 41, 3.0));
      const std::vector<float> rows = normal_values(M * D, 42), gate = normal_values(M, 43);
      std::vector<float> want = widened(base);
      be.scatter_add_rows(want.data(), rows.data(), row_token.data(), gate.data(), M, D);
      std::vector<bf16> out = unwritten(N * D);
      be.combine_rows(out.data(), base.data(), rows.data(), slot_row.data(), gate.data(), N, K, D);
      expect_bits_equal(out, rounded(want), "combine_rows");
      std::vector<bf16> in_place = base;
      be.combine_rows(in_place.data(), in_place.data(), rows.data(), slot_row.data(), gate.data(),
                      N, K, D);
      expect_bits_equal(in_place, rounded(want), "combine_rows in place");
    }
  }
}

}  // namespace
