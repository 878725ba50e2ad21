#include "core/cpu/cpu_isa.h"

#include "core/cpu/cpu_gemm.h"
#include "core/cpu/onednn_gemm.h"

#include <cblas.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace core::cpu {

namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}
#endif

}  // namespace

CpuBf16Isa detect_cpu_bf16_isa() {
  CpuBf16Isa isa;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return isa;  // no OSXSAVE: no xgetbv
  const uint64_t xcr0 = read_xcr0();
  // SSE, AVX, opmask, upper halves of zmm0-15, zmm16-31; tile config and tile data.
  const bool os_zmm = (xcr0 & 0xE6) == 0xE6;
  const bool os_tiles = (xcr0 & (3ull << 17)) == (3ull << 17);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return isa;
  const bool avx512_core = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31));  // F BW VL
  const bool amx_bf16 = d & (1u << 22);
  const bool amx_tile = d & (1u << 24);
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  const bool avx512_bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));
  isa.avx512_bf16 = avx512_core && avx512_bf16 && os_zmm;
  isa.amx_bf16 = amx_bf16 && amx_tile && os_tiles;
#endif
  return isa;
}

std::string shown_env_value(const std::string& value) {
  constexpr size_t kShown = 64;
  if (value.size() <= kShown) return value;
  return value.substr(0, kShown) + "... (" + std::to_string(value.size()) + " characters)";
}

bool cpu_no_bf16_requested() {
  const char* env = std::getenv(kNoBf16Env);
  const std::string value = env != nullptr ? env : "";
  ENGINE_CHECK(value.empty() || value == "0" || value == "1",
               std::string(kNoBf16Env) + "=" + shown_env_value(value) +
                   ": must be 1 (treat the CPU as one without bf16 instructions) or 0 / unset");
  return value == "1";
}

const std::string& cpu_bf16_gemm_slow_reason() {
  static const std::string reason = [] {
    if (cpu_no_bf16_requested())
      return std::string(kNoBf16Env) + "=1 is set: bf16 GEMMs run as f32 GEMMs of the bf16 values";
    const CpuBf16Isa isa = detect_cpu_bf16_isa();
    if (isa.avx512_bf16 || isa.amx_bf16) return std::string();
    return std::string(
        "this CPU has neither AVX512_BF16 nor AMX-BF16 (cpuid), so bf16 GEMMs "
        "would run as f32 GEMMs of the bf16 values");
  }();
  return reason;
}

const std::string& describe_cpu() {
  static const std::string description = [] {
    // The name, and the family and model numbers: a name such as "AMD EPYC" is the same for
    // Zen 3, 4 and 5 (families 25, 25 and 26), whose kernels and speeds differ.
    std::string model = "unknown CPU", family, number;
    std::ifstream cpuinfo("/proc/cpuinfo");
    auto value = [](const std::string& line) {
      std::string v = line.substr(line.find(':') + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    };
    // The first processor's block (it ends at the first empty line); "model" is the key alone.
    for (std::string line; std::getline(cpuinfo, line) && !line.empty();) {
      const std::string key = line.substr(0, line.find_first_of("\t:"));
      if (key == "model name") model = value(line);
      if (key == "cpu family") family = value(line);
      if (key == "model") number = value(line);
    }
    if (!family.empty() && !number.empty())
      model += " (family " + family + ", model " + number + ")";
    std::string vector = "no AVX";
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx512f"))
      vector = "AVX-512";
    else if (__builtin_cpu_supports("avx2"))
      vector = "AVX2";
    else if (__builtin_cpu_supports("avx"))
      vector = "AVX";
#endif
    const CpuBf16Isa isa = detect_cpu_bf16_isa();
    std::string bf16 = isa.amx_bf16 ? " with AMX-BF16" : isa.avx512_bf16 ? " with AVX512_BF16" : "";
    if (bf16.empty())
      bf16 = ", no bf16 instructions";
    else if (!cpu_bf16_gemm_slow_reason().empty())
      bf16 += " (off: " + std::string(kNoBf16Env) + "=1)";
    const std::string trans_a =
        f32_trans_a_on_openblas() ? " (f32 weight gradients on OpenBLAS)" : "";
    return model + ", " + vector + bf16 + ", oneDNN " + onednn_isa() + trans_a + " and OpenBLAS " +
           openblas_get_corename() + " kernels";
  }();
  return description;
}

}  // namespace core::cpu
