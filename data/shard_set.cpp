#include "data/shard_set.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace data {

namespace {

// Why a pattern matches nothing: the folder part does not exist, or it holds no matching file.
std::string no_match_reason(const std::string& pattern) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path folder = fs::path(pattern).parent_path();
  std::string where = fs::path(pattern).is_relative() ? " (relative to the working directory " +
                                                            fs::current_path(ec).string() + ")"
                                                      : "";
  std::string why;
  if (!folder.empty() && folder.string().find_first_of("*?[") == std::string::npos &&
      !fs::is_directory(folder, ec))
    why = ": the folder " + folder.string() + " does not exist";
  return "data: no file matches the token-shard pattern '" + pattern + "'" + where + why +
         ". Write the shards first: scripts/prepare_data.sh (Brown, data/brown/), "
         "python3 tests/e2e/make_tiny_data.py data/tiny (the synthetic data of "
         "configs/tiny.yaml), or build/apps/tokenize/tokenize for your own text";
}

}  // namespace

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  // No GLOB_ERR: an unreadable or missing folder is reported as "no match", with the reason.
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0) files.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  globfree(&g);
  ENGINE_CHECK(rc != GLOB_NOSPACE, "data: out of memory expanding '" + pattern + "'");
  ENGINE_CHECK(!files.empty(), no_match_reason(pattern));
  std::sort(files.begin(), files.end());
  return files;
}

ShardSet::ShardSet(const std::string& pattern, int64_t seq_len, int64_t vocab_size)
    : pattern_(pattern), seq_len_(seq_len) {
  ENGINE_CHECK(seq_len > 0, "data: seq_len must be positive, got " + std::to_string(seq_len));
  ENGINE_CHECK(vocab_size > 0 && vocab_size <= kShardMaxVocab,
               "data: vocab_size must be in [1, 65536] for uint16 shards, got " +
                   std::to_string(vocab_size));
  seq_begin_.push_back(0);
  for (const std::string& path : glob_files(pattern)) {
    Mapped m;
    m.header = read_shard_header(path);
    if (m.header.num_tokens > 0) {
      const int fd = ::open(path.c_str(), O_RDONLY);
      ENGINE_CHECK(fd >= 0, "token shard '" + path + "': cannot open: " + strerror(errno));
      m.bytes = static_cast<size_t>(kShardHeaderBytes + 2 * m.header.num_tokens);
      m.base = ::mmap(nullptr, m.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      ENGINE_CHECK(m.base != MAP_FAILED,
                   "token shard '" + path + "': mmap failed: " + strerror(err));
      m.tokens =
          reinterpret_cast<const uint16_t*>(static_cast<const char*>(m.base) + kShardHeaderBytes);
      // Every id once, now, rather than failing when training reaches a bad one.
      check_token_ids(path, {m.tokens, static_cast<size_t>(m.header.num_tokens)}, 0, vocab_size);
    }
    m.hash = token_hash({m.tokens, static_cast<size_t>(m.header.num_tokens)});
    const int64_t n = m.header.num_tokens;
    const int64_t seqs = n > seq_len ? (n - 1) / seq_len : 0;
    num_tokens_ += n;
    seq_begin_.push_back(seq_begin_.back() + seqs);
    shards_.push_back(m);
  }
  ENGINE_CHECK(num_sequences() > 0,
               "data: the shards of '" + pattern + "' hold " + std::to_string(num_tokens_) +
                   " tokens, not one sequence of seq_len+1 = " + std::to_string(seq_len + 1) +
                   " tokens in a single shard");
}

ShardSet::~ShardSet() {
  for (Mapped& m : shards_) {
    if (m.base != nullptr) ::munmap(m.base, m.bytes);
  }
}

std::pair<int64_t, int64_t> ShardSet::locate(int64_t index) const {
  ENGINE_CHECK(index >= 0 && index < num_sequences(), "data: sequence " + std::to_string(index) +
                                                          " out of range [0, " +
                                                          std::to_string(num_sequences()) + ")");
  // The shard whose [begin, end) range of sequence numbers holds index.
  const auto it = std::upper_bound(seq_begin_.begin(), seq_begin_.end(), index);
  const int64_t shard = (it - seq_begin_.begin()) - 1;
  return {shard, (index - seq_begin_[shard]) * seq_len_};
}

void ShardSet::read_sequence(int64_t index, int32_t* inputs, int32_t* targets) const {
  const auto [shard, offset] = locate(index);
  const Mapped& m = shards_[shard];
  const std::span<const uint16_t> window(m.tokens + offset, static_cast<size_t>(seq_len_ + 1));
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = window[t];
    targets[t] = window[t + 1];
  }
}

}  // namespace data
