// A small strict JSON parser (RFC 8259) for the files the engine reads: safetensors headers, the
// GPT-2 vocabulary (encoder.json), one-line reports of helper scripts.
//
// Strict: one value, optional whitespace around it and nothing else; strings must be valid UTF-8
// without raw control characters, with every escape of the RFC (\u surrogate pairs become one
// code point, an unpaired surrogate is an error); duplicate object keys, leading zeros, "+1",
// ".5", NaN and trailing commas are refused; nesting is limited to 64 levels.
//
// Numbers keep their literal text, so integers of any size stay exact (safetensors offsets are
// u64); get_uint64 / get_int64 / get_double convert on request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/check.h"

namespace core {

class JsonValue {
 public:
  enum class Kind : uint8_t { Null, Bool, Number, String, Array, Object };
  using Member = std::pair<std::string, JsonValue>;

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_number() const { return kind_ == Kind::Number; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }

  // A string's decoded value (UTF-8) or a number's literal text; empty for the other kinds.
  const std::string& text() const { return text_; }
  bool boolean() const { return boolean_; }
  // An array's elements; empty for the other kinds.
  const std::vector<JsonValue>& items() const { return items_; }
  // An object's members in file order (keys are unique); empty for the other kinds.
  const std::vector<Member>& members() const { return members_; }
  // The value of `key` in an object (a linear search), or null if absent or not an object.
  const JsonValue* find(std::string_view key) const;

  // A number without fraction or exponent that fits the type, else nullopt.
  std::optional<uint64_t> get_uint64() const;
  std::optional<int64_t> get_int64() const;
  // Any number, rounded to the nearest double (nullopt if not a number or beyond the range).
  std::optional<double> get_double() const;

  // The same, throwing core::Error "<what> must be <expected>, got <value>" on a mismatch.
  uint64_t as_uint64(const std::string& what) const;
  int64_t as_int64(const std::string& what) const;
  double as_double(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
  bool as_bool(const std::string& what) const;

  // A short description for error messages: the number, the quoted string (cut at 40 bytes),
  // or "an array", "an object", "null", "true", "false".
  std::string describe() const;

 private:
  friend class JsonParser;
  Kind kind_ = Kind::Null;
  bool boolean_ = false;
  std::string text_;
  std::vector<JsonValue> items_;
  std::vector<Member> members_;
};

// A syntax error: what() reads "<what>: invalid JSON: <reason> at byte <offset> (line <line>)";
// the parts are kept for callers that word the message their own way.
class JsonError : public Error {
 public:
  JsonError(const std::string& what, std::string reason, size_t offset, size_t line);
  const std::string& reason() const { return reason_; }
  size_t offset() const { return offset_; }  // 0-based byte offset into the text
  size_t line() const { return line_; }      // 1-based

 private:
  std::string reason_;
  size_t offset_;
  size_t line_;
};

// Parses one JSON document; `what` names it (usually the file) in errors, which are JsonError.
JsonValue parse_json(std::string_view text, const std::string& what);

// `s` as a JSON string literal, quotes included: escapes '"', '\\' and control characters;
// other bytes (UTF-8 included) are copied.
std::string json_escape(std::string_view s);

}  // namespace core
