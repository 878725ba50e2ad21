#include "data/shard_set.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
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

// Each shard keeps a file open: room for `shards` more descriptors, raising the soft limit
// towards the hard one when the default (often 1024) is too small for a large data set.
void make_room_for_open_files(size_t shards, const std::string& pattern) {
  constexpr rlim_t kSpare = 256;  // the process's other files: MPI, logs, checkpoints
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t needed = static_cast<rlim_t>(shards) + kSpare;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < needed) {
    limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? needed : std::min(needed, limit.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &limit);
    ::getrlimit(RLIMIT_NOFILE, &limit);
  }
  ENGINE_CHECK(limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed,
               "data: '" + pattern + "' matches " + std::to_string(shards) +
                   " shards, each kept open, but this process may open only " +
                   std::to_string(limit.rlim_cur) + " files (ulimit -n; the hard limit is " +
                   std::to_string(limit.rlim_max) + "): join shards or raise the limit");
}

// Reads exactly `bytes` at `offset`; false on a short read (the file shrank) or an error.
bool read_exactly(int fd, void* out, size_t bytes, off_t offset) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n, bytes -= static_cast<size_t>(n), offset += n;
  }
  return true;
}

std::string time_text(const timespec& t) {
  char buf[64];
  std::tm tm{};
  ::gmtime_r(&t.tv_sec, &tm);
  const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof(buf) - n, ".%03ld UTC", t.tv_nsec / 1000000);
  return buf;
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

ShardSet::ShardSet(const std::string& pattern, int64_t seq_len, int64_t vocab_size,
                   int64_t whole_batch_rows)
    : pattern_(pattern), seq_len_(seq_len), whole_batch_rows_(whole_batch_rows) {
  ENGINE_CHECK(seq_len > 0, "data: seq_len must be positive, got " + std::to_string(seq_len));
  ENGINE_CHECK(whole_batch_rows >= 0,
               "data: whole_batch_rows must be >= 0, got " + std::to_string(whole_batch_rows));
  ENGINE_CHECK(vocab_size > 0 && vocab_size <= kShardMaxVocab,
               "data: vocab_size must be in [1, 65536] for uint16 shards, got " +
                   std::to_string(vocab_size));
  seq_begin_.push_back(0);
  const std::vector<std::string> paths = glob_files(pattern);
  make_room_for_open_files(paths.size(), pattern);
  shards_.reserve(paths.size());
  try {
    load(paths, vocab_size);
  } catch (...) {
    for (const Shard& s : shards_)
      if (s.fd >= 0) ::close(s.fd);
    throw;
  }
  ENGINE_CHECK(num_sequences() > 0,
               "data: the shards of '" + pattern + "' hold " + std::to_string(num_tokens_) +
                   " tokens, not one sequence of seq_len+1 = " + std::to_string(seq_len + 1) +
                   " tokens in a single shard");
}

void ShardSet::load(const std::vector<std::string>& paths, int64_t vocab_size) {
  for (const std::string& path : paths) {
    Shard& s = shards_.emplace_back();
    // Opened first, then checked through its name: a file renamed into place between the two
    // is found by the size compared below.
    s.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    s.header = read_shard_header(path);
    ENGINE_CHECK(s.fd >= 0, "token shard '" + path + "': cannot open: " + strerror(errno));
    struct stat st {};
    ENGINE_CHECK(::fstat(s.fd, &st) == 0,
                 "token shard '" + path + "': cannot stat: " + strerror(errno));
    s.bytes = st.st_size;
    s.modified = st.st_mtim;
    check_unchanged(s);
    // Every id once, now, rather than failing when training reaches a bad one; read in chunks of
    // 1 M tokens, hashed on the way.
    const int64_t n = s.header.num_tokens;
    TokenHash hash(static_cast<size_t>(n));
    std::vector<uint16_t> chunk;
    for (int64_t first = 0; first < n;) {
      chunk.resize(static_cast<size_t>(std::min<int64_t>(n - first, 1 << 20)));
      ENGINE_CHECK(read_exactly(s.fd, chunk.data(), chunk.size() * sizeof(uint16_t),
                                kShardHeaderBytes + 2 * first),
                   "token shard '" + path + "': read failed at token " + std::to_string(first) +
                       " of " + std::to_string(n));
      check_token_ids(path, chunk, first, vocab_size);
      hash.add(chunk);
      first += static_cast<int64_t>(chunk.size());
    }
    check_unchanged(s);
    s.hash = hash.value();
    int64_t seqs = n > seq_len_ ? (n - 1) / seq_len_ : 0;
    if (whole_batch_rows_ > 0) {
      // train_gpt.py reads batch k at token k b T while k b T + b T + 1 < n, i.e. (k + 1) b T <=
      // n - 2.
      const int64_t batch_tokens = whole_batch_rows_ * seq_len_;
      seqs = n >= 2 ? (n - 2) / batch_tokens * whole_batch_rows_ : 0;
    }
    num_tokens_ += n;
    seq_begin_.push_back(seq_begin_.back() + seqs);
  }
}

ShardSet::~ShardSet() {
  for (const Shard& s : shards_)
    if (s.fd >= 0) ::close(s.fd);
}

void ShardSet::check_unchanged(const Shard& s) const {
  const off_t expected = kShardHeaderBytes + 2 * s.header.num_tokens;
  struct stat st {};
  ENGINE_CHECK(::fstat(s.fd, &st) == 0,
               "token shard '" + s.header.path + "': cannot stat: " + strerror(errno));
  const bool same_time =
      st.st_mtim.tv_sec == s.modified.tv_sec && st.st_mtim.tv_nsec == s.modified.tv_nsec;
  if (st.st_size == expected && s.bytes == expected && same_time) return;
  if (s.bytes != expected)  // at load: the name was given another file between open and check
    ENGINE_FAIL("token shard '" + s.header.path + "' changed while it was loaded (" +
                std::to_string(s.bytes) + " bytes open, " + std::to_string(expected) +
                " by its header); load it again");
  ENGINE_FAIL("token shard '" + s.header.path + "' changed while the run was reading it: it was " +
              std::to_string(expected) + " bytes, modified " + time_text(s.modified) + "; now " +
              std::to_string(st.st_size) + " bytes, modified " + time_text(st.st_mtim) +
              ". Stopped; a shard must not change under a run (write new data under another "
              "name, or replace a file by renaming a new one over it)");
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
  const Shard& s = shards_[shard];
  thread_local std::vector<uint16_t> window;
  window.resize(static_cast<size_t>(seq_len_ + 1));
  const bool whole = read_exactly(s.fd, window.data(), window.size() * sizeof(uint16_t),
                                  kShardHeaderBytes + 2 * offset);
  // After the read: a change made before it shows in the size or time, one made after it did
  // not reach these tokens.
  check_unchanged(s);
  ENGINE_CHECK(whole, "token shard '" + s.header.path + "': read failed at token " +
                          std::to_string(offset) + ": " + strerror(errno));
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = window[t];
    targets[t] = window[t + 1];
  }
}

void ShardSet::read_tokens(int64_t shard, int64_t first, int64_t count, uint16_t* out) const {
  ENGINE_CHECK(shard >= 0 && shard < num_shards(), "data: shard " + std::to_string(shard) +
                                                       " out of range [0, " +
                                                       std::to_string(num_shards()) + ")");
  const Shard& s = shards_[shard];
  ENGINE_CHECK(first >= 0 && count >= 0 && first + count <= s.header.num_tokens,
               "token shard '" + s.header.path + "': tokens [" + std::to_string(first) + ", " +
                   std::to_string(first + count) + ") outside its " +
                   std::to_string(s.header.num_tokens));
  const bool whole = read_exactly(s.fd, out, static_cast<size_t>(count) * sizeof(uint16_t),
                                  kShardHeaderBytes + 2 * first);
  check_unchanged(s);
  ENGINE_CHECK(whole, "token shard '" + s.header.path + "': read failed at token " +
                          std::to_string(first) + ": " + strerror(errno));
}

}  // namespace data
