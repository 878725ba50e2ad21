#include "data/shard_outputs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/check.h"
#include "core/json.h"

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

}  // namespace

std::string ShardOutputs::list_path(const std::string& prefix) {
  return prefix + ".tokenize.json";
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
  const std::string list = list_path(prefix);

  // The files of this prefix there now, and the list (all by name, links not followed).
  std::vector<std::string> existing;
  if (fs::is_directory(folder_, ec))
    for (const fs::directory_entry& e : fs::directory_iterator(folder_, ec))
      if (is_shard_name(e.path().filename().string(), base_))
        existing.push_back(e.path().filename().string());
  std::sort(existing.begin(), existing.end());
  const auto path_of = [&](const std::string& name) { return (fs::path(folder_) / name).string(); };

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

  fs::create_directories(folder_);
  staging_ = path_of("." + base_ + ".tokenize." + std::to_string(::getpid()));
  fs::remove_all(staging_, ec);  // a crashed run's of the same process id
  fs::create_directory(staging_);
}

ShardOutputs::~ShardOutputs() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

std::string ShardOutputs::staged(const std::string& shard_prefix) const {
  return (fs::path(staging_) / fs::path(shard_prefix).filename()).string();
}

void ShardOutputs::commit() {
  ENGINE_CHECK(!committed_, "tokenize: outputs committed twice");
  std::vector<std::pair<std::string, uint64_t>> written;
  for (const fs::directory_entry& e : fs::directory_iterator(staging_))
    written.emplace_back(e.path().filename().string(), e.file_size());
  std::sort(written.begin(), written.end());
  for (const auto& [name, bytes] : written) {
    const std::string to = (fs::path(folder_) / name).string();
    ENGINE_CHECK(
        std::rename((fs::path(staging_) / name).c_str(), to.c_str()) == 0,
        "tokenize: cannot move " + name + " into place as " + to + ": " + std::strerror(errno));
  }
  for (const std::string& name : earlier_) {
    const bool rewritten =
        std::any_of(written.begin(), written.end(), [&](const auto& w) { return w.first == name; });
    if (!rewritten) std::remove((fs::path(folder_) / name).c_str());
  }
  std::string text = "{\"written_by\": \"tokenize\", \"files\": [";
  for (size_t i = 0; i < written.size(); ++i)
    text += std::string(i ? ",\n  " : "\n  ") +
            "{\"name\": " + core::json_escape(written[i].first) +
            ", \"bytes\": " + std::to_string(written[i].second) + "}";
  text += "\n]}\n";
  const std::string list = list_path((fs::path(folder_) / base_).string());
  const std::string tmp = list + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    ENGINE_CHECK(out.good(), "tokenize: cannot write " + tmp + ": " + std::strerror(errno));
  }
  ENGINE_CHECK(std::rename(tmp.c_str(), list.c_str()) == 0,
               "tokenize: cannot move " + tmp + " into place: " + std::strerror(errno));
  fs::remove(staging_);
  committed_ = true;
}

}  // namespace data
