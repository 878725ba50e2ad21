// Token-shard format: round trip, and every malformed file refused with its own message.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/shard_outputs.h"
#include "data/shard_set.h"
#include "data/shard_writer.h"
#include "data/token_shard.h"
#include "tests/test_util.h"

using test_util::error_of;

namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  fs::path dir = fs::temp_directory_path() /
                 ("engine_shard_test_" +
                  std::to_string(::testing::UnitTest::GetInstance()->current_test_info()->line()));
  fs::create_directories(dir);
  return dir;
}

// A raw file: header fields, then `body_tokens` uint16 values.
void write_raw(const fs::path& path, int32_t magic, int32_t version, int32_t count,
               const std::vector<uint16_t>& body) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(body.data()),
            static_cast<std::streamsize>(body.size() * 2));
}

TEST(TokenShard, RoundTripAndExactSize) {
  const fs::path p = temp_dir() / "ok.bin";
  const std::vector<uint16_t> tokens = {0, 1, 50256, 65535, 7};
  data::write_shard(p.string(), tokens);
  EXPECT_EQ(fs::file_size(p), 1024u + 2 * tokens.size());
  EXPECT_EQ(data::read_shard_header(p.string()).num_tokens, 5);
  EXPECT_EQ(data::read_shard(p.string()), tokens);
  // No temporary file is left behind by the atomic write.
  int files = 0;
  for (const auto& e : fs::directory_iterator(p.parent_path()))
    files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  data::write_shard(p.string(), {});
  EXPECT_EQ(data::read_shard(p.string()).size(), 0u);
  fs::remove_all(p.parent_path());
}

TEST(TokenShard, EachBadFileHasItsOwnMessage) {
  const fs::path dir = temp_dir();
  const std::vector<uint16_t> body = {1, 2, 3};
  const auto expect_error = [&](const std::string& name, const std::string& what) {
    const std::string path = (dir / name).string();
    const std::string msg = error_of([&] { data::read_shard(path, 50257); });
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
  };
  expect_error("missing.bin", "cannot stat");

  { std::ofstream(dir / "short_header.bin") << "abc"; }
  expect_error("short_header.bin", "truncated header");

  write_raw(dir / "magic.bin", 20240521, 1, 3, body);
  expect_error("magic.bin", "bad magic 20240521");

  write_raw(dir / "version.bin", 20240520, 2, 3, body);
  expect_error("version.bin", "unsupported version 2");

  write_raw(dir / "negative.bin", 20240520, 1, -3, body);
  expect_error("negative.bin", "negative token count");

  write_raw(dir / "truncated.bin", 20240520, 1, 4, body);
  expect_error("truncated.bin", "truncated: header says 4 tokens");

  write_raw(dir / "long.bin", 20240520, 1, 2, body);
  expect_error("long.bin", "too long: header says 2 tokens");

  write_raw(dir / "vocab.bin", 20240520, 1, 3, {5, 50257, 9});
  expect_error("vocab.bin", "token 1 has id 50257 >= vocabulary size 50257");

  // What is not a file is named as such; file_size() said "Operation not supported" for these,
  // and opening a FIFO would wait for a writer.
  ASSERT_EQ(::mkfifo((dir / "fifo.bin").c_str(), 0600), 0);
  expect_error("fifo.bin", "not a regular file (it is a FIFO)");
  fs::create_symlink("/dev/zero", dir / "device_link.bin");
  expect_error("device_link.bin", "not a regular file (it is a character device)");
  fs::create_directory(dir / "folder.bin");
  expect_error("folder.bin", "not a regular file (it is a directory)");
  fs::remove_all(dir);
}

}  // namespace

namespace {

// The content hash a resume compares: equal tokens hash equal; one changed id, two swapped ids
// or one more token (in the four-word body or the tail) change it.
TEST(TokenShard, TokenHashSeesEveryChange) {
  std::vector<uint16_t> t(1003);
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<uint16_t>(i * 31 % 50257);
  const uint64_t h = data::token_hash(t);
  EXPECT_EQ(data::token_hash(std::vector<uint16_t>(t)), h);
  for (const size_t at : {size_t{0}, size_t{17}, size_t{500}, size_t{1001}}) {
    std::vector<uint16_t> changed = t;
    changed[at] ^= 1;
    EXPECT_NE(data::token_hash(changed), h) << "token " << at;
  }
  std::vector<uint16_t> swapped = t;
  std::swap(swapped[10], swapped[11]);
  EXPECT_NE(data::token_hash(swapped), h);
  std::vector<uint16_t> longer = t;
  longer.push_back(0);
  EXPECT_NE(data::token_hash(longer), h);
  EXPECT_NE(data::token_hash({}), data::token_hash(std::vector<uint16_t>{0}));
  // Given in pieces of any size (a shard read in chunks), the same hash.
  for (const size_t piece : {size_t{1}, size_t{7}, size_t{16}, size_t{33}, size_t{1000}}) {
    data::TokenHash chunked(t.size());
    for (size_t at = 0; at < t.size(); at += piece)
      chunked.add(std::span<const uint16_t>(t).subspan(at, std::min(piece, t.size() - at)));
    EXPECT_EQ(chunked.value(), h) << "pieces of " << piece;
  }
}

// A shard changed under a running job: truncated in place (cp new old does that) it gave SIGBUS
// through the memory map, and changed at the same size it was read silently. Each is now an
// error naming the shard at the next read; a shard renamed over (mv new old) is no change to the
// open file, which is read as loaded.
TEST(ShardSet, ShardChangedInPlaceIsNamedAtTheNextRead) {
  const fs::path dir = temp_dir();
  const std::string path = (dir / "s_000000.bin").string();
  std::vector<uint16_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint16_t>(i);
  // Written "long ago": a change now has another modification time even within the clock's tick.
  const auto write_old = [&](const std::vector<uint16_t>& t) {
    data::write_shard(path, t);
    fs::last_write_time(path, fs::last_write_time(path) - std::chrono::hours(24));
  };
  const auto read_first = [&](const data::ShardSet& set) {
    std::vector<int32_t> in(10), target(10);
    set.read_sequence(0, in.data(), target.data());
    return in[3];
  };
  {
    write_old(tokens);
    const data::ShardSet set((dir / "s_*.bin").string(), 10, 256);
    EXPECT_EQ(read_first(set), 3);
    ASSERT_EQ(::truncate(path.c_str(), 1024 + 2 * 50), 0);
    const std::string e = error_of([&] { read_first(set); });
    EXPECT_NE(e.find("token shard '" + path + "' changed while the run was reading it: it was " +
                     std::to_string(1024 + 2 * 200) + " bytes"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("now 1124 bytes"), std::string::npos) << e;
  }
  {
    write_old(tokens);
    const data::ShardSet set((dir / "s_*.bin").string(), 10, 256);
    std::vector<uint16_t> other = tokens;
    other[3] = 99;
    {
      // In place, at the same size.
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(1024);
      f.write(reinterpret_cast<const char*>(other.data()), 2 * 200);
    }
    EXPECT_NE(error_of([&] { read_first(set); }).find("changed while the run was reading it"),
              std::string::npos);
  }
  {
    write_old(tokens);
    const data::ShardSet set((dir / "s_*.bin").string(), 10, 256);
    std::vector<uint16_t> other = tokens;
    other[3] = 99;
    data::write_shard(path, other);  // a new file renamed over the name
    EXPECT_EQ(read_first(set), 3);
  }
  fs::remove_all(dir);
}

// A writer writes its own shards and deletes nothing (it deleted PREFIX_N.bin beyond its own,
// whoever wrote them; tokenize's ShardOutputs decides what may be replaced).
TEST(ShardWriter, SplitsIntoNumberedShardsAndDeletesNothing) {
  const fs::path dir = temp_dir();
  const std::string prefix = (dir / "out" / "part").string();
  std::vector<int32_t> ids(23);
  for (int i = 0; i < 23; ++i)
    ids[i] = 1000 + i;
  {
    data::ShardWriter w(prefix, 5);
    w.append({ids.data(), 7});
    w.append({ids.data() + 7, 16});
    EXPECT_EQ(w.finish(), 5);  // 5 + 5 + 5 + 5 + 3
    EXPECT_EQ(w.tokens(), 23);
  }
  std::vector<int32_t> back;
  for (int i = 0; i < 5; ++i) {
    const auto t = data::read_shard(data::ShardWriter::shard_path(prefix, i));
    EXPECT_EQ(t.size(), i < 4 ? 5u : 3u);
    back.insert(back.end(), t.begin(), t.end());
  }
  EXPECT_EQ(back, ids);
  {
    data::ShardWriter w(prefix, 100);
    w.append(ids);
    EXPECT_EQ(w.finish(), 1);
  }
  EXPECT_EQ(data::read_shard(data::ShardWriter::shard_path(prefix, 0)).size(), 23u);
  EXPECT_EQ(data::read_shard(data::ShardWriter::shard_path(prefix, 4)).size(), 3u);
  data::ShardWriter bad(prefix, 10);
  const std::vector<int32_t> too_big = {65536};
  EXPECT_THROW(bad.append(too_big), core::Error);
  EXPECT_THROW(data::ShardWriter(prefix, 0), core::Error);
  fs::remove_all(dir);
}

}  // namespace

namespace {

std::string file_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// tokenize wrote its list to PREFIX.tokenize.json.tmp.<pid> with std::ofstream, which follows a
// link: one planted there made it overwrite the file outside the folder, and the list became
// that link. The list's temporary name is unpredictable now and never opened through a link; a
// link at the list itself is refused before any work.
TEST(ShardOutputs, TheListIsNeverWrittenThroughALink) {
  const fs::path dir = temp_dir();
  const std::string prefix = (dir / "p").string();
  const std::string list = data::ShardOutputs::list_path(prefix);
  const fs::path outside = dir / "outside.txt";
  std::ofstream(outside) << "precious\n";
  fs::create_symlink(outside, list + ".tmp." + std::to_string(::getpid()));
  {
    data::ShardOutputs out(prefix, {}, false);
    data::write_shard(data::ShardWriter::shard_path(out.staged(prefix), 0),
                      std::vector<uint16_t>(4, 7));
    out.commit();
  }
  EXPECT_EQ(file_text(outside), "precious\n");
  EXPECT_FALSE(fs::is_symlink(list));
  EXPECT_NE(file_text(list).find("\"name\": \"p_000000.bin\""), std::string::npos);

  const std::string other = (dir / "q").string();
  fs::create_symlink(outside, data::ShardOutputs::list_path(other));
  const std::string msg = error_of([&] { data::ShardOutputs out(other, {}, false); });
  EXPECT_NE(msg.find("tokenize: the file list " + data::ShardOutputs::list_path(other) +
                     " is a symbolic link (to " + outside.string() + ")"),
            std::string::npos)
      << msg;
  EXPECT_EQ(file_text(outside), "precious\n");
  fs::remove_all(dir);
}

// One run at a time per prefix: the second is refused naming the lock and the holder (a second
// open of the lock file conflicts even within one process); once the first ends, the lock file
// is gone and the prefix free.
TEST(ShardOutputs, ASecondRunOfThePrefixIsRefusedWhileTheFirstHoldsIt) {
  const fs::path dir = temp_dir();
  const std::string prefix = (dir / "p").string();
  const std::string lock = data::ShardOutputs::lock_path(prefix);
  EXPECT_EQ(lock, (dir / ".p.tokenize.lock").string());
  {
    data::ShardOutputs first(prefix, {}, false);
    const std::string msg = error_of([&] { data::ShardOutputs second(prefix, {}, true); });
    EXPECT_NE(msg.find("tokenize: another tokenize run (process " + std::to_string(::getpid()) +
                       ") is writing the shards of " + prefix + " (it holds " + lock + ")"),
              std::string::npos)
        << msg;
    EXPECT_TRUE(fs::exists(lock));
  }
  EXPECT_FALSE(fs::exists(lock));
  EXPECT_NO_THROW(data::ShardOutputs again(prefix, {}, false));
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

}  // namespace
