// Whole checkpoints: a manifest and its rank files in one input, opened by CheckpointReader and
// read tensor by tensor, as a resume would. The input is the manifest's text, then each file
// as a line "@@file NAME" followed by its bytes. The harness appends the manifest's checksum
// line (so the fuzzer reaches the checks behind it, as a hostile editor would) and writes only
// files with plain names into the step folder; the reader must refuse anything else in the
// manifest (paths out of the folder, slices past their tensors, shapes that overflow) with
// core::Error before it opens or copies anything.
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>

#include "core/check.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path dir = fuzz::scratch() / "step_00000020";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kMarker = "\n@@file ";
  size_t at = input.find(kMarker);
  std::string manifest(input.substr(0, at));
  while (at != std::string_view::npos) {
    const size_t name_begin = at + kMarker.size();
    const size_t name_end = input.find('\n', name_begin);
    if (name_end == std::string_view::npos) break;
    const std::string name(input.substr(name_begin, name_end - name_begin));
    at = input.find(kMarker, name_end);
    const std::string_view bytes = input.substr(
        name_end + 1, at == std::string_view::npos ? std::string_view::npos : at - name_end - 1);
    if (!name.empty() && name != "." && name != ".." &&
        name.find_first_of(std::string("/\\\0", 3)) == std::string::npos)
      fuzz::write_file("step_00000020/" + name, reinterpret_cast<const uint8_t*>(bytes.data()),
                       bytes.size());
  }
  if (!manifest.empty() && manifest.back() != '\n') manifest += '\n';
  char sum[40];
  std::snprintf(sum, sizeof(sum), "manifest_fnv1a64: %016" PRIx64 "\n",
                engine::fnv1a64(manifest.data(), manifest.size()));
  manifest += sum;
  fuzz::write_file("step_00000020/manifest.yaml", reinterpret_cast<const uint8_t*>(manifest.data()),
                   manifest.size());
  try {
    engine::CheckpointReader reader(dir.string());
    std::set<std::string> names;
    for (const engine::SliceInfo& s : reader.manifest().slices)
      names.insert(s.name);
    for (const std::string& name : names)
      (void)reader.read_full(name);
  } catch (const core::Error&) {
  }
  return 0;
}
