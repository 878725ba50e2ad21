// safetensors files (checkpoint rank files, exported weights): any file is indexed and every
// tensor read, or it is refused with core::Error.
#include "core/check.h"
#include "core/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("file.safetensors", data, size);
  try {
    core::SafetensorsReader reader(path);
    for (const auto& t : reader.tensors()) {
      try {
        (void)reader.read(t.name);
      } catch (const core::Error&) {  // a dtype Tensors do not hold
      }
    }
  } catch (const core::Error&) {
  }
  return 0;
}
