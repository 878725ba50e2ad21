#include "data/shard_outputs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "core/check.h"
#include "core/json.h"
#include "core/output_file.h"

namespace data {

namespace fs = std::filesystem;

namespace {

// Whether `name` is a shard name of `base`: base_N.bin, base_train_N.bin or base_val_N.bin, N
// six or more digits (ShardWriter::shard_path).
bool is_shard_name(const std::string& name, const std::string& base) {
  if (!name.starts_with(base + "_") || !name.ends_with(".bin")) return false;
  std::string_view rest(name);
  rest.remove_prefix(base.size() + 1);
  rest.remove_suffix(4);
  if (rest.starts_with("train_"))
    rest.remove_prefix(6);
  else if (rest.starts_with("val_"))
    rest.remove_prefix(4);
  return rest.size() >= 6 &&
         std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct FileId {
  dev_t dev;
  ino_t ino;
  bool operator==(const FileId&) const = default;
};

// The file a path names, links followed (stdin: what it is redirected from).
bool file_id(const std::string& path, FileId& id) {
  struct stat st {};
  if ((path == "-" ? ::fstat(0, &st) : ::stat(path.c_str(), &st)) != 0) return false;
  id = {st.st_dev, st.st_ino};
  return true;
}

std::string more(size_t n) {
  return n > 1 ? " (and " + std::to_string(n - 1) + " more)" : "";
}

// The earlier run's list: file name -> size. Throws naming the list when it is not one.
std::map<std::string, uint64_t> read_list(const std::string& path, const std::string& base) {
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in.good(), "tokenize: cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  const std::string what = "tokenize: " + path;
  const core::JsonValue root = core::parse_json(text.str(), what);
  const core::JsonValue* files = root.find("files");
  ENGINE_CHECK(files != nullptr && files->is_array(),
               what + ": no \"files\" list: not the file list of a tokenize run");
  std::map<std::string, uint64_t> out;
  for (const core::JsonValue& f : files->items()) {
    const core::JsonValue* name = f.find("name");
    const core::JsonValue* bytes = f.find("bytes");
    ENGINE_CHECK(
        name != nullptr && name->is_string() && bytes != nullptr && bytes->get_uint64().has_value(),
        what + ": an entry without a string \"name\" and an integer \"bytes\"");
    // Only this prefix's shard names in this folder: a list is no licence to delete elsewhere.
    ENGINE_CHECK(is_shard_name(name->text(), base),
                 what + ": lists " + core::json_escape(name->text()) + ", not a shard of " + base);
    out[name->text()] = *bytes->get_uint64();
  }
  return out;
}

// fn(), a core::Error from core/output_file.h (which names the file, not the tool) prefixed with
// "tokenize: " as the other refusals are.
template <typename Fn>
void as_tokenize(Fn&& fn) {
  try {
    fn();
  } catch (const core::Error& e) {
    throw core::Error("tokenize: " + std::string(e.what()));
  }
}

// Whether `name` is a digit string (a process id).
bool all_digits(std::string_view name) {
  return !name.empty() &&
         std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// flock(LOCK_EX) of the open lock file `fd`, or throws naming the holder; then writes this
// process's id into it.
void lock_or_refuse(int fd, const std::string& path, const std::string& prefix) {
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    const std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    ENGINE_CHECK(err != EWOULDBLOCK,
                 "tokenize: another tokenize run" +
                     (all_digits(pid) ? " (process " + pid + ")" : std::string()) +
                     " is writing the shards of " + prefix + " (it holds " + path +
                     "): wait for it to end, or choose another --output");
    ENGINE_FAIL("tokenize: cannot lock " + path + ": " + std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const int err = errno;
    ::close(fd);
    ENGINE_FAIL("tokenize: cannot write the lock file " + path + ": " + std::strerror(err));
  }
}

// Takes the prefix's lock (created if missing, a regular file of its own, never through a link)
// and writes this process's id into it; throws naming the lock and its holder when another run
// holds it. A holder removes the file before it lets go (release_lock), so a lock taken on a file
// that is no longer at `path` is the last holder's: taken again on the file there now.
int take_lock(const std::string& path, const std::string& prefix) {
  for (;;) {
    int fd = -1;
    as_tokenize([&] {
      fd =
          core::open_output_file(path, O_RDWR | O_CREAT, "the lock file", core::SharedFile::Refuse);
    });
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      ENGINE_FAIL("tokenize: the lock file " + path + " is not a regular file; remove it");
    }
    lock_or_refuse(fd, path, prefix);
    struct stat now {};
    if (::lstat(path.c_str(), &now) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino)
      return fd;
    ::close(fd);
  }
}

// Removes the lock file, then lets go of it (see take_lock).
void release_lock(int& fd, const std::string& path) {
  if (fd < 0) return;
  ::unlink(path.c_str());
  ::close(fd);
  fd = -1;
}

// Removes `path` and everything below it (never following a link); retried, since a writer
// thread of this process may still be creating a file in it when a stop signal removes it.
void remove_tree(const std::string& path) {
  std::error_code ec;
  for (int attempt = 0;
       attempt < 10 && fs::symlink_status(path, ec).type() != fs::file_type::not_found; ++attempt)
    fs::remove_all(path, ec);
}

}  // namespace

std::string ShardOutputs::list_path(const std::string& prefix) {
  return prefix + ".tokenize.json";
}

std::string ShardOutputs::lock_path(const std::string& prefix) {
  const fs::path p(prefix);
  std::string name = p.filename().string();
  name.insert(0, 1, '.');
  return (p.parent_path() / (name + ".tokenize.lock")).string();
}

ShardOutputs::ShardOutputs(const std::string& prefix, const std::vector<std::string>& inputs,
                           bool overwrite) {
  ENGINE_CHECK(!prefix.empty(), "tokenize: --output is empty");
  const fs::path p(prefix);
  std::error_code ec;
  ENGINE_CHECK(!prefix.ends_with('/') && !fs::is_directory(p, ec) && p.filename() != "." &&
                   p.filename() != "..",
               "tokenize: --output '" + prefix +
                   "' is a folder: give a file-name prefix, e.g. --output " +
                   (p / "shards").lexically_normal().string() + " writes " +
                   (p / "shards_000000.bin").lexically_normal().string() + " ...");
  folder_ = p.parent_path().empty() ? "." : p.parent_path().string();
  base_ = p.filename().string();
  fs::create_directories(folder_, ec);
  ENGINE_CHECK(!ec, "tokenize: cannot create the output folder " + folder_ + ": " + ec.message());
  lock_path_ = lock_path(prefix);
  lock_fd_ = take_lock(lock_path_, prefix);
  try {
    prepare(prefix, inputs, overwrite);
  } catch (...) {
    release_lock(lock_fd_, lock_path_);
    throw;
  }
}

void ShardOutputs::prepare(const std::string& prefix, const std::vector<std::string>& inputs,
                           bool overwrite) {
  std::error_code ec;
  const std::string list = list_path(prefix);
  const auto path_of = [&](const std::string& name) { return (fs::path(folder_) / name).string(); };
  // The list is a regular file or nothing: a folder there read as "invalid JSON", and a link
  // made the list a file outside the folder.
  as_tokenize([&] { core::check_output_file(list, "the file list"); });

  // The files of this prefix there now, and the list (all by name, links not followed).
  std::vector<std::string> existing;
  if (fs::is_directory(folder_, ec))
    for (const fs::directory_entry& e : fs::directory_iterator(folder_, ec))
      if (is_shard_name(e.path().filename().string(), base_))
        existing.push_back(e.path().filename().string());
  std::sort(existing.begin(), existing.end());

  // An input that is one of them, under any name.
  std::vector<std::pair<FileId, std::string>> outputs;
  for (const std::string& name : existing) {
    FileId id{};
    if (file_id(path_of(name), id)) outputs.emplace_back(id, path_of(name));
  }
  if (FileId id{}; file_id(list, id)) outputs.emplace_back(id, list);
  for (const std::string& input : inputs) {
    FileId id{};
    if (!file_id(input, id)) continue;
    for (const auto& [out_id, out_path] : outputs)
      ENGINE_CHECK(!(id == out_id),
                   "tokenize: the input " + std::string(input == "-" ? "(stdin)" : input) +
                       " is the output file " + out_path +
                       " (the same file): an input is never written over; choose another "
                       "--output");
  }

  if (!existing.empty()) {
    const bool listed = fs::exists(list, ec);
    ENGINE_CHECK(listed,
                 "tokenize: " + path_of(existing.front()) + more(existing.size()) +
                     " exist, and no " + list +
                     " of an earlier tokenize run lists them: tokenize replaces only files it "
                     "wrote itself; move them away or choose another --output");
    const std::map<std::string, uint64_t> earlier = read_list(list, base_);
    ENGINE_CHECK(overwrite, "tokenize: " + path_of(existing.front()) + more(existing.size()) +
                                " exist, written by an earlier tokenize run (" + list +
                                "); give --overwrite to replace that run's files, or choose "
                                "another --output");
    for (const std::string& name : existing) {
      const auto it = earlier.find(name);
      ENGINE_CHECK(it != earlier.end(), "tokenize: --overwrite: " + path_of(name) +
                                            " is not one of the files " + list +
                                            " lists (the earlier run did not write it); nothing "
                                            "replaced: move it away or choose another --output");
      struct stat st {};
      ENGINE_CHECK(::lstat(path_of(name).c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
                       static_cast<uint64_t>(st.st_size) == it->second,
                   "tokenize: --overwrite: " + path_of(name) +
                       " is not as the earlier run wrote it (" + list + " lists a file of " +
                       std::to_string(it->second) +
                       " bytes); nothing replaced: move it away or choose another --output");
    }
    earlier_ = existing;
  }

  // Under the lock, every staging folder of this prefix, and every temporary of its list, is a
  // killed run's.
  const std::string staging_stem = "." + base_ + ".tokenize.";
  const std::string list_stem = "." + base_ + ".tokenize.json.";
  for (const fs::directory_entry& e : fs::directory_iterator(folder_, ec)) {
    const std::string name = e.path().filename().string();
    const bool staging = name.starts_with(staging_stem) &&
                         all_digits(std::string_view(name).substr(staging_stem.size())) &&
                         e.is_directory(ec) && !e.is_symlink(ec);
    const bool list_tmp = name.starts_with(list_stem) && e.is_regular_file(ec) && !e.is_symlink(ec);
    if (staging || list_tmp) stale_.push_back(path_of(name));
  }
  for (const std::string& path : stale_)
    remove_tree(path);
  staging_ = path_of(staging_stem + std::to_string(::getpid()));
  ENGINE_CHECK(::mkdir(staging_.c_str(), 0755) == 0, "tokenize: cannot create the staging folder " +
                                                         staging_ + ": " + std::strerror(errno));
}

ShardOutputs::~ShardOutputs() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!committed_ && !staging_.empty()) remove_tree(staging_);
  release_lock(lock_fd_, lock_path_);  // after the staging folder is gone
}

void ShardOutputs::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  abandoned_ = true;
  if (!committed_ && !staging_.empty()) remove_tree(staging_);
  release_lock(lock_fd_, lock_path_);
}

std::string ShardOutputs::staged(const std::string& shard_prefix) const {
  return (fs::path(staging_) / fs::path(shard_prefix).filename()).string();
}

void ShardOutputs::commit() {
  std::lock_guard<std::mutex> lock(mutex_);
  ENGINE_CHECK(!committed_, "tokenize: outputs committed twice");
  ENGINE_CHECK(!abandoned_, "tokenize: stopped; nothing written");
  std::vector<std::pair<std::string, uint64_t>> written;
  for (const fs::directory_entry& e : fs::directory_iterator(staging_))
    written.emplace_back(e.path().filename().string(), e.file_size());
  std::sort(written.begin(), written.end());
  std::string text = "{\"written_by\": \"tokenize\", \"files\": [";
  for (size_t i = 0; i < written.size(); ++i)
    text += std::string(i ? ",\n  " : "\n  ") +
            "{\"name\": " + core::json_escape(written[i].first) +
            ", \"bytes\": " + std::to_string(written[i].second) + "}";
  text += "\n]}\n";
  // The list first, whole and on disk: a full disk stops the run here, before any shard moves.
  std::unique_ptr<core::AtomicFile> list;
  as_tokenize([&] {
    list = std::make_unique<core::AtomicFile>(list_path((fs::path(folder_) / base_).string()),
                                              "the file list");
    list->write(text.data(), text.size());
    list->sync();
  });
  for (const auto& [name, bytes] : written) {
    const std::string to = (fs::path(folder_) / name).string();
    // Only nothing or a regular file (the earlier run's, checked at the start) is replaced.
    as_tokenize([&] { core::check_output_file(to, "the shard"); });
    ENGINE_CHECK(
        std::rename((fs::path(staging_) / name).c_str(), to.c_str()) == 0,
        "tokenize: cannot move " + name + " into place as " + to + ": " + std::strerror(errno));
  }
  for (const std::string& name : earlier_) {
    const bool rewritten =
        std::any_of(written.begin(), written.end(), [&](const auto& w) { return w.first == name; });
    if (!rewritten) std::remove((fs::path(folder_) / name).c_str());
  }
  as_tokenize([&] { list->commit(); });
  fs::remove(staging_);
  committed_ = true;
}

}  // namespace data
