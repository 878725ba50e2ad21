// The GPT-2 tokenizer's own files: encoder.json and vocab.bpe in one input, the text of the one, a
// line "@@vocab.bpe" and the text of the other, written into a folder and loaded by
// data::Gpt2Tokenizer. Malformed, duplicate or
// unknown entries must be refused with core::Error; a vocabulary that loads encodes and decodes
// a fixed text back. fuzz/make_tokenizer_files_seeds.py writes the seeds.
#include <memory>
#include <string>

#include "core/check.h"
#include "data/gpt2_tokenizer.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::filesystem::create_directories(fuzz::scratch() / "vocab");
  fuzz::write_two_files(data, size, "\n@@vocab.bpe\n", "vocab/encoder.json", "vocab/vocab.bpe");
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
