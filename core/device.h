// Where a tensor lives and what its elements are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace core {

enum class DType : uint8_t { F32, BF16 };

inline size_t dtype_size(DType dtype) {
  return dtype == DType::F32 ? 4 : 2;
}
const char* dtype_name(DType dtype);

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
