// Token-shard files: header and size checks, then the id check against a vocabulary; any
// file is read or refused with core::Error.
#include "core/check.h"
#include "data/token_shard.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("shard.bin", data, size);
  try {
    const data::ShardHeader header = data::read_shard_header(path);
    const auto tokens = data::read_shard(path, 50257);
    if (static_cast<int64_t>(tokens.size()) != header.num_tokens) __builtin_trap();
  } catch (const core::Error&) {
  }
  return 0;
}
