#include "data/utf8.h"

#include <cstdint>

namespace data {

namespace {

// Length of the valid sequence at text[i], or the negated length of its maximal invalid subpart
// (at least 1 byte). The second byte's allowed range depends on the lead byte; that is what rules
// out overlong forms (E0, F0), surrogates (ED) and code points above U+10FFFF (F4).
int sequence_at(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  int k = 1;
  for (; k < len; ++k) {
    if (i + k >= text.size()) return -k;
    const uint8_t b = byte(i + k);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -k;
  }
  return len;
}

}  // namespace

size_t find_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    // Fast path over ASCII.
    while (i < text.size() && static_cast<uint8_t>(text[i]) < 0x80)
      ++i;
    if (i == text.size()) break;
    const int n = sequence_at(text, i);
    if (n < 0) return i;
    i += static_cast<size_t>(n);
  }
  return kUtf8Valid;
}

std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const int n = sequence_at(text, i);
    if (n > 0) {
      out.append(text.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

}  // namespace data
