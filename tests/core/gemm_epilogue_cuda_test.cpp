// GemmOps::gemm_epilogue on the device against the CPU's (itself bit for bit the unfused ops,
// gemm_epilogue_test.cpp): every kind, f32 and bf16 inputs, f32 and bf16 D, C != D (a bf16 C with
// a bf16 D: the bf16 residual add), for the fused cuBLASLt path and for the unfused ones
// (ENGINE_CUDA_GEMM_EPILOGUE=0, ENGINE_CUDA_GEMM_EPILOGUE_BF16_C=0). Skips without a device.
//
// The bars: an f32 D within 2e-5 of max(1, |value|): the accumulation order over k <= 64 of
// O(1) terms, and cuBLASLt's GELU against kmath::gelu_tanh (the tanh form; the erf form differs
// by up to 1.8e-4 on these scales, so the bar tells the two apart). A bf16 D within one bf16
// unit (2^-7 relative, or 2^-7 absolute below 1): the f32 values may round to either neighbour.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/kernel_math.h"
#include "tests/backend_test_data.h"
#include "tests/cuda_vs_cpu.h"

namespace core {
namespace {

using test::CudaVsCpu;
using test::DeviceScratch;
using test_data::random_vector;

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  cpu_backend().f32_to_bf16(out.data(), v.data(), static_cast<int64_t>(v.size()));
  return out;
}

std::vector<float> widen(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = kmath::float_from_bf16(v[i]);
  return out;
}

struct Shape {
  bool trans_a, trans_b;
  int64_t m, n, k;
};

// n and the leading dimensions multiples of 8 (cuBLASLt's aux), and odd ones (its fallback).
const Shape kShapes[] = {{false, true, 64, 96, 48},
                         {false, true, 37, 53, 29},
                         {true, false, 40, 24, 64},
                         {false, false, 128, 256, 32}};

// Every kind on both backends with one device backend; returns the worst error over the bar.
double compare_all(Backend& gpu, DeviceScratch& dev, const std::string& path) {
  Backend& cpu = cpu_backend();
  double worst = 0;
  uint64_t seed = 700;
  for (const Shape& s : kShapes) {
    seed += 10;
    const int64_t mn = s.m * s.n;
    const auto a = random_vector(s.m * s.k, seed, 0.3f),
               b = random_vector(s.k * s.n, seed + 1, 0.3f);
    const auto c = random_vector(mn, seed + 2), bias = random_vector(s.n, seed + 3);
    const auto dbias0 = random_vector(s.m, seed + 4), pre = random_vector(mn, seed + 5, 2.0f);
    const auto a16 = to_bf16(a), b16 = to_bf16(b), pre16 = to_bf16(pre);
    for (GemmEpilogue kind : {GemmEpilogue::none, GemmEpilogue::bias, GemmEpilogue::bias_gelu,
                              GemmEpilogue::dgelu, GemmEpilogue::bgrad}) {
      const bool gelu = kind == GemmEpilogue::bias_gelu || kind == GemmEpilogue::dgelu;
      for (int inputs = 0; inputs < 2; ++inputs) {  // f32, bf16
        // C: none (beta 0), another matrix, or D itself (beta 1 in place, as dW accumulates).
        for (int c_mode : {0, 1, 2}) {
          const bool with_c = c_mode == 1;
          if (c_mode != 0 && gelu) continue;
          GemmArgs g;
          g.trans_a = s.trans_a || kind == GemmEpilogue::bgrad, g.trans_b = s.trans_b;
          g.m = s.m, g.n = s.n, g.k = s.k, g.beta = c_mode != 0 ? 1.0f : 0.0f;
          std::vector<float> d = c_mode == 2 ? c : std::vector<float>(mn, 0.0f), aux = pre,
                             dbias = dbias0;
          float* gd = dev.upload(d);
          float* gaux = dev.upload(pre);
          float* gdbias = dev.upload(dbias0);
          GemmEpilogueArgs ep{kind, with_c ? c.data() : nullptr, bias.data(), dbias.data()};
          GemmEpilogueArgs gep{kind, with_c ? dev.upload(c) : nullptr, dev.upload(bias), gdbias};
          if (inputs == 0) {
            cpu.gemm_epilogue(g, ep, a.data(), b.data(), d.data(), gelu ? aux.data() : nullptr);
            gpu.gemm_epilogue(g, gep, dev.upload(a), dev.upload(b), gd, gelu ? gaux : nullptr);
          } else {
            cpu.gemm_epilogue(g, ep, a16.data(), b16.data(), d.data(), gelu ? aux.data() : nullptr);
            gpu.gemm_epilogue(g, gep, dev.upload(a16), dev.upload(b16), gd, gelu ? gaux : nullptr);
          }
          const std::string what = path + " " + gemm_epilogue_name(kind) +
                                   (inputs ? " bf16" : " f32") + " inputs m " +
                                   std::to_string(s.m) + " n " + std::to_string(s.n) +
                                   (c_mode == 1   ? " C != D"
                                    : c_mode == 2 ? " C == D"
                                                  : "");
          const double e = std::max({test::max_rel_error(dev.download(gd, mn), d),
                                     test::max_rel_error(dev.download(gaux, mn), aux),
                                     test::max_rel_error(dev.download(gdbias, s.m), dbias)});
          EXPECT_LE(e, 2e-5) << what;
          worst = std::max(worst, e / 2e-5);
        }
      }
      if (kind == GemmEpilogue::bgrad) continue;
      // bf16 D and aux; for none and bias also with a bf16 C (the bf16 residual stream's add):
      // none (beta 0), another matrix, or D itself.
      const auto c16 = to_bf16(c);
      for (int c_mode : {0, 1, 2}) {
        if (c_mode != 0 && gelu) continue;
        GemmArgs g;
        g.trans_a = s.trans_a, g.trans_b = s.trans_b;
        g.m = s.m, g.n = s.n, g.k = s.k, g.beta = c_mode != 0 ? 1.0f : 0.0f;
        std::vector<bf16> d = c_mode == 2 ? c16 : std::vector<bf16>(mn), aux = pre16;
        bf16* gd = dev.upload(d);
        bf16* gaux = dev.upload(pre16);
        const bf16* c_cpu = c_mode == 1 ? c16.data() : nullptr;
        const bf16* c_gpu = c_mode == 1 ? dev.upload(c16) : nullptr;
        cpu.gemm_epilogue(g, {kind, nullptr, bias.data(), nullptr, c_cpu}, a16.data(), b16.data(),
                          d.data(), gelu ? aux.data() : nullptr);
        gpu.gemm_epilogue(g, {kind, nullptr, dev.upload(bias), nullptr, c_gpu}, dev.upload(a16),
                          dev.upload(b16), gd, gelu ? gaux : nullptr);
        const double e = std::max(test::max_rel_error(widen(dev.download(gd, mn)), widen(d)),
                                  test::max_rel_error(widen(dev.download(gaux, mn)), widen(aux)));
        EXPECT_LE(e, 0x1p-7) << path << " " << gemm_epilogue_name(kind) << " bf16 D m " << s.m
                             << (c_mode == 1   ? " bf16 C != D"
                                 : c_mode == 2 ? " bf16 C == D"
                                               : "");
        worst = std::max(worst, e / 0x1p-7);
      }
    }
  }
  return worst;
}

// The bf16 residual add (bf16 C and D) where its layout varies, on one shape and one backend:
// C and D views 8 elements (16 bytes) or 1 element (2 bytes) into their buffers, apart and in
// place (a plan per alignment of C and D: cuBLASLt's MIN_ALIGNMENT_C/D_BYTES, the unfused ops
// below 16 bytes); a strided D (ldc > n, kind none) apart and in place, whose gaps stay as they
// were; the empty product (k 0: D = round(C (+ bias))). Returns the worst error over the bar.
double compare_bf16_c_layouts(Backend& gpu, DeviceScratch& dev, const std::string& path) {
  Backend& cpu = cpu_backend();
  struct Case {
    GemmEpilogue kind;
    int64_t k, ldc, c_offset, d_offset;
    bool in_place;
  };
  const int64_t m = 48, n = 64;
  std::vector<Case> cases;
  for (GemmEpilogue kind : {GemmEpilogue::none, GemmEpilogue::bias}) {
    for (auto [c_offset, d_offset] :
         {std::pair<int64_t, int64_t>{0, 0}, {8, 0}, {1, 0}, {0, 8}, {8, 8}, {0, 1}})
      cases.push_back({kind, 40, n, c_offset, d_offset, false});
    for (int64_t d_offset : {0, 8, 1})
      cases.push_back({kind, 40, n, 0, d_offset, true});
    for (bool in_place : {false, true})
      cases.push_back({kind, 0, n, 0, 0, in_place});
  }
  for (int64_t ldc : {n + 8, n + 3})
    for (bool in_place : {false, true})
      cases.push_back({GemmEpilogue::none, 40, ldc, 0, 0, in_place});
  double worst = 0;
  uint64_t seed = 950;
  for (const Case& t : cases) {
    seed += 10;
    const int64_t span = (m - 1) * t.ldc + n;
    // Host and device buffers alike: `offset` elements of padding, then the matrix at ldc.
    auto padded = [](const std::vector<bf16>& x, int64_t offset) {
      std::vector<bf16> p(static_cast<size_t>(offset), bf16{0});
      p.insert(p.end(), x.begin(), x.end());
      return p;
    };
    const auto a16 = to_bf16(random_vector(m * t.k, seed, 0.3f)),
               b16 = to_bf16(random_vector(n * t.k, seed + 1, 0.3f));
    const auto bias = random_vector(n, seed + 2);
    const auto c_host = padded(to_bf16(random_vector(span, seed + 3)), t.c_offset);
    auto d_host = t.in_place ? padded(to_bf16(random_vector(span, seed + 3)), t.d_offset)
                             : padded(to_bf16(random_vector(span, seed + 4)), t.d_offset);
    const bf16* gc = dev.upload(c_host) + t.c_offset;
    bf16* gd = dev.upload(d_host) + t.d_offset;
    GemmArgs g;
    g.trans_b = true;
    g.m = m, g.n = n, g.k = t.k, g.ldc = t.ldc, g.beta = 1.0f;
    cpu.gemm_epilogue(
        g,
        {t.kind, nullptr, bias.data(), nullptr, t.in_place ? nullptr : c_host.data() + t.c_offset},
        a16.data(), b16.data(), d_host.data() + t.d_offset, nullptr);
    gpu.gemm_epilogue(g, {t.kind, nullptr, dev.upload(bias), nullptr, t.in_place ? nullptr : gc},
                      dev.upload(a16), dev.upload(b16), gd, nullptr);
    // The whole span, gaps included: the gaps hold their random values on both.
    const std::vector<bf16> want(d_host.begin() + t.d_offset, d_host.end());
    const double e = test::max_rel_error(widen(dev.download(gd, span)), widen(want));
    EXPECT_LE(e, 0x1p-7) << path << " " << gemm_epilogue_name(t.kind) << " k " << t.k << " ldc "
                         << t.ldc << " C offset " << t.c_offset << " D offset " << t.d_offset
                         << (t.in_place ? " in place" : "");
    worst = std::max(worst, e / 0x1p-7);
  }
  return worst;
}

TEST_F(CudaVsCpu, GemmEpilogueBf16CLayoutsMatchTheCpu) {
  const double fused = compare_bf16_c_layouts(gpu(), dev(), "fused");
  setenv("ENGINE_CUDA_GEMM_EPILOGUE_BF16_C", "0", 1);
  std::unique_ptr<Backend> unfused = make_cuda_backend(0);
  unsetenv("ENGINE_CUDA_GEMM_EPILOGUE_BF16_C");
  double w = 0;
  {
    DeviceScratch scratch(*unfused);
    w = compare_bf16_c_layouts(*unfused, scratch, "bf16 C unfused");
  }
  std::printf("[ measured ] bf16 C layouts vs cpu: fused %.3g, unfused %.3g of the bar\n", fused,
              w);
}

TEST_F(CudaVsCpu, GemmEpilogueFusedMatchesTheCpu) {
  const double w = compare_all(gpu(), dev(), "fused");
  std::printf("[ measured ] gemm_epilogue (cuBLASLt) vs cpu: %.3g of the bar\n", w);
}

// Every operand a view 16 bytes into its buffer (cuBLASLt's minimum, not the 256 its heuristic
// assumes unless told), then the same shape 256-byte aligned: a plan per alignment.
TEST_F(CudaVsCpu, GemmEpilogueFusedOn16ByteAlignedViews) {
  Backend& cpu = cpu_backend();
  const int64_t m = 64, n = 96, k = 48, mn = m * n, offset = 4;
  const auto a = random_vector(m * k, 900, 0.3f), b = random_vector(k * n, 901, 0.3f);
  const auto bias = random_vector(n, 902), pre = random_vector(mn, 903, 2.0f),
             dbias0 = random_vector(m, 904);
  for (GemmEpilogue kind :
       {GemmEpilogue::bias, GemmEpilogue::bias_gelu, GemmEpilogue::dgelu, GemmEpilogue::bgrad}) {
    const bool gelu = kind == GemmEpilogue::bias_gelu || kind == GemmEpilogue::dgelu;
    for (bool shifted : {true, false}) {
      auto put = [&](const std::vector<float>& x) {
        if (!shifted) return dev().upload(x);
        std::vector<float> padded(offset, 0.0f);
        padded.insert(padded.end(), x.begin(), x.end());
        return dev().upload(padded) + offset;
      };
      GemmArgs g;
      g.trans_a = kind == GemmEpilogue::bgrad;
      g.m = m, g.n = n, g.k = k;
      std::vector<float> d(mn, 0.0f), aux = pre, dbias = dbias0;
      float* gd = put(d);
      float* gaux = put(pre);
      float* gdbias = put(dbias0);
      cpu.gemm_epilogue(g, {kind, nullptr, bias.data(), dbias.data()}, a.data(), b.data(), d.data(),
                        gelu ? aux.data() : nullptr);
      gpu().gemm_epilogue(g, {kind, nullptr, put(bias), gdbias}, put(a), put(b), gd,
                          gelu ? gaux : nullptr);
      const double e = std::max({test::max_rel_error(dev().download(gd, mn), d),
                                 test::max_rel_error(dev().download(gaux, mn), aux),
                                 test::max_rel_error(dev().download(gdbias, m), dbias)});
      EXPECT_LE(e, 2e-5) << gemm_epilogue_name(kind)
                         << (shifted ? ": 16-byte aligned views" : ": 256-byte aligned");
    }
  }
}

TEST_F(CudaVsCpu, GemmEpilogueUnfusedMatchesTheCpu) {
  setenv("ENGINE_CUDA_GEMM_EPILOGUE", "0", 1);
  std::unique_ptr<Backend> unfused = make_cuda_backend(0);
  unsetenv("ENGINE_CUDA_GEMM_EPILOGUE");
  double w = 0;
  {
    DeviceScratch scratch(*unfused);
    w = compare_all(*unfused, scratch, "unfused");
  }
  std::printf("[ measured ] gemm_epilogue (unfused) vs cpu: %.3g of the bar\n", w);
}

// The bf16 residual add's fallback: ENGINE_CUDA_GEMM_EPILOGUE_BF16_C=0 runs only the bf16 D with
// a bf16 C unfused (C widened into an f32 scratch), every other call fused as before.
TEST_F(CudaVsCpu, GemmEpilogueBf16CUnfusedMatchesTheCpu) {
  setenv("ENGINE_CUDA_GEMM_EPILOGUE_BF16_C", "0", 1);
  std::unique_ptr<Backend> unfused = make_cuda_backend(0);
  unsetenv("ENGINE_CUDA_GEMM_EPILOGUE_BF16_C");
  double w = 0;
  {
    DeviceScratch scratch(*unfused);
    w = compare_all(*unfused, scratch, "bf16 C unfused");
  }
  std::printf("[ measured ] gemm_epilogue (bf16 C unfused) vs cpu: %.3g of the bar\n", w);
}

}  // namespace
}  // namespace core
