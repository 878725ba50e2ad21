// The YAML config parser: any text either parses into a config that round-trips through its
// effective YAML, or is refused with a core::Error (a named config error). Any other exception,
// crash or sanitizer report is a bug.
#include <string>

#include "core/check.h"
#include "engine/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  engine::Config config;
  try {
    config = engine::parse_config(text, "fuzz.yaml");
  } catch (const core::Error&) {
    return 0;
  }
  const std::string yaml = engine::config_to_yaml(config);
  const engine::Config back = engine::parse_config(yaml, "effective.yaml");
  if (engine::config_to_yaml(back) != yaml) __builtin_trap();
  return 0;
}
