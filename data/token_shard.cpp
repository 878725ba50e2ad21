#include "data/token_shard.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/check.h"
#include "core/output_file.h"
#include "core/rng.h"

namespace data {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; a big-endian host would need byte swaps");

namespace {

std::string shard_error(const std::string& path, const std::string& what) {
  return "token shard '" + path + "': " + what;
}

// What a path that is no regular file is, for the refusal (file_size() said only "Operation not
// supported" for a FIFO or a device; opening a FIFO would block until a writer comes).
std::string kind_of_file(std::filesystem::file_type type) {
  switch (type) {
    case std::filesystem::file_type::directory:
      return "a directory";
    case std::filesystem::file_type::fifo:
      return "a FIFO";
    case std::filesystem::file_type::character:
      return "a character device";
    case std::filesystem::file_type::block:
      return "a block device";
    case std::filesystem::file_type::socket:
      return "a socket";
    default:
      return "not a file";
  }
}

}  // namespace

ShardHeader read_shard_header(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  ENGINE_CHECK(!ec, shard_error(path, "cannot stat file: " + ec.message()));
  ENGINE_CHECK(status.type() == std::filesystem::file_type::regular,
               shard_error(path, "not a regular file (it is " + kind_of_file(status.type()) + ")"));
  const auto file_size = std::filesystem::file_size(path, ec);
  ENGINE_CHECK(!ec, shard_error(path, "cannot stat file: " + ec.message()));
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in.good(), shard_error(path, "cannot open file: " + std::string(strerror(errno))));
  int32_t header[kShardHeaderInts] = {};
  in.read(reinterpret_cast<char*>(header), kShardHeaderBytes);
  ENGINE_CHECK(
      in.gcount() == kShardHeaderBytes,
      shard_error(path, "truncated header: file has " + std::to_string(file_size) +
                            " bytes, the header alone needs " + std::to_string(kShardHeaderBytes)));
  ENGINE_CHECK(header[0] == kShardMagic,
               shard_error(path, "bad magic " + std::to_string(header[0]) + " (expected " +
                                     std::to_string(kShardMagic) + "): not a token shard"));
  ENGINE_CHECK(header[1] == kShardVersion,
               shard_error(path, "unsupported version " + std::to_string(header[1]) +
                                     " (expected " + std::to_string(kShardVersion) + ")"));
  ENGINE_CHECK(header[2] >= 0,
               shard_error(path, "negative token count " + std::to_string(header[2])));
  const int64_t n = header[2];
  const auto expected = static_cast<uintmax_t>(kShardHeaderBytes + 2 * n);
  ENGINE_CHECK(file_size >= expected,
               shard_error(path, "truncated: header says " + std::to_string(n) + " tokens (" +
                                     std::to_string(expected) + " bytes) but the file has " +
                                     std::to_string(file_size) + " bytes"));
  ENGINE_CHECK(file_size == expected,
               shard_error(path, "too long: header says " + std::to_string(n) + " tokens (" +
                                     std::to_string(expected) + " bytes) but the file has " +
                                     std::to_string(file_size) + " bytes"));
  return {path, n};
}

void check_token_ids(const std::string& path, std::span<const uint16_t> tokens, int64_t first,
                     int64_t vocab_size) {
  if (vocab_size >= kShardMaxVocab) return;
  // One branch-free pass for the largest id (the compiler vectorises it: a few ms per 100 MB);
  // the position of the first bad id is looked up only when there is one.
  uint16_t largest = 0;
  for (const uint16_t id : tokens)
    largest = id > largest ? id : largest;
  if (largest < vocab_size) return;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) {
      ENGINE_FAIL(shard_error(path, "token " + std::to_string(first + static_cast<int64_t>(i)) +
                                        " has id " + std::to_string(tokens[i]) +
                                        " >= vocabulary size " + std::to_string(vocab_size) +
                                        " (model.vocab_size; the largest id in the shard is " +
                                        std::to_string(largest) + ")"));
    }
  }
}

// Four independent multiply chains over 64-bit words (4 tokens each) keep the multiplier busy;
// each step (h ^ w) * odd is a bijection of h, so any one changed word changes the result. The
// lanes take whole blocks of 16 tokens; the tokens after the last whole block, and the count,
// go through one rng_hash chain.
constexpr uint64_t kOdd = 0x9E3779B97F4A7C15ull;

TokenHash::TokenHash(size_t total)
    : total_(total), blocked_(total / 16 * 16), tail_(core::rng_hash(total, 0)) {}

void TokenHash::block(const unsigned char* bytes) {
  for (size_t lane = 0; lane < 4; ++lane) {
    uint64_t w;
    std::memcpy(&w, bytes + 8 * lane, 8);
    lanes_[lane] = (lanes_[lane] ^ w) * kOdd;
  }
}

void TokenHash::add(std::span<const uint16_t> tokens) {
  ENGINE_CHECK(seen_ + tokens.size() <= total_, "token hash: more tokens than announced");
  size_t i = 0;
  while (i < tokens.size()) {
    if (seen_ >= blocked_) {
      tail_ = core::rng_hash(tail_, tokens[i++]);
      ++seen_;
    } else if (pending_count_ == 0 && tokens.size() - i >= 16) {
      block(reinterpret_cast<const unsigned char*>(tokens.data() + i));
      i += 16, seen_ += 16;
    } else {
      pending_[pending_count_++] = tokens[i++];
      ++seen_;
      if (pending_count_ == 16) {
        block(reinterpret_cast<const unsigned char*>(pending_));
        pending_count_ = 0;
      }
    }
  }
}

uint64_t TokenHash::value() const {
  ENGINE_CHECK(seen_ == total_, "token hash: " + std::to_string(seen_) + " of " +
                                    std::to_string(total_) + " tokens added");
  uint64_t out = tail_;
  for (const uint64_t lane : lanes_)
    out = core::rng_hash(out, lane);
  return out;
}

uint64_t token_hash(std::span<const uint16_t> tokens) {
  TokenHash h(tokens.size());
  h.add(tokens);
  return h.value();
}

std::vector<uint16_t> read_shard(const std::string& path, int64_t vocab_size) {
  const ShardHeader header = read_shard_header(path);
  std::vector<uint16_t> tokens(static_cast<size_t>(header.num_tokens));
  std::ifstream in(path, std::ios::binary);
  in.seekg(kShardHeaderBytes);
  in.read(reinterpret_cast<char*>(tokens.data()),
          static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  ENGINE_CHECK(in.good() || tokens.empty(), shard_error(path, "read failed"));
  check_token_ids(path, tokens, 0, vocab_size);
  return tokens;
}

void write_shard(const std::string& path, std::span<const uint16_t> tokens) {
  ENGINE_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
               shard_error(path, std::to_string(tokens.size()) +
                                     " tokens do not fit the int32 count of the header"));
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  core::AtomicFile file(path, "the token shard");
  file.write(header, sizeof(header));
  file.write(tokens.data(), tokens.size() * sizeof(uint16_t));
  file.commit();
}

}  // namespace data
