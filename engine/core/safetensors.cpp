#include "engine/core/safetensors.h"

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
#include <set>

#include "engine/core/check.h"

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

// ---- a small strict JSON parser (RFC 8259), enough for safetensors headers ------------------

struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  bool boolean = false;
  std::string text;  // the string value, or a number's literal text
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;  // in file order
};

class JsonParser {
 public:
  JsonParser(const std::string& input, std::string where) : s_(input), where_(std::move(where)) {}

  Json parse_document() {
    Json v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    ENGINE_FAIL(where_ + ": invalid JSON header: " + what + " at byte " + std::to_string(pos_));
  }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  Json parse_value(int depth) {
    if (depth > 64) fail("nesting too deep");
    char c = peek();
    Json v;
    if (c == '{') {
      v.kind = Json::Kind::Object;
      ++pos_;
      std::set<std::string> seen;
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      while (true) {
        if (peek() != '"') fail("expected a string key");
        std::string key = parse_string();
        if (!seen.insert(key).second) fail("duplicate key \"" + key + "\"");
        expect(':');
        v.members.emplace_back(std::move(key), parse_value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::Kind::Array;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      while (true) {
        v.items.push_back(parse_value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::Kind::String;
      v.text = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Json::Kind::Number;
      v.text = parse_number();
      return v;
    }
    for (const char* word : {"true", "false", "null"}) {
      size_t n = std::strlen(word);
      if (s_.compare(pos_, n, word) == 0) {
        pos_ += n;
        v.kind = word[0] == 'n' ? Json::Kind::Null : Json::Kind::Bool;
        v.boolean = word[0] == 't';
        return v;
      }
    }
    fail("unexpected character");
  }

  std::string parse_number() {
    size_t start = pos_;
    auto digits = [&] {
      size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9')
        ++pos_;
      if (pos_ == d) fail("malformed number");
    };
    if (s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
    } else {
      digits();
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      digits();
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      digits();
    }
    return s_.substr(start, pos_ - start);
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= h - '0';
      else if (h >= 'a' && h <= 'f')
        v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F')
        v |= h - 'A' + 10;
      else
        fail("bad hex digit in \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.compare(pos_, 2, "\\u") != 0) fail("unpaired surrogate");
            pos_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  const std::string& s_;
  std::string where_;
  size_t pos_ = 0;
};

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// A non-negative integer literal as uint64 (no sign, fraction or exponent).
uint64_t json_uint(const Json& v, const std::string& what) {
  ENGINE_CHECK(v.kind == Json::Kind::Number, what + " must be a number");
  const std::string& t = v.text;
  ENGINE_CHECK(!t.empty() && t.find_first_not_of("0123456789") == std::string::npos,
               what + " must be a non-negative integer, got " + t);
  uint64_t x = 0;
  for (char c : t) {
    ENGINE_CHECK(x <= (std::numeric_limits<uint64_t>::max() - (c - '0')) / 10,
                 what + " overflows 64 bits: " + t);
    x = x * 10 + static_cast<uint64_t>(c - '0');
  }
  return x;
}

StDType parse_dtype(const std::string& name, const std::string& what) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  ENGINE_FAIL(what + ": unknown dtype \"" + name + "\"");
}

}  // namespace

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

  Json root = JsonParser(header, path_).parse_document();
  ENGINE_CHECK(root.kind == Json::Kind::Object, path_ + ": header is not a JSON object");
  for (auto& [name, value] : root.members) {
    if (name == "__metadata__") {
      ENGINE_CHECK(value.kind == Json::Kind::Object,
                   path_ + ": __metadata__ must be an object of strings");
      for (auto& [key, v] : value.members) {
        ENGINE_CHECK(v.kind == Json::Kind::String,
                     path_ + ": __metadata__ value of \"" + key + "\" is not a string");
        metadata_[key] = v.text;
      }
      continue;
    }
    const std::string what = path_ + ": tensor \"" + name + "\"";
    ENGINE_CHECK(value.kind == Json::Kind::Object, what + " is not an object");
    const Json* dtype = nullptr;
    const Json* shape = nullptr;
    const Json* offsets = nullptr;
    for (auto& [key, v] : value.members) {
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
    ENGINE_CHECK(dtype->kind == Json::Kind::String, what + ": dtype must be a string");
    ENGINE_CHECK(shape->kind == Json::Kind::Array, what + ": shape must be an array");
    ENGINE_CHECK(offsets->kind == Json::Kind::Array && offsets->items.size() == 2,
                 what + ": data_offsets must be [begin, end]");
    StTensorInfo info;
    info.name = name;
    info.dtype = parse_dtype(dtype->text, what);
    uint64_t numel = 1;
    for (const Json& d : shape->items) {
      uint64_t n = json_uint(d, what + ": shape entry");
      ENGINE_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                   what + ": shape entry too large");
      ENGINE_CHECK(n == 0 || numel <= std::numeric_limits<uint64_t>::max() / n,
                   what + ": shape overflows");
      numel *= n;
      info.shape.push_back(static_cast<int64_t>(n));
    }
    info.begin = json_uint(offsets->items[0], what + ": data_offsets begin");
    info.end = json_uint(offsets->items[1], what + ": data_offsets end");
    ENGINE_CHECK(info.begin <= info.end, what + ": data_offsets begin " +
                                             std::to_string(info.begin) + " > end " +
                                             std::to_string(info.end));
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
  ENGINE_CHECK(t.dtype == StDType::F32 || t.dtype == StDType::BF16,
               path_ + ": tensor \"" + name + "\" has dtype " + st_dtype_name(t.dtype) +
                   "; only F32 and BF16 load as tensors");
  Tensor out = Tensor::empty(t.shape, t.dtype == StDType::F32 ? DType::F32 : DType::BF16);
  std::vector<std::byte> bytes = read_bytes(name);
  if (!bytes.empty()) std::memcpy(out.raw_data(), bytes.data(), bytes.size());
  return out;
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
    if (t.dtype != StDType::F32 && t.dtype != StDType::BF16) continue;
    Tensor out = Tensor::empty(t.shape, t.dtype == StDType::F32 ? DType::F32 : DType::BF16);
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
  e.dtype = tensor.dtype() == DType::F32 ? StDType::F32 : StDType::BF16;
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

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ENGINE_CHECK(fd >= 0, tmp + ": cannot create (" + std::strerror(errno) + ")");
  auto write_all = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const std::string reason = std::strerror(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        ENGINE_FAIL(tmp + ": write failed (" + reason + ")");
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  write_all(len, 8);
  write_all(header.data(), header.size());
  for (const Entry& e : entries_) {
    if (e.tensor.defined())
      write_all(e.tensor.raw_data(), e.tensor.nbytes());
    else
      write_all(e.bytes.data(), e.bytes.size());
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    ENGINE_FAIL(path + ": cannot finish writing (" + reason + ")");
  }
}

}  // namespace core
