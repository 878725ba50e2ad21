// Which bf16 dot-product instructions this CPU has, read once at start from cpuid and the OS's
// enabled register state (XCR0). bf16 GEMMs pay only with them: AVX512_BF16 (vdpbf16ps: Intel
// Cooper Lake and Sapphire Rapids on, AMD Zen 4 on) or AMX-BF16 (Intel Sapphire Rapids on).
#pragma once

#include <string>

namespace core::cpu {

struct CpuBf16Isa {
  bool avx512_bf16 = false;  // the instructions, and the OS saves the zmm and mask registers
  bool amx_bf16 = false;     // the tile instructions, and the OS saves the tile state
};

// What cpuid and XCR0 report on this CPU.
CpuBf16Isa detect_cpu_bf16_isa();

// The environment variable that makes the engine treat the CPU as one without bf16 dot-product
// instructions (tests of the fallback on machines that have them): ENGINE_CPU_NO_BF16=1.
inline constexpr const char* kNoBf16Env = "ENGINE_CPU_NO_BF16";

// Whether ENGINE_CPU_NO_BF16 asks for the fallback: unset, empty or 0 no, 1 yes. Any other value
// throws core::Error naming it ("true", "yes" and "abc" were taken as no without a word).
bool cpu_no_bf16_requested();

// An environment variable's value as a message shows it: at most 64 characters, then how many
// there are ("ENGINE_CPU_TRANS_A_GEMM=<5000 characters>" was echoed whole).
std::string shown_env_value(const std::string& value);

// Why bf16 GEMMs do not run on bf16 instructions here, in one line; empty when they do. Decided
// once per process (the first call), from detect_cpu_bf16_isa() and ENGINE_CPU_NO_BF16.
const std::string& cpu_bf16_gemm_slow_reason();

// This CPU in one line, for logs and benchmark tables, whose numbers depend on it: its model name,
// the widest vector instructions it runs (AVX-512, AVX2, AVX), whether bf16 GEMMs run on bf16
// instructions, and the kernels its GEMMs run: oneDNN's instruction set (the GEMMs,
// onednn_gemm.h; on AVX2 "(f32 weight gradients on OpenBLAS)", cpu_gemm.h) and OpenBLAS's kernel
// family (the products inside attention's and Newton-Schulz's tiles, float64, LAPACK;
// OPENBLAS_CORETYPE can choose another). "AMD EPYC 9654, AVX-512 with AVX512_BF16, oneDNN
// avx512_core_bf16 and OpenBLAS Haswell kernels".
const std::string& describe_cpu();

}  // namespace core::cpu
