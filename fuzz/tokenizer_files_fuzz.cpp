// The GPT-2 tokenizer's own files: encoder.json and vocab.bpe in one input, the text of the one, a
// line "@@vocab.bpe" and the text of the other, written into a folder and loaded by
// data::Gpt2Tokenizer. Malformed, duplicate or
// unknown entries must be refused with core::Error; a vocabulary that loads encodes and decodes
// a fixed text back. fuzz/make_tokenizer_files_seeds.py writes the seeds.
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>

#include "core/check.h"
#include "data/gpt2_tokenizer.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::filesystem::create_directories(fuzz::scratch() / "vocab");
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kMarker = "\n@@vocab.bpe\n";
  const size_t split = std::min(input.find(kMarker), input.size());
  const size_t rest = std::min(split + kMarker.size(), size);
  fuzz::write_file("vocab/encoder.json", data, split);
  fuzz::write_file("vocab/vocab.bpe", data + rest, size - rest);
  std::unique_ptr<data::Gpt2Tokenizer> tokenizer;
  try {
    tokenizer = std::make_unique<data::Gpt2Tokenizer>((fuzz::scratch() / "vocab").string());
  } catch (const core::Error&) {
    return 0;  // refused, naming the file
  }
  const std::string text = "the thin, other\n\xC3\xA9t\xC3\xA9 2024 ";
  if (tokenizer->decode(tokenizer->encode(text)) != text) __builtin_trap();
  return 0;
}
