#include "core/json.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <functional>
#include <limits>
#include <system_error>

namespace core {

namespace {

constexpr int kMaxDepth = 64;
// Objects up to this size check for a duplicate key by a linear search, larger ones by a hash
// table (encoder.json is one object of 50257 keys).
constexpr size_t kLinearKeys = 16;

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    const char b[2] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    out.append(b, 2);
  } else if (cp < 0x10000) {
    const char b[3] = {static_cast<char>(0xE0 | (cp >> 12)),
                       static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                       static_cast<char>(0x80 | (cp & 0x3F))};
    out.append(b, 3);
  } else {
    const char b[4] = {
        static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
        static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    out.append(b, 4);
  }
}

// The length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates,
// nothing above U+10FFFF) starting at p with a byte >= 0x80, or 0 if there is none.
size_t utf8_sequence(const unsigned char* p, const unsigned char* end) {
  const unsigned char b0 = p[0];
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (static_cast<size_t>(end - p) < n || p[1] < lo || p[1] > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if ((p[k] & 0xC0) != 0x80) return 0;
  return n;
}

}  // namespace

JsonError::JsonError(const std::string& what, std::string reason, size_t offset, size_t line)
    : Error(what + ": invalid JSON: " + reason + " at byte " + std::to_string(offset) + " (line " +
            std::to_string(line) + ")"),
      reason_(std::move(reason)),
      offset_(offset),
      line_(line) {}

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& what)
      : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()), what_(what) {}

  JsonValue parse_document() {
    JsonValue v;
    parse_value(v, 0);
    skip_ws();
    if (p_ != end_) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  struct KeyHash {
    uint64_t hash;
    size_t index;
  };

  // A 64-bit hash of the key, eight bytes at a time (keys are short: most take one round).
  static uint64_t hash_key(const std::string& key) {
    uint64_t h = 0x9E3779B97F4A7C15u ^ key.size();
    for (size_t i = 0; i < key.size(); i += 8) {
      uint64_t w = 0;
      for (size_t k = 0; k < 8 && i + k < key.size(); ++k)
        w |= static_cast<uint64_t>(static_cast<unsigned char>(key[i + k])) << (8 * k);
      h = (h ^ w) * 0xbf58476d1ce4e5b9u;
      h ^= h >> 31;
    }
    h *= 0x94d049bb133111ebu;
    return h ^ (h >> 29);
  }

  [[noreturn]] void fail(const std::string& reason) const { fail_at(p_, reason); }
  [[noreturn]] void fail_at(const char* at, const std::string& reason) const {
    size_t line = 1;
    for (const char* c = begin_; c < at; ++c)
      line += *c == '\n';
    throw JsonError(what_, reason, static_cast<size_t>(at - begin_), line);
  }

  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t'))
      ++p_;
  }
  // The next character after whitespace, which must exist.
  char peek() {
    skip_ws();
    if (p_ == end_) fail("unexpected end");
    return *p_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++p_;
  }

  void parse_value(JsonValue& v, int depth) {
    if (depth >= kMaxDepth) fail("nesting too deep");
    const char c = peek();
    if (c == '{') {
      parse_object(v, depth);
    } else if (c == '[') {
      v.kind_ = JsonValue::Kind::Array;
      ++p_;
      if (peek() == ']') {
        ++p_;
        return;
      }
      while (true) {
        parse_value(v.items_.emplace_back(), depth + 1);
        if (peek() == ',') {
          ++p_;
          continue;
        }
        expect(']');
        return;
      }
    } else if (c == '"') {
      v.kind_ = JsonValue::Kind::String;
      parse_string(v.text_);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind_ = JsonValue::Kind::Number;
      parse_number(v.text_);
    } else if (literal("true")) {
      v.kind_ = JsonValue::Kind::Bool;
      v.boolean_ = true;
    } else if (literal("false")) {
      v.kind_ = JsonValue::Kind::Bool;
    } else if (literal("null")) {
      v.kind_ = JsonValue::Kind::Null;
    } else {
      fail("unexpected character");
    }
  }

  bool literal(std::string_view word) {
    if (static_cast<size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word)
      return false;
    p_ += word.size();
    return true;
  }

  void parse_object(JsonValue& v, int depth) {
    v.kind_ = JsonValue::Kind::Object;
    auto& members = v.members_;
    ++p_;
    if (peek() == '}') {
      ++p_;
      return;
    }
    // Past kLinearKeys members: each key's hash (taken while the key is in cache) and where the
    // keys after the first kLinearKeys start; check_unique_keys uses them when the object ends.
    std::vector<KeyHash> hashes;
    std::vector<const char*> key_at;
    while (true) {
      if (peek() != '"') fail("expected a string key");
      const char* at = p_;
      std::string& key = members.emplace_back().first;
      parse_string(key);
      const size_t index = members.size() - 1;
      if (index < kLinearKeys) {
        for (size_t i = 0; i < index; ++i)
          if (members[i].first == key) fail_at(at, "duplicate key \"" + key + "\"");
      } else {
        if (index == kLinearKeys) {
          for (size_t i = 0; i < index; ++i)
            hashes.push_back({hash_key(members[i].first), i});
        }
        hashes.push_back({hash_key(key), index});
        key_at.push_back(at);
      }
      expect(':');
      // The reference stays valid: only nested values' vectors grow while this value parses.
      parse_value(members.back().second, depth + 1);
      if (peek() == ',') {
        ++p_;
        continue;
      }
      expect('}');
      if (members.size() > kLinearKeys) check_unique_keys(members, hashes, key_at);
      return;
    }
  }

  // Refuses a duplicate key in a large object, naming the first repetition in file order (one
  // past kLinearKeys: earlier ones were found as they came, key_at[i] is key kLinearKeys + i). The
  // keys are sorted into buckets by hash (a counting sort: sequential passes, not a hash
  // table's random probes), so equal keys meet in one bucket of typically one or two entries.
  void check_unique_keys(const std::vector<JsonValue::Member>& members,
                         const std::vector<KeyHash>& hashes,
                         const std::vector<const char*>& key_at) const {
    const size_t n = members.size();
    int bits = 1;
    while ((size_t{1} << bits) < n)
      ++bits;
    std::vector<uint32_t> start((size_t{1} << bits) + 1, 0);
    for (const KeyHash& e : hashes)
      ++start[(e.hash >> (64 - bits)) + 1];
    for (size_t b = 1; b < start.size(); ++b)
      start[b] += start[b - 1];
    std::vector<KeyHash> sorted(n);
    std::vector<uint32_t> fill(start.begin(), start.end() - 1);
    for (const KeyHash& e : hashes)
      sorted[fill[e.hash >> (64 - bits)]++] = e;
    size_t first_repeat = n;
    for (size_t b = 0; b + 1 < start.size(); ++b) {
      if (start[b + 1] - start[b] < 2) continue;
      for (size_t i = start[b]; i < start[b + 1]; ++i) {
        for (size_t j = i + 1; j < start[b + 1]; ++j) {  // indices ascend within a bucket
          if (sorted[i].hash == sorted[j].hash &&
              members[sorted[i].index].first == members[sorted[j].index].first)
            first_repeat = std::min(first_repeat, sorted[j].index);
        }
      }
    }
    if (first_repeat < n) {
      fail_at(key_at[first_repeat - kLinearKeys],
              "duplicate key \"" + members[first_repeat].first + "\"");
    }
  }

  // Skips the digits at p_ (at least one).
  void digits() {
    const char* start = p_;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9')
      ++p_;
    if (p_ == start) fail("malformed number");
  }

  void parse_number(std::string& out) {
    const char* start = p_;
    if (*p_ == '-') ++p_;
    if (p_ < end_ && *p_ == '0') {
      ++p_;
      if (p_ < end_ && *p_ >= '0' && *p_ <= '9') fail("leading zero in a number");
    } else {
      digits();
    }
    if (p_ < end_ && *p_ == '.') {
      ++p_;
      digits();
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      digits();
    }
    out.assign(start, p_);
  }

  uint32_t hex4() {
    if (end_ - p_ < 4) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i, ++p_) {
      const char h = *p_;
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        fail("bad hex digit in \\u escape");
      }
    }
    return v;
  }

  // The string at p_ (on its opening quote), decoded into out.
  void parse_string(std::string& out) {
    ++p_;
    while (true) {
      // Copy the run of plain ASCII in one go.
      const char* run = p_;
      while (p_ < end_) {
        const auto c = static_cast<unsigned char>(*p_);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++p_;
      }
      out.append(run, static_cast<size_t>(p_ - run));
      if (p_ == end_) fail("unterminated string");
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return;
      }
      if (c < 0x20) fail("control character in string");
      if (c >= 0x80) {
        const size_t n = utf8_sequence(reinterpret_cast<const unsigned char*>(p_),
                                       reinterpret_cast<const unsigned char*>(end_));
        if (n == 0) fail("invalid UTF-8 in string");
        out.append(p_, n);
        p_ += n;
        continue;
      }
      const char* escape = p_++;  // the backslash
      if (p_ == end_) fail("unterminated escape");
      switch (*p_++) {
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
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u')
              fail_at(escape, "unpaired surrogate");
            p_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail_at(escape, "unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail_at(escape, "unpaired surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail_at(escape, std::string("unknown escape \\") + p_[-1]);
      }
    }
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  const std::string& what_;
};

JsonValue parse_json(std::string_view text, const std::string& what) {
  return JsonParser(text, what).parse_document();
}

// ---- JsonValue --------------------------------------------------------------------------------

const JsonValue* JsonValue::find(std::string_view key) const {
  for (const Member& m : members_)
    if (m.first == key) return &m.second;
  return nullptr;
}

std::optional<uint64_t> JsonValue::get_uint64() const {
  // Digits only (no '-', '.' or exponent), within 64 bits; the parser has checked the syntax.
  if (kind_ != Kind::Number || text_.empty()) return std::nullopt;
  uint64_t x = 0;
  for (const char c : text_) {
    if (c < '0' || c > '9' || __builtin_mul_overflow(x, 10u, &x) ||
        __builtin_add_overflow(x, static_cast<uint64_t>(c - '0'), &x))
      return std::nullopt;
  }
  return x;
}

std::optional<int64_t> JsonValue::get_int64() const {
  if (kind_ != Kind::Number) return std::nullopt;
  int64_t x = 0;
  const char* end = text_.data() + text_.size();
  const auto [ptr, ec] = std::from_chars(text_.data(), end, x);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return x;
}

std::optional<double> JsonValue::get_double() const {
  if (kind_ != Kind::Number) return std::nullopt;
  double x = 0;
  const char* end = text_.data() + text_.size();
  const auto [ptr, ec] = std::from_chars(text_.data(), end, x);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return x;
}

std::string JsonValue::describe() const {
  switch (kind_) {
    case Kind::Null:
      return "null";
    case Kind::Bool:
      return boolean_ ? "true" : "false";
    case Kind::Number:
      return text_;
    case Kind::String:
      return text_.size() <= 40 ? json_escape(text_) : json_escape(text_.substr(0, 40)) + "...";
    case Kind::Array:
      return "an array";
    case Kind::Object:
      return "an object";
  }
  return "?";
}

uint64_t JsonValue::as_uint64(const std::string& what) const {
  const auto x = get_uint64();
  ENGINE_CHECK(x.has_value(),
               what + " must be a non-negative integer below 2^64, got " + describe());
  return *x;
}

int64_t JsonValue::as_int64(const std::string& what) const {
  const auto x = get_int64();
  ENGINE_CHECK(x.has_value(), what + " must be a 64-bit integer, got " + describe());
  return *x;
}

double JsonValue::as_double(const std::string& what) const {
  const auto x = get_double();
  ENGINE_CHECK(x.has_value(), what + " must be a finite number, got " + describe());
  return *x;
}

const std::string& JsonValue::as_string(const std::string& what) const {
  ENGINE_CHECK(kind_ == Kind::String, what + " must be a string, got " + describe());
  return text_;
}

bool JsonValue::as_bool(const std::string& what) const {
  ENGINE_CHECK(kind_ == Kind::Bool, what + " must be true or false, got " + describe());
  return boolean_;
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (const char c : s) {
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
  out += '"';
  return out;
}

}  // namespace core
