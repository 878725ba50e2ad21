// tokenize: GPT-2 BPE from the command line. Text files -> token shards, or stdin text <-> ids.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/shard_writer.h"
#include "engine/data/utf8.h"

namespace {

void print_usage() {
  std::printf(
      "usage:\n"
      "  tokenize [options] --output PREFIX FILE... [--files-from LIST]\n"
      "      Each FILE (UTF-8 text) is one document. Writes the token stream\n"
      "      <|endoftext|> doc1 <|endoftext|> doc2 ... (the separator before each document, as\n"
      "      llm.c and modded-nanogpt do) into shards PREFIX_000000.bin, PREFIX_000001.bin, ...\n"
      "      and prints documents, tokens, shards and tokens/s.\n"
      "  tokenize [options] --encode   UTF-8 text on stdin -> ids, space-separated on one line\n"
      "  tokenize [options] --decode   ids on stdin -> text on stdout\n"
      "\n"
      "options:\n"
      "  --vocab DIR          folder with encoder.json and vocab.bpe (default data/tokenizer)\n"
      "  --shard-tokens N     tokens per shard (default 100000000)\n"
      "  --files-from LIST    read more input paths from LIST, one per line\n"
      "  --replace-invalid    replace invalid UTF-8 with U+FFFD instead of failing\n"
      "  --json               print the summary as one JSON object\n"
      "  --help               this text\n");
}

std::string read_stream(std::istream& in) {
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in.good(), "tokenize: cannot open input '" + path + "'");
  return read_stream(in);
}

// The text, checked or repaired; `name` is what an error calls it.
std::string checked_text(std::string text, const std::string& name, bool replace_invalid) {
  const size_t bad = data::find_invalid_utf8(text);
  if (bad == data::kUtf8Valid) return text;
  ENGINE_CHECK(replace_invalid, "tokenize: " + name + ": invalid UTF-8 at byte offset " +
                                    std::to_string(bad) +
                                    " (--replace-invalid substitutes U+FFFD)");
  return data::replace_invalid_utf8(text);
}

// CPU time of this thread: the tokenizer's speed independent of other load on the machine.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Options {
  std::string vocab = "data/tokenizer";
  std::string output;
  int64_t shard_tokens = 100000000;
  bool encode = false;
  bool decode = false;
  bool replace_invalid = false;
  bool json = false;
  std::vector<std::string> inputs;
};

int run_shards(const Options& opt) {
  ENGINE_CHECK(!opt.inputs.empty(), "tokenize: no input files");
  data::Gpt2Tokenizer tokenizer(opt.vocab);
  data::ShardWriter writer(opt.output, opt.shard_tokens);
  std::vector<int32_t> ids;
  double encode_seconds = 0;
  double encode_cpu_seconds = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& path : opt.inputs) {
    const std::string text = checked_text(read_file(path), path, opt.replace_invalid);
    ids.assign(1, data::Gpt2Tokenizer::kEndOfText);
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = thread_cpu_seconds();
    tokenizer.encode(text, ids);
    encode_cpu_seconds += thread_cpu_seconds() - cpu0;
    encode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    writer.append(ids);
  }
  const int shards = writer.finish();
  const int64_t tokens = writer.tokens();
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double rate = encode_seconds > 0 ? static_cast<double>(tokens) / encode_seconds : 0.0;
  const double cpu_rate =
      encode_cpu_seconds > 0 ? static_cast<double>(tokens) / encode_cpu_seconds : 0.0;
  if (opt.json) {
    std::printf(
        "{\"output\":\"%s\",\"documents\":%zu,\"tokens\":%" PRId64
        ",\"shards\":%d,\"encode_seconds\":%.3f,\"total_seconds\":%.3f,\"tokens_per_s\":%.0f,"
        "\"tokens_per_cpu_s\":%.0f}\n",
        opt.output.c_str(), opt.inputs.size(), tokens, shards, encode_seconds, total, rate,
        cpu_rate);
  } else {
    std::printf("%s: %zu documents, %" PRId64
                " tokens, %d shard(s); encode %.3f s (%.0f tokens/s), total %.3f s\n",
                opt.output.c_str(), opt.inputs.size(), tokens, shards, encode_seconds, rate, total);
    std::printf("encode CPU time %.3f s: %.0f tokens per CPU-second (one thread)\n",
                encode_cpu_seconds, cpu_rate);
  }
  return 0;
}

int run_encode(const Options& opt) {
  data::Gpt2Tokenizer tokenizer(opt.vocab);
  const std::string text = checked_text(read_stream(std::cin), "<stdin>", opt.replace_invalid);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line += ' ';
    line += std::to_string(ids[i]);
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stdout);
  return 0;
}

int run_decode(const Options& opt) {
  data::Gpt2Tokenizer tokenizer(opt.vocab);
  std::vector<int32_t> ids;
  std::string word;
  int64_t index = 0;
  while (std::cin >> word) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(word.c_str(), &end, 10);
    ENGINE_CHECK(
        errno == 0 && end != word.c_str() && *end == '\0' && v >= 0 && v < tokenizer.vocab_size(),
        "tokenize --decode: item " + std::to_string(index) + " '" + word +
            "' is not a token id in [0, " + std::to_string(tokenizer.vocab_size()) + ")");
    ids.push_back(static_cast<int32_t>(v));
    ++index;
  }
  const std::string text = tokenizer.decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const auto value = [&]() -> std::string {
        ENGINE_CHECK(i + 1 < argc, "tokenize: " + a + " needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        print_usage();
        return 0;
      } else if (a == "--encode") {
        opt.encode = true;
      } else if (a == "--decode") {
        opt.decode = true;
      } else if (a == "--replace-invalid") {
        opt.replace_invalid = true;
      } else if (a == "--json") {
        opt.json = true;
      } else if (a == "--vocab") {
        opt.vocab = value();
      } else if (a == "--output") {
        opt.output = value();
      } else if (a == "--shard-tokens") {
        const std::string v = value();
        char* end = nullptr;
        opt.shard_tokens = std::strtoll(v.c_str(), &end, 10);
        ENGINE_CHECK(*end == '\0' && !v.empty(),
                     "tokenize: --shard-tokens '" + v + "' is not an integer");
      } else if (a == "--files-from") {
        const std::string list = value();
        std::ifstream in(list);
        ENGINE_CHECK(in.good(), "tokenize: cannot open file list '" + list + "'");
        for (std::string line; std::getline(in, line);) {
          if (!line.empty()) opt.inputs.push_back(line);
        }
      } else if (a.starts_with("--")) {
        std::fprintf(stderr, "tokenize: unknown option %s\n", a.c_str());
        print_usage();
        return 2;
      } else {
        opt.inputs.push_back(a);
      }
    }
    if (opt.encode + opt.decode + !opt.output.empty() != 1) {
      std::fprintf(stderr, "tokenize: give exactly one of --encode, --decode, --output PREFIX\n");
      print_usage();
      return 2;
    }
    if (opt.encode) return run_encode(opt);
    if (opt.decode) return run_decode(opt);
    return run_shards(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
