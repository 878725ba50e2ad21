// Checkpoint manifests: the input gets a valid checksum line appended (so the fuzzer reaches
// the YAML and consistency checks behind it), then read_manifest either returns or refuses
// with core::Error. The raw input is tried too, for the checksum check itself.
#include <cinttypes>
#include <cstdio>
#include <string>

#include "core/check.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = (fuzz::scratch() / "step_00000020").string();
  std::filesystem::create_directories(dir);
  std::string text(reinterpret_cast<const char*>(data), size);
  for (int variant = 0; variant < 2; ++variant) {
    if (variant == 1) {
      if (!text.empty() && text.back() != '\n') text += '\n';
      char sum[40];
      std::snprintf(sum, sizeof(sum), "manifest_fnv1a64: %016" PRIx64 "\n",
                    engine::fnv1a64(text.data(), text.size()));
      text += sum;
    }
    fuzz::write_file("step_00000020/manifest.yaml", reinterpret_cast<const uint8_t*>(text.data()),
                     text.size());
    try {
      (void)engine::read_manifest(dir);
    } catch (const core::Error&) {
    }
  }
  return 0;
}
