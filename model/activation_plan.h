// The activation plan: every array a forward and backward of one (B, T) use, carved out of one
// device buffer, so a training step allocates nothing. The model lays it out twice: a first pass
// counts (every take returns null), the buffer is allocated, a second pass hands out the same
// offsets as pointers. Each layer takes its own arrays; scratch that only one layer uses at a
// time (the backward's intermediates) is shared by name, sized to the largest request.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/device.h"
#include "model/residual_stream.h"

namespace model {

class ActivationPlan {
 public:
  // bf16: the precision stores GEMM inputs and the residual stream in bf16 (docs/precision.md).
  explicit ActivationPlan(bool bf16) : bf16_(bf16) {}

  // Starts a pass: counting with base null, handing out pointers into base otherwise.
  void begin(float* base);
  // After the counting pass: the shared scratch regions placed after the arrays; returns the
  // floats the whole plan needs.
  int64_t finish_count();

  // An array of n floats (every array starts on a 64-byte boundary).
  float* f32(int64_t n);
  // n int32s, n float64s, n FP8 bytes, each in whole floats of the layout.
  int32_t* i32(int64_t n) { return reinterpret_cast<int32_t*>(f32(n)); }
  core::fp8* fp8(int64_t n) { return reinterpret_cast<core::fp8*>(f32((n + 3) / 4)); }
  // n bf16 values in bf16 precision (null otherwise), and n floats outside it (null in it): a GEMM
  // input is one of the two, never both.
  core::bf16* bf16(int64_t n) {
    return bf16_ ? reinterpret_cast<core::bf16*>(f32((n + 1) / 2)) : nullptr;
  }
  float* f32_unless_bf16(int64_t n) { return bf16_ ? nullptr : f32(n); }
  // The residual stream: f32, or in bf16 precision bf16 only.
  Stream stream(int64_t n) { return bf16_ ? Stream{nullptr, bf16(n)} : Stream{f32(n), nullptr}; }

  // Scratch shared by name: every request of the same name gets the same region, of the largest
  // size asked (the users must not need it at the same time).
  float* shared(const std::string& name, int64_t n);
  core::bf16* shared_bf16(const std::string& name, int64_t n) {
    return bf16_ ? reinterpret_cast<core::bf16*>(shared(name, (n + 1) / 2)) : nullptr;
  }
  float* shared_unless_bf16(const std::string& name, int64_t n) {
    return bf16_ ? nullptr : shared(name, n);
  }

  bool bf16_precision() const { return bf16_; }

 private:
  struct Region {
    int64_t floats = 0;
    int64_t offset = 0;
  };
  bool bf16_;
  float* base_ = nullptr;
  int64_t used_ = 0;
  std::map<std::string, Region> shared_;
};

}  // namespace model
