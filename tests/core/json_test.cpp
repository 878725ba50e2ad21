// core/json: valid documents, exact big integers, string escapes and surrogate pairs, and each
// malformed input refused with its reason, the document's name and the byte offset.
#include "core/json.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

using core::JsonError;
using core::JsonValue;
using core::parse_json;

JsonValue parse(const std::string& text) {
  return parse_json(text, "test.json");
}

TEST(Json, ParsesEveryKind) {
  const JsonValue v = parse(
      " {\"null\": null, \"t\": true, \"f\": false, \"n\": -12.5e+2, \"s\": \"hi\",\n"
      "  \"a\": [1, [], {}, \"x\"], \"o\": {\"z\": 0, \"y\": 1}} \n");
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.members().size(), 7u);
  std::vector<std::string> keys;
  for (const auto& [key, value] : v.members())
    keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"null", "t", "f", "n", "s", "a", "o"}));  // file order
  EXPECT_TRUE(v.find("null")->is_null());
  EXPECT_TRUE(v.find("t")->as_bool("t"));
  EXPECT_FALSE(v.find("f")->as_bool("f"));
  EXPECT_EQ(v.find("n")->text(), "-12.5e+2");  // the literal text is kept
  EXPECT_DOUBLE_EQ(v.find("n")->as_double("n"), -1250.0);
  EXPECT_EQ(v.find("s")->as_string("s"), "hi");
  const JsonValue& a = *v.find("a");
  ASSERT_TRUE(a.is_array());
  ASSERT_EQ(a.items().size(), 4u);
  EXPECT_EQ(a.items()[0].as_int64("a[0]"), 1);
  EXPECT_TRUE(a.items()[1].is_array() && a.items()[1].items().empty());
  EXPECT_TRUE(a.items()[2].is_object() && a.items()[2].members().empty());
  EXPECT_EQ(v.find("o")->members()[0].first, "z");
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(a.find("x"), nullptr);  // not an object
  // Any value may be the document.
  EXPECT_TRUE(parse("null").is_null());
  EXPECT_EQ(parse(" 0 ").as_uint64("zero"), 0u);
  EXPECT_EQ(parse("\"\"").as_string("empty"), "");
}

TEST(Json, IntegersAreExact) {
  // Above 2^53 a double would round: the literal text keeps every digit.
  EXPECT_EQ(parse("9007199254740993").as_uint64("n"), 9007199254740993u);
  EXPECT_EQ(parse("18446744073709551615").as_uint64("n"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(parse("-9223372036854775808").as_int64("n"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(parse("9223372036854775807").as_int64("n"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parse("-0").get_int64(), 0);
  // Out of range, negative, fractional or exponent forms are no uint64.
  const JsonValue big = parse("18446744073709551616");
  EXPECT_EQ(big.text(), "18446744073709551616");
  EXPECT_FALSE(big.get_uint64().has_value());
  EXPECT_FALSE(parse("9223372036854775808").get_int64().has_value());
  EXPECT_FALSE(parse("-1").get_uint64().has_value());
  EXPECT_FALSE(parse("1.0").get_uint64().has_value());
  EXPECT_FALSE(parse("1e3").get_uint64().has_value());
  EXPECT_FALSE(parse("\"7\"").get_uint64().has_value());
  EXPECT_DOUBLE_EQ(*parse("1e3").get_double(), 1000.0);
  EXPECT_FALSE(parse("1e999").get_double().has_value());
  try {
    big.as_uint64("shape entry");
    ADD_FAILURE() << "2^64 must not fit";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape entry must be a non-negative integer below 2^64, "
                                         "got 18446744073709551616"),
              std::string::npos)
        << e.what();
  }
  try {
    parse("[1]").as_string("name");
    ADD_FAILURE() << "an array is no string";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("name must be a string, got an array"), std::string::npos)
        << e.what();
  }
}

TEST(Json, StringEscapesAndSurrogatePairs) {
  EXPECT_EQ(parse(R"("a\"b\\c\/d\b\f\n\r\t")").text(), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(parse(R"("\u0041\u00e9\u20AC")").text(), "A\u00e9\u20ac");
  EXPECT_EQ(parse(R"("\u0000")").text(), std::string(1, '\0'));
  // A surrogate pair is one code point: U+1F600 and the highest, U+10FFFF.
  EXPECT_EQ(parse(R"("\ud83d\ude00")").text(), "\U0001F600");
  EXPECT_EQ(parse(R"("\uDBFF\uDFFF")").text(), "\U0010FFFF");
  // Raw UTF-8 passes unchanged, up to four-byte sequences.
  EXPECT_EQ(parse("\"h\u00e9 \u4e2d \U0001F600\"").text(), "h\u00e9 \u4e2d \U0001F600");
  EXPECT_EQ(parse("{\"\u00e9\": 1}").members()[0].first, "\u00e9");
}

TEST(Json, EscapeRoundTrips) {
  const std::string s =
      std::string("quote\" back\\ nl\n tab\t cr\r bell\x07 nul") + '\0' + " \u00e9\U0001F600";
  const std::string literal = core::json_escape(s);
  EXPECT_EQ(literal.front(), '"');
  EXPECT_EQ(literal.find('\n'), std::string::npos);
  EXPECT_NE(literal.find("\\u0007"), std::string::npos);
  EXPECT_EQ(parse(literal).text(), s);
  EXPECT_EQ(core::json_escape(""), "\"\"");
}

struct Malformed {
  std::string text;
  const char* reason;
  size_t offset;
};

TEST(Json, MalformedDocumentsAreRefusedWithReasonAndOffset) {
  std::string large_dup = "{";
  for (int i = 0; i < 100; ++i)
    large_dup += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  const size_t dup_at = large_dup.size();
  large_dup += "\"k50\":0}";
  const std::vector<Malformed> cases = {
      {"", "unexpected end", 0},
      {"   ", "unexpected end", 3},
      {"{} x", "trailing characters after the JSON value", 3},
      {"[1] [2]", "trailing characters after the JSON value", 4},
      {"{\"a\":1,}", "expected a string key", 7},
      {"{\"a\":1,\"a\":2}", "duplicate key \"a\"", 7},
      {large_dup, "duplicate key \"k50\"", dup_at},
      {"{1:2}", "expected a string key", 1},
      {"{\"a\" 1}", "expected ':'", 5},
      {"{\"a\":1", "unexpected end", 6},
      {"{\"a\":1 \"b\":2}", "expected '}'", 7},
      {"[1,]", "unexpected character", 3},
      {"[1 2]", "expected ']'", 3},
      {"[", "unexpected end", 1},
      {"01", "leading zero in a number", 1},
      {"-", "malformed number", 1},
      {"1.", "malformed number", 2},
      {"1.e5", "malformed number", 2},
      {"1e", "malformed number", 2},
      {"1e+", "malformed number", 3},
      {"+1", "unexpected character", 0},
      {".5", "unexpected character", 0},
      {"NaN", "unexpected character", 0},
      {"tru", "unexpected character", 0},
      {"nul", "unexpected character", 0},
      {"'a'", "unexpected character", 0},
      {"\"abc", "unterminated string", 4},
      {"\"a\\", "unterminated escape", 3},
      {"\"a\tb\"", "control character in string", 2},
      {"\"a\nb\"", "control character in string", 2},
      {"\"\\x\"", "unknown escape \\x", 1},
      {"\"\\u12\"", "truncated \\u escape", 3},
      {"\"\\u12G4\"", "bad hex digit in \\u escape", 5},
      {"\"\\ud83d\"", "unpaired surrogate", 1},
      {"\"\\ud83dx\"", "unpaired surrogate", 1},
      {"\"\\ud83d\\u0041\"", "unpaired surrogate", 1},
      {"\"\\ude00\"", "unpaired surrogate", 1},
      {"\"ok\xff\"", "invalid UTF-8 in string", 3},
      {"\"\xc0\xaf\"", "invalid UTF-8 in string", 1},          // overlong '/'
      {"\"\xed\xa0\x80\"", "invalid UTF-8 in string", 1},      // a UTF-8 encoded surrogate
      {"\"\xf4\x90\x80\x80\"", "invalid UTF-8 in string", 1},  // above U+10FFFF
      {"\"\xe2\x82\"", "invalid UTF-8 in string", 1},          // truncated sequence
      {"\xef\xbb\xbf{}", "unexpected character", 0},           // no byte order mark
      {std::string(65, '[') + std::string(65, ']'), "nesting too deep", 64},
  };
  for (const Malformed& c : cases) {
    try {
      parse(c.text);
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const JsonError& e) {
      EXPECT_EQ(e.reason(), c.reason) << c.text;
      EXPECT_EQ(e.offset(), c.offset) << c.text;
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("test.json: invalid JSON: " + std::string(c.reason), 0), 0u) << what;
      EXPECT_NE(what.find("at byte " + std::to_string(c.offset)), std::string::npos) << what;
    }
  }
  // 64 levels are fine.
  EXPECT_TRUE(parse(std::string(64, '[') + std::string(64, ']')).is_array());
}

TEST(Json, ErrorsNameTheDocumentAndLine) {
  try {
    parse_json("{\n  \"a\": 1,\n  \"b\": tru\n}", "dir/encoder.json");
    ADD_FAILURE() << "accepted";
  } catch (const core::Error& e) {  // JsonError is a core::Error
    EXPECT_STREQ(e.what(),
                 "dir/encoder.json: invalid JSON: unexpected character at byte 19 (line 3)");
  }
}

TEST(Json, LargeObjectKeepsOrderAndKeys) {
  std::string text = "{";
  for (int i = 0; i < 5000; ++i)
    text += (i ? ",\"" : "\"") + std::to_string(4999 - i) + "\":" + std::to_string(i);
  text += "}";
  const JsonValue v = parse(text);
  ASSERT_EQ(v.members().size(), 5000u);
  for (int i = 0; i < 5000; ++i) {
    EXPECT_EQ(v.members()[i].first, std::to_string(4999 - i));
    EXPECT_EQ(v.members()[i].second.get_uint64(), static_cast<uint64_t>(i));
  }
  EXPECT_EQ(v.find("0")->as_uint64("0"), 4999u);
}

}  // namespace
