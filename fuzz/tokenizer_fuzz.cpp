// The GPT-2 byte-level BPE tokenizer: any bytes are encoded (valid UTF-8) or refused with
// core::Error (invalid UTF-8), and decode(encode(text)) == text. The vocabulary is GPT-2's own
// when ENGINE_FUZZ_TOKENIZER names its folder (encoder.json, vocab.bpe), else a small one
// written at start-up: the 256 byte tokens and a few merges.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/gpt2_tokenizer.h"
#include "fuzz/fuzz_util.h"

namespace {

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest map to 256 + n.
std::string byte_symbol(int b) {
  static std::vector<int> code = [] {
    std::vector<int> c(256, -1);
    int n = 0;
    for (int x = 0; x < 256; ++x)
      if ((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)) c[x] = x;
    for (int x = 0; x < 256; ++x)
      if (c[x] < 0) c[x] = 256 + n++;
    return c;
  }();
  const int u = code[b];
  std::string s;
  if (u < 0x80) {
    s += static_cast<char>(u);
  } else {
    s += static_cast<char>(0xC0 | (u >> 6));
    s += static_cast<char>(0x80 | (u & 0x3F));
  }
  return s;
}

std::string small_vocabulary() {
  const std::string dir = (fuzz::scratch() / "vocab").string();
  std::filesystem::create_directories(dir);
  std::string json = "{";
  int id = 0;
  auto add = [&](const std::string& token) {
    std::string escaped;
    for (char c : token) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    json += (id ? "," : "") + std::string("\"") + escaped + "\":" + std::to_string(id);
    ++id;
  };
  for (int b = 0; b < 256; ++b)
    add(byte_symbol(b));
  const std::string space = byte_symbol(' ');
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"th", "e"}, {space, "t"}, {space, "the"}, {"i", "n"}, {"e", "r"}};
  std::string bpe = "#version: 0.2\n";
  for (const auto& [a, b] : merges) {
    add(a + b);
    bpe += a + " " + b + "\n";
  }
  json += "}";
  std::ofstream(dir + "/encoder.json") << json;
  std::ofstream(dir + "/vocab.bpe") << bpe;
  return dir;
}

std::unique_ptr<data::Gpt2Tokenizer> tokenizer;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("ENGINE_FUZZ_TOKENIZER");
  tokenizer = std::make_unique<data::Gpt2Tokenizer>(dir ? std::string(dir) : small_vocabulary());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids;
  try {
    ids = tokenizer->encode(text);
  } catch (const core::Error&) {
    return 0;  // invalid UTF-8, refused with its offset
  }
  if (tokenizer->decode(ids) != text) __builtin_trap();
  return 0;
}
