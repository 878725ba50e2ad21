// Where a tensor lives and what its elements are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace core {

// Element types. F32 is what every op computes in; BF16 holds the GEMM inputs of
// train.precision=bf16 (docs/precision.md); F16 and F64 are read from files and converted.
enum class DType : uint8_t { F32, BF16, F16, F64 };

inline size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::BF16:
    case DType::F16:
      return 2;
    case DType::F64:
      return 8;
  }
  return 0;
}
const char* dtype_name(DType dtype);  // "f32", "bf16", "f16", "f64"

// One bf16 element: the upper half of an IEEE float (sign, 8-bit exponent, 7 mantissa bits).
// Its conversions are element math (core/kernel_math.h: bf16_from_float, float_from_bf16).
struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2);

// One FP8 element: 8 bits of an OCP FP8 number whose format (e4m3 or e5m2, kmath::Fp8) the
// caller keeps beside the pointer. Its conversions are element math (core/kernel_math.h:
// fp8_from_float, float_from_fp8).
struct fp8 {
  uint8_t bits;
};
static_assert(sizeof(fp8) == 1);

struct Device {
  enum class Kind : uint8_t { Cpu, Cuda };
  Kind kind = Kind::Cpu;
  int index = 0;

  static Device cpu() { return {Kind::Cpu, 0}; }
  static Device cuda(int index) { return {Kind::Cuda, index}; }
  bool is_cpu() const { return kind == Kind::Cpu; }
  bool is_cuda() const { return kind == Kind::Cuda; }
  bool operator==(const Device& other) const = default;
  std::string str() const;  // "cpu" or "cuda:N"
};

}  // namespace core
