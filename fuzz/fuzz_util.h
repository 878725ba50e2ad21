// Helpers shared by the libFuzzer targets.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace fuzz {

// A scratch folder of this process (created once, reused by every input), in memory when
// /dev/shm exists.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm")
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
    auto d = base / ("engine_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  static const struct Cleanup {
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup;
  return dir;
}

// Writes bytes to scratch()/name and returns the path.
inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path path = scratch() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path.string();
}

// One input as two files of a folder: the bytes before the first `marker` to scratch()/first,
// those after it to scratch()/second (empty without a marker). The seed scripts write the same
// layout.
inline void write_two_files(const uint8_t* data, size_t size, std::string_view marker,
                            const std::string& first, const std::string& second) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = std::min(input.find(marker), input.size());
  const size_t rest = std::min(split + marker.size(), size);
  write_file(first, data, split);
  write_file(second, data + rest, size - rest);
}

}  // namespace fuzz
