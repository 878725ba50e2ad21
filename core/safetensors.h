// Safetensors files: read (whole file, or the header then selected tensors) and write (atomic).
//
// Layout: u64 little-endian header length N, N bytes of UTF-8 JSON (padded with spaces to a
// multiple of 8), then the raw little-endian tensor bytes. The JSON maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the first data byte) and
// may hold "__metadata__", a map of strings. The header is parsed by a small strict JSON parser
// of our own (no JSON library in the dependencies); a file is refused unless the offsets tile
// the data exactly, each size equals numel * dtype size and the file size matches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace core {

// The safetensors dtypes this reader recognises. The float ones (F64, F32, F16, BF16) load into
// Tensors of that dtype; the others are available as raw bytes.
enum class StDType : uint8_t { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

// The Tensor dtype of a file dtype (none for the integer ones), and the other way.
std::optional<DType> tensor_dtype(StDType dtype);
StDType file_dtype(DType dtype);

const char* st_dtype_name(StDType dtype);  // "F32", ...
size_t st_dtype_size(StDType dtype);

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

// Opens a file and validates its header; tensors are read on demand.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);

  const std::string& path() const { return path_; }
  uint64_t data_start() const { return data_start_; }  // file offset of the first data byte
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The metadata value for `key`; throws naming the file and key when absent.
  const std::string& metadata_value(const std::string& key) const;
  // All tensors in data order.
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const StTensorInfo& info(const std::string& name) const;

  // A host tensor of the file's float dtype; throws naming the file and tensor otherwise.
  Tensor read(const std::string& name) const;
  // A host F32 tensor from an F32, BF16 or F16 one (exact conversions: a checkpoint stored in
  // half precision loads as the floats it stands for); throws naming the file, tensor and dtype
  // otherwise.
  Tensor read_f32(const std::string& name) const;
  // The raw little-endian bytes of any tensor.
  std::vector<std::byte> read_bytes(const std::string& name) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

// Every tensor of a file (the float ones as Tensors) and its metadata.
struct SafetensorsContents {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Tensor> tensors;
};
SafetensorsContents load_safetensors(const std::string& path);

// Collects tensors and metadata, then writes the file to a temporary name in the same folder
// and renames it over `path` (core::AtomicFile), so a reader never sees a partial file; a link,
// device or folder at `path` is refused, never replaced.
class SafetensorsWriter {
 public:
  void set_metadata(const std::string& key, const std::string& value);
  // A host tensor (written in its dtype); the writer keeps a reference to its storage until
  // write().
  void add(const std::string& name, const Tensor& tensor);
  // Raw little-endian bytes of any dtype; the size must be numel(shape) * dtype size.
  void add_bytes(const std::string& name, StDType dtype, const Shape& shape,
                 std::vector<std::byte> bytes);
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    StDType dtype;
    Shape shape;
    Tensor tensor;                 // when added from a Tensor
    std::vector<std::byte> bytes;  // when added as bytes
  };
  std::map<std::string, std::string> metadata_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> names_;
};

}  // namespace core
