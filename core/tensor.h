// Tensor: a shaped, strided view of storage owned by a device allocator.
//
// Row-major and contiguous in practice; views (reshape, slice along a dimension, index along
// dim 0) share storage and never copy. Elementwise data access is for host tensors only; device
// tensors go through a Backend.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"

namespace core {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[3, 4]"
int64_t shape_numel(const Shape& shape);

// Owns one allocation; freed through the allocator that made it.
class Storage {
 public:
  Storage(Allocator& allocator, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Allocator& allocator() const { return *allocator_; }

 private:
  Allocator* allocator_;
  void* data_;
  size_t bytes_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: no storage, numel 0

  static Tensor empty(const Shape& shape, DType dtype = DType::F32,
                      Allocator& allocator = cpu_allocator());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32,
                      Allocator& allocator = cpu_allocator());
  // Host f32 tensor holding a copy of `values` (size must match the shape).
  static Tensor from_vector(const Shape& shape, std::span<const float> values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t stride(int d) const;
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  Device device() const;
  bool is_contiguous() const;
  int64_t offset() const { return offset_; }  // in elements, into the storage
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw_data() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }
  // Host f32 element access for tests and small bookkeeping (checks bounds and device).
  float& at(std::initializer_list<int64_t> index) const;

  // Views, sharing storage.
  Tensor view(const Shape& shape) const;  // contiguous only; one -1 is inferred
  Tensor slice(int d, int64_t start, int64_t length) const;
  Tensor select(int64_t i) const;  // index along dim 0, drops that dim

  // Copies.
  Tensor clone() const;               // same device and allocator, contiguous
  void copy_from(const Tensor& src);  // same shape and dtype; host tensors (device: Backend)
  // Host copy with the elements converted: any float dtype to F32 (exact from BF16 and F16, the
  // nearest float from F64), F32 to BF16 (nearest, ties to even); the same dtype is a copy.
  Tensor to(DType dtype) const;
  std::vector<float> to_vector() const;  // host f32 (converted as to(F32)), in row-major order
  void fill(float value) const;          // host f32

  std::string str() const;  // "f32[3, 4] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::F32;
};

Shape contiguous_strides(const Shape& shape);

}  // namespace core
