// Strict UTF-8 checking and repair (RFC 3629: no overlong forms, no surrogates, <= U+10FFFF).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace data {

inline constexpr size_t kUtf8Valid = static_cast<size_t>(-1);

// Byte offset of the first byte that does not start a valid UTF-8 sequence, or kUtf8Valid.
size_t find_invalid_utf8(std::string_view text);

// Replaces every maximal invalid subpart with U+FFFD, as the WHATWG TextDecoder (and Python's
// errors="replace") do, so decoding results agree with the JavaScript reference tokenizer.
std::string replace_invalid_utf8(std::string_view text);

}  // namespace data
