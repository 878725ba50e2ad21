#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>

#include "core/check.h"
#include "core/json.h"
#include "core/output_file.h"

namespace core {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the limit of the reference implementation

struct DTypeName {
  StDType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {StDType::F64, "F64", 8},   {StDType::F32, "F32", 4}, {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::I64, "I64", 8}, {StDType::I32, "I32", 4},
    {StDType::I16, "I16", 2},   {StDType::I8, "I8", 1},   {StDType::U8, "U8", 1},
    {StDType::BOOL, "BOOL", 1},
};

// A non-negative integer literal as uint64 (no sign, fraction or exponent), exact.
uint64_t json_uint(const JsonValue& v, const std::string& what) {
  ENGINE_CHECK(v.is_number(), what + " must be a number");
  const std::optional<uint64_t> x = v.get_uint64();
  ENGINE_CHECK(x || v.text().find_first_not_of("0123456789") != std::string::npos,
               what + " overflows 64 bits: " + v.text());
  ENGINE_CHECK(x, what + " must be a non-negative integer, got " + v.text());
  return *x;
}

StDType parse_dtype(const std::string& name, const std::string& what) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  ENGINE_FAIL(what + ": unknown dtype \"" + name + "\"");
}

}  // namespace

std::optional<DType> tensor_dtype(StDType dtype) {
  switch (dtype) {
    case StDType::F32:
      return DType::F32;
    case StDType::BF16:
      return DType::BF16;
    case StDType::F16:
      return DType::F16;
    case StDType::F64:
      return DType::F64;
    default:
      return std::nullopt;
  }
}

StDType file_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return StDType::F32;
    case DType::BF16:
      return StDType::BF16;
    case DType::F16:
      return StDType::F16;
    case DType::F64:
      return StDType::F64;
  }
  return StDType::F32;
}

const char* st_dtype_name(StDType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

size_t st_dtype_size(StDType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.size;
  return 0;
}

// ---- reader ---------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  // A FIFO would block the open until a writer came, a device file never ends: only a regular
  // file (a link is followed: download caches are built of links to their blobs).
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path_, ec);
  ENGINE_CHECK(ec || status.type() == std::filesystem::file_type::regular,
               path_ + ": not a regular file");
  std::ifstream in(path_, std::ios::binary);
  ENGINE_CHECK(in, path_ + ": cannot open (" + std::strerror(errno) + ")");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  ENGINE_CHECK(file_size >= 8, path_ + ": file of " + std::to_string(file_size) +
                                   " bytes is too short for a safetensors header length");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | len_bytes[i];
  ENGINE_CHECK(header_len <= kMaxHeaderBytes,
               path_ + ": header length " + std::to_string(header_len) + " exceeds the limit");
  ENGINE_CHECK(8 + header_len <= file_size,
               path_ + ": header length " + std::to_string(header_len) +
                   " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  ENGINE_CHECK(in, path_ + ": cannot read the header");
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - data_start_;

  JsonValue root;
  try {
    root = parse_json(header, path_);
  } catch (const JsonError& e) {
    ENGINE_FAIL(path_ + ": invalid JSON header: " + e.reason() + " at byte " +
                std::to_string(e.offset()));
  }
  ENGINE_CHECK(root.is_object(), path_ + ": header is not a JSON object");
  for (const auto& [name, value] : root.members()) {
    if (name == "__metadata__") {
      ENGINE_CHECK(value.is_object(), path_ + ": __metadata__ must be an object of strings");
      for (const auto& [key, v] : value.members()) {
        ENGINE_CHECK(v.is_string(),
                     path_ + ": __metadata__ value of \"" + key + "\" is not a string");
        metadata_[key] = v.text();
      }
      continue;
    }
    const std::string what = path_ + ": tensor \"" + name + "\"";
    ENGINE_CHECK(value.is_object(), what + " is not an object");
    const JsonValue* dtype = nullptr;
    const JsonValue* shape = nullptr;
    const JsonValue* offsets = nullptr;
    for (const auto& [key, v] : value.members()) {
      if (key == "dtype")
        dtype = &v;
      else if (key == "shape")
        shape = &v;
      else if (key == "data_offsets")
        offsets = &v;
      else
        ENGINE_FAIL(what + ": unknown key \"" + key + "\"");
    }
    ENGINE_CHECK(dtype && shape && offsets, what + ": needs dtype, shape and data_offsets");
    ENGINE_CHECK(dtype->is_string(), what + ": dtype must be a string");
    ENGINE_CHECK(shape->is_array(), what + ": shape must be an array");
    ENGINE_CHECK(offsets->is_array() && offsets->items().size() == 2,
                 what + ": data_offsets must be [begin, end]");
    StTensorInfo info;
    info.name = name;
    info.dtype = parse_dtype(dtype->text(), what);
    uint64_t numel = 1;
    for (const JsonValue& d : shape->items()) {
      uint64_t n = json_uint(d, what + ": shape entry");
      ENGINE_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                   what + ": shape entry too large");
      ENGINE_CHECK(n == 0 || numel <= std::numeric_limits<uint64_t>::max() / n,
                   what + ": shape overflows");
      numel *= n;
      info.shape.push_back(static_cast<int64_t>(n));
    }
    info.begin = json_uint(offsets->items()[0], what + ": data_offsets begin");
    info.end = json_uint(offsets->items()[1], what + ": data_offsets end");
    ENGINE_CHECK(info.begin <= info.end, what + ": data_offsets begin " +
                                             std::to_string(info.begin) + " > end " +
                                             std::to_string(info.end));
    // The byte count can wrap where numel does not: [2^62] F64 "needed" 0 bytes, and a tensor
    // of 2^62 elements was allocated for data_offsets [0, 0].
    ENGINE_CHECK(numel <= std::numeric_limits<uint64_t>::max() / st_dtype_size(info.dtype),
                 what + ": " + st_dtype_name(info.dtype) + shape_str(info.shape) +
                     " needs more bytes than 64 bits count");
    const uint64_t expect = numel * st_dtype_size(info.dtype);
    ENGINE_CHECK(info.end - info.begin == expect,
                 what + ": data_offsets span " + std::to_string(info.end - info.begin) +
                     " bytes but " + st_dtype_name(info.dtype) + shape_str(info.shape) + " needs " +
                     std::to_string(expect));
    tensors_.push_back(std::move(info));
  }
  // The byte ranges, in order, must cover [0, data_size) with no gap and no overlap.
  std::stable_sort(tensors_.begin(), tensors_.end(),
                   [](const StTensorInfo& a, const StTensorInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t cursor = 0;
  for (const StTensorInfo& t : tensors_) {
    ENGINE_CHECK(t.begin >= cursor, path_ + ": tensor \"" + t.name + "\" at bytes [" +
                                        std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                        ") overlaps the previous tensor (ending at " +
                                        std::to_string(cursor) + ")");
    ENGINE_CHECK(t.begin == cursor, path_ + ": gap in the data before tensor \"" + t.name +
                                        "\" (bytes " + std::to_string(cursor) + " to " +
                                        std::to_string(t.begin) + ")");
    cursor = t.end;
  }
  ENGINE_CHECK(cursor == data_size,
               path_ + ": tensors cover " + std::to_string(cursor) +
                   " data bytes but the file holds " + std::to_string(data_size) +
                   (cursor > data_size ? " (file truncated)" : " (trailing bytes)"));
  for (size_t i = 0; i < tensors_.size(); ++i)
    index_[tensors_[i].name] = i;
}

const std::string& SafetensorsReader::metadata_value(const std::string& key) const {
  auto it = metadata_.find(key);
  ENGINE_CHECK(it != metadata_.end(), path_ + ": no __metadata__ key \"" + key + "\"");
  return it->second;
}

const StTensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = index_.find(name);
  ENGINE_CHECK(it != index_.end(), path_ + ": no tensor \"" + name + "\"");
  return tensors_[it->second];
}

std::vector<std::byte> SafetensorsReader::read_bytes(const std::string& name) const {
  const StTensorInfo& t = info(name);
  std::vector<std::byte> bytes(t.end - t.begin);
  std::ifstream in(path_, std::ios::binary);
  ENGINE_CHECK(in, path_ + ": cannot open (" + std::strerror(errno) + ")");
  in.seekg(static_cast<std::streamoff>(data_start_ + t.begin));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ENGINE_CHECK(in, path_ + ": cannot read tensor \"" + name + "\"");
  return bytes;
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const StTensorInfo& t = info(name);
  const std::optional<DType> dtype = tensor_dtype(t.dtype);
  ENGINE_CHECK(dtype.has_value(), path_ + ": tensor \"" + name + "\" has dtype " +
                                      st_dtype_name(t.dtype) +
                                      "; only F32, BF16, F16 and F64 load as tensors");
  Tensor out = Tensor::empty(t.shape, *dtype);
  std::vector<std::byte> bytes = read_bytes(name);
  if (!bytes.empty()) std::memcpy(out.raw_data(), bytes.data(), bytes.size());
  return out;
}

Tensor SafetensorsReader::read_f32(const std::string& name) const {
  const StTensorInfo& t = info(name);
  ENGINE_CHECK(t.dtype == StDType::F32 || t.dtype == StDType::BF16 || t.dtype == StDType::F16,
               path_ + ": tensor \"" + name + "\" has dtype " + st_dtype_name(t.dtype) +
                   ", expected F32, BF16 or F16");
  return read(name).to(DType::F32);
}

SafetensorsContents load_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  SafetensorsContents contents;
  contents.metadata = reader.metadata();
  std::ifstream in(path, std::ios::binary);
  std::vector<char> all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ENGINE_CHECK(all.size() >= reader.data_start(), path + ": file changed while reading");
  const uint64_t data_start = reader.data_start();
  for (const StTensorInfo& t : reader.tensors()) {
    const std::optional<DType> dtype = tensor_dtype(t.dtype);
    if (!dtype) continue;
    Tensor out = Tensor::empty(t.shape, *dtype);
    if (t.end > t.begin)
      std::memcpy(out.raw_data(), all.data() + data_start + t.begin, t.end - t.begin);
    contents.tensors.emplace(t.name, std::move(out));
  }
  return contents;
}

// ---- writer ---------------------------------------------------------------------------------

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::add(const std::string& name, const Tensor& tensor) {
  ENGINE_CHECK(tensor.defined() && tensor.device().is_cpu(),
               "safetensors: tensor \"" + name + "\" must be a defined host tensor");
  ENGINE_CHECK(name != "__metadata__" && !name.empty(),
               "safetensors: invalid tensor name \"" + name + "\"");
  ENGINE_CHECK(names_.emplace(name, entries_.size()).second,
               "safetensors: tensor \"" + name + "\" added twice");
  Entry e;
  e.name = name;
  e.dtype = file_dtype(tensor.dtype());
  e.shape = tensor.shape();
  e.tensor = tensor.is_contiguous() ? tensor : tensor.clone();
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::add_bytes(const std::string& name, StDType dtype, const Shape& shape,
                                  std::vector<std::byte> bytes) {
  ENGINE_CHECK(name != "__metadata__" && !name.empty(),
               "safetensors: invalid tensor name \"" + name + "\"");
  ENGINE_CHECK(static_cast<uint64_t>(shape_numel(shape)) * st_dtype_size(dtype) == bytes.size(),
               "safetensors: tensor \"" + name + "\": " + std::to_string(bytes.size()) +
                   " bytes for " + st_dtype_name(dtype) + shape_str(shape));
  ENGINE_CHECK(names_.emplace(name, entries_.size()).second,
               "safetensors: tensor \"" + name + "\" added twice");
  entries_.push_back(Entry{name, dtype, shape, Tensor(), std::move(bytes)});
}

void SafetensorsWriter::write(const std::string& path) const {
  std::string header = "{";
  bool first = true;
  if (!metadata_.empty()) {
    header += "\"__metadata__\":{";
    for (auto& [k, v] : metadata_) {
      if (!first) header += ",";
      first = false;
      header += json_escape(k) + ":" + json_escape(v);
    }
    header += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(e.shape)) * st_dtype_size(e.dtype);
    header += first ? "" : ",";
    first = false;
    header += json_escape(e.name) + ":{\"dtype\":\"" + st_dtype_name(e.dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) header += ',';
      header += std::to_string(e.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  // Never through a link, never over a device or a folder (core/output_file.h).
  AtomicFile file(path, "the safetensors file");
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  file.write(len, 8);
  file.write(header.data(), header.size());
  for (const Entry& e : entries_) {
    if (e.tensor.defined())
      file.write(e.tensor.raw_data(), e.tensor.nbytes());
    else
      file.write(e.bytes.data(), e.bytes.size());
  }
  file.commit();
}

}  // namespace core
