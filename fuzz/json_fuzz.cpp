// core/json: any bytes parse or are refused with core::Error (naming the reason and the byte
// offset); nothing else may escape, crash or trip a sanitizer.
#include <string>

#include "core/check.h"
#include "core/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const core::JsonValue value = core::parse_json(text, "fuzz.json");
    (void)value.describe();
  } catch (const core::Error&) {
  }
  return 0;
}
