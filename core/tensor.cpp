#include "core/tensor.h"

#include <cstring>
#include <stdexcept>

#include "core/check.h"
#include "core/kernel_math.h"

namespace core {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::F64:
      return "f64";
  }
  return "?";
}

namespace {

// The float an IEEE half stands for (exact: every half is a float). Half: sign, 5 exponent bits
// (bias 15), 10 mantissa bits; float: bias 127, 23 mantissa bits.
float float_from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F)  // infinity or NaN (payload kept)
    return kmath::float_from_bits(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return kmath::float_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Storage::Storage(Allocator& allocator, size_t bytes)
    : allocator_(&allocator), data_(allocator.allocate(bytes)), bytes_(bytes) {}

Storage::~Storage() {
  allocator_->deallocate(data_, bytes_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& allocator) {
  for (int64_t d : shape)
    ENGINE_CHECK(d >= 0, "negative dimension in shape " + shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(allocator, shape_numel(shape) * dtype_size(dtype));
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Allocator& allocator) {
  Tensor t = empty(shape, dtype, allocator);
  ENGINE_CHECK(allocator.device().is_cpu(), "Tensor::zeros on a device needs a Backend");
  if (t.nbytes() > 0) std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, std::span<const float> values) {
  ENGINE_CHECK(
      static_cast<int64_t>(values.size()) == shape_numel(shape),
      "from_vector: " + std::to_string(values.size()) + " values for shape " + shape_str(shape));
  Tensor t = empty(shape);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

int64_t Tensor::size(int d) const {
  if (d < 0) d += dim();
  ENGINE_CHECK(d >= 0 && d < dim(), "dimension out of range for " + str());
  return shape_[d];
}

int64_t Tensor::stride(int d) const {
  if (d < 0) d += dim();
  ENGINE_CHECK(d >= 0 && d < dim(), "dimension out of range for " + str());
  return strides_[d];
}

Device Tensor::device() const {
  return storage_ ? storage_->allocator().device() : Device::cpu();
}

bool Tensor::is_contiguous() const {
  return strides_ == contiguous_strides(shape_) || numel() <= 1;
}

void* Tensor::raw_data() const {
  if (!storage_ || storage_->data() == nullptr) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * element_size();
}

float& Tensor::at(std::initializer_list<int64_t> index) const {
  ENGINE_CHECK(device().is_cpu() && dtype_ == DType::F32, "at() needs a host f32 tensor");
  ENGINE_CHECK(static_cast<int>(index.size()) == dim(), "at(): wrong number of indices");
  int64_t off = 0;
  int d = 0;
  for (int64_t i : index) {
    ENGINE_CHECK(i >= 0 && i < shape_[d], "at(): index out of range for " + str());
    off += i * strides_[d++];
  }
  return data<float>()[off];
}

Tensor Tensor::view(const Shape& shape) const {
  ENGINE_CHECK(is_contiguous(), "view() of a non-contiguous tensor " + str());
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      ENGINE_CHECK(infer < 0, "view(): more than one -1");
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known == 0 ? 0 : numel() / known;
  ENGINE_CHECK(shape_numel(s) == numel(),
               "view(): cannot view " + str() + " as " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int d, int64_t start, int64_t length) const {
  if (d < 0) d += dim();
  ENGINE_CHECK(d >= 0 && d < dim(), "slice(): dimension out of range for " + str());
  ENGINE_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
               "slice(): [" + std::to_string(start) + ", " + std::to_string(start + length) +
                   ") out of range for dim " + std::to_string(d) + " of " + str());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = length;
  return t;
}

Tensor Tensor::select(int64_t i) const {
  ENGINE_CHECK(dim() >= 1, "select() of a scalar");
  Tensor t = slice(0, i, 1);
  t.shape_.erase(t.shape_.begin());
  t.strides_.erase(t.strides_.begin());
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, storage_ ? storage_->allocator() : cpu_allocator());
  t.copy_from(*this);
  return t;
}

// Copies row-major element order; recursion over dims keeps non-contiguous views correct.
static void copy_strided(char* dst, const Shape& dst_strides, const char* src,
                         const Shape& src_strides, const Shape& shape, int d, size_t elem) {
  if (d == static_cast<int>(shape.size())) {
    std::memcpy(dst, src, elem);
    return;
  }
  for (int64_t i = 0; i < shape[d]; ++i) {
    copy_strided(dst + i * dst_strides[d] * elem, dst_strides, src + i * src_strides[d] * elem,
                 src_strides, shape, d + 1, elem);
  }
}

void Tensor::copy_from(const Tensor& src) {
  ENGINE_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_,
               "copy_from(): " + src.str() + " into " + str());
  if (numel() == 0) return;
  if (!device().is_cpu() && device() == src.device() && is_contiguous() && src.is_contiguous()) {
    storage_->allocator().copy_within(raw_data(), src.raw_data(), nbytes());
    return;
  }
  ENGINE_CHECK(device().is_cpu() && src.device().is_cpu(),
               "copy_from(): " + src.str() + " into " + str() +
                   ": copies between devices, or of strided device tensors, go through a Backend");
  if (is_contiguous() && src.is_contiguous()) {
    std::memcpy(raw_data(), src.raw_data(), nbytes());
  } else {
    copy_strided(static_cast<char*>(raw_data()), strides_, static_cast<const char*>(src.raw_data()),
                 src.strides_, shape_, 0, element_size());
  }
}

Tensor Tensor::to(DType dtype) const {
  Tensor src = Tensor::empty(shape_, dtype_);  // host, contiguous
  src.copy_from(*this);
  if (dtype == dtype_) return src;
  Tensor out = Tensor::empty(shape_, dtype);
  const int64_t n = numel();
  if (dtype == DType::F32) {
    float* o = out.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      switch (dtype_) {
        case DType::BF16:
          o[i] = kmath::float_from_bf16(src.data<bf16>()[i]);
          break;
        case DType::F16:
          o[i] = float_from_f16(src.data<uint16_t>()[i]);
          break;
        case DType::F64:
          o[i] = static_cast<float>(src.data<double>()[i]);
          break;
        case DType::F32:
          break;
      }
    }
    return out;
  }
  ENGINE_CHECK(dtype == DType::BF16 && dtype_ == DType::F32,
               std::string("to(): no conversion from ") + dtype_name(dtype_) + " to " +
                   dtype_name(dtype) + " (" + str() + ")");
  for (int64_t i = 0; i < n; ++i)
    out.data<bf16>()[i] = kmath::bf16_from_float(src.data<float>()[i]);
  return out;
}

std::vector<float> Tensor::to_vector() const {
  const Tensor host = to(DType::F32);
  const float* p = host.data<float>();
  return std::vector<float>(p, p + numel());
}

void Tensor::fill(float value) const {
  ENGINE_CHECK(device().is_cpu() && dtype_ == DType::F32 && is_contiguous(),
               "fill() needs a contiguous host f32 tensor");
  float* p = data<float>();
  for (int64_t i = 0; i < numel(); ++i)
    p[i] = value;
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " " + device().str();
}

}  // namespace core
