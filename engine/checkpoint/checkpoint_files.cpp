#include "engine/checkpoint/checkpoint_files.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/transfer.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.yaml";
constexpr const char* kFormat = "engine-checkpoint-1";
constexpr const char* kChecksumKey = "manifest_fnv1a64";

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

std::string shape_text(const core::Shape& shape) {
  std::ostringstream s;
  for (size_t i = 0; i < shape.size(); ++i)
    s << (i ? "," : "") << shape[i];
  return s.str();
}

core::Shape parse_shape_text(const std::string& text, const std::string& what) {
  core::Shape shape;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    try {
      shape.push_back(std::stoll(part));
    } catch (const std::exception&) {
      ENGINE_FAIL(what + ": bad shape '" + text + "'");
    }
  }
  return shape;
}

// Counters in a rank file: "counter.<key>" = the decimal value.
constexpr const char* kCounterKey = "counter.";

// Slice metadata in a rank file: "slice.<name>" = "<dim>;<begin>;<global shape>".
std::string slice_key(const std::string& name) {
  return "slice." + name;
}

int64_t step_of_dir_name(const std::string& name) {
  if (name.size() != 13 || name.rfind("step_", 0) != 0) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

// Writes `text` to `path` and fsyncs it; a failure (disk full, permission) names the file and
// the reason.
void write_file_durably(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ENGINE_CHECK(fd >= 0, "checkpoint: cannot create " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string reason = w < 0 ? std::strerror(errno) : "nothing written";
      ::close(fd);
      ENGINE_FAIL("checkpoint: writing " + path + " failed after " + std::to_string(done) + " of " +
                  std::to_string(text.size()) + " bytes: " + reason);
    }
    done += static_cast<size_t>(w);
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string reason = synced ? "" : std::strerror(errno);
  const bool closed = ::close(fd) == 0;
  ENGINE_CHECK(synced && closed, "checkpoint: writing " + path + " failed: " +
                                     (synced ? std::string(std::strerror(errno)) : reason));
}

// Elements of `shape` before and after dimension `dim`.
std::pair<int64_t, int64_t> outer_inner(const core::Shape& shape, int dim) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d)
    outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d)
    inner *= shape[d];
  return {outer, inner};
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

uint64_t fnv1a64_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in.good(), "cannot read " + path);
  std::vector<char> buf(1 << 20);
  uint64_t hash = kFnvOffset;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    hash = fnv1a64(buf.data(), static_cast<size_t>(in.gcount()), hash);
  }
  return hash;
}

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08" PRId64, step);
  return buf;
}

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.safetensors", rank);
  return buf;
}

std::string staging_path(const std::string& root, int64_t step) {
  return (fs::path(root) / (checkpoint_dir_name(step) + ".tmp")).string();
}

std::string prepare_staging(const std::string& root, int64_t step) {
  std::string staging = staging_path(root, step);
  std::error_code ec;
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  ENGINE_CHECK(!ec, "cannot create the checkpoint folder " + staging + ": " + ec.message());
  return staging;
}

void write_rank_file(const std::string& staging, int rank, const std::vector<SavedSlice>& slices,
                     const std::map<std::string, int64_t>& counters) {
  core::SafetensorsWriter writer;
  for (const auto& [key, value] : counters)
    writer.set_metadata(kCounterKey + key, std::to_string(value));
  for (const auto& s : slices) {
    ENGINE_CHECK(s.dim >= 0 && s.dim < static_cast<int>(s.global_shape.size()),
                 "checkpoint slice " + s.name + ": dim out of range");
    ENGINE_CHECK(s.local.dim() == static_cast<int>(s.global_shape.size()),
                 "checkpoint slice " + s.name + ": local and global ranks differ");
    for (int d = 0; d < s.local.dim(); ++d)
      ENGINE_CHECK(d == s.dim ? s.begin + s.local.size(d) <= s.global_shape[d]
                              : s.local.size(d) == s.global_shape[d],
                   "checkpoint slice " + s.name + ": local " + core::shape_str(s.local.shape()) +
                       " does not fit global " + core::shape_str(s.global_shape));
    ENGINE_CHECK(core::is_host_memory(s.local.device()),
                 "checkpoint slice " + s.name + " is on " + s.local.device().str() +
                     ": stage device tensors to host first");
    writer.add(s.name, s.local);
    writer.set_metadata(slice_key(s.name), std::to_string(s.dim) + ";" + std::to_string(s.begin) +
                                               ";" + shape_text(s.global_shape));
  }
  writer.write((fs::path(staging) / rank_file_name(rank)).string());
}

namespace {

// Of `dirs` (oldest first), the checkpoint whose manifest records the lowest validation loss (the
// oldest of equals); "" when none records one. A manifest that cannot be read is passed over:
// rotation must not fail a save.
std::string best_checkpoint(const std::vector<std::string>& dirs) {
  std::string best;
  double best_loss = 0;
  for (const std::string& dir : dirs) {
    try {
      const Manifest m = read_manifest(dir);
      const auto it = m.state.find(kValLossKey);
      if (it == m.state.end()) continue;
      const double loss = std::stod(it->second);
      if (std::isfinite(loss) && (best.empty() || loss < best_loss)) {
        best = dir;
        best_loss = loss;
      }
    } catch (const std::exception&) {
      continue;
    }
  }
  return best;
}

// Removes a checkpoint folder without a moment in which a half-removed one carries a
// checkpoint's name: it is renamed to step_XXXXXXXX.old first (a name no reader takes; a removal
// cut short by a kill leaves that, and the next save removes it), then removed. Removed in place,
// a kill between its files left a step_ folder with some rank files and no manifest, which no
// rotation or save ever removed.
void remove_checkpoint_folder(const fs::path& dir) {
  const fs::path doomed = dir.string() + ".old";
  fs::remove_all(doomed);
  fs::rename(dir, doomed);
  fs::remove_all(doomed);
}

}  // namespace

std::string commit_checkpoint(const std::string& root, Manifest manifest, int keep,
                              bool keep_best) {
  const std::string staging = staging_path(root, manifest.step);
  manifest.files.clear();
  manifest.slices.clear();
  manifest.counters.clear();
  for (int r = 0; r < manifest.world_size; ++r) {
    std::string file = rank_file_name(r);
    std::string path = (fs::path(staging) / file).string();
    ENGINE_CHECK(fs::exists(path),
                 "checkpoint: rank " + std::to_string(r) + " did not write " + path);
    manifest.files.push_back({file, fs::file_size(path), fnv1a64_file(path)});
    core::SafetensorsReader reader(path);
    for (const auto& [key, value] : reader.metadata())
      if (key.rfind(kCounterKey, 0) == 0)
        manifest.counters[key.substr(std::strlen(kCounterKey))] = std::stoll(value);
    for (const auto& t : reader.tensors()) {
      std::string meta = reader.metadata_value(slice_key(t.name));
      SliceInfo s;
      s.name = t.name;
      s.file = file;
      char sep1 = 0, sep2 = 0;
      std::stringstream ss(meta);
      std::string shape;
      ss >> s.dim >> sep1 >> s.begin >> sep2 >> shape;
      s.global_shape = parse_shape_text(shape, path + " tensor " + t.name);
      s.end = s.begin + (t.shape.empty() ? 1 : t.shape[s.dim]);
      manifest.slices.push_back(s);
    }
  }

  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "format" << YAML::Value << kFormat;
  out << YAML::Key << "step" << YAML::Value << manifest.step;
  out << YAML::Key << "world_size" << YAML::Value << manifest.world_size;
  out << YAML::Key << "state" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : manifest.state)
    out << YAML::Key << k << YAML::Value << v;
  out << YAML::EndMap;
  out << YAML::Key << "counters" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : manifest.counters)
    out << YAML::Key << k << YAML::Value << v;
  out << YAML::EndMap;
  out << YAML::Key << "files" << YAML::Value << YAML::BeginSeq;
  for (const auto& f : manifest.files)
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "file" << YAML::Value << f.file << YAML::Key
        << "bytes" << YAML::Value << f.bytes << YAML::Key << "fnv1a64" << YAML::Value
        << hex64(f.checksum) << YAML::EndMap;
  out << YAML::EndSeq;
  out << YAML::Key << "slices" << YAML::Value << YAML::BeginSeq;
  for (const auto& s : manifest.slices)
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << s.name << YAML::Key
        << "file" << YAML::Value << s.file << YAML::Key << "dim" << YAML::Value << s.dim
        << YAML::Key << "begin" << YAML::Value << s.begin << YAML::Key << "end" << YAML::Value
        << s.end << YAML::Key << "shape" << YAML::Value << YAML::Flow << s.global_shape
        << YAML::EndMap;
  out << YAML::EndSeq;
  out << YAML::Key << "config" << YAML::Value << YAML::Literal << manifest.config_yaml;
  out << YAML::EndMap;

  // The manifest checksums itself: its last line is the FNV-1a 64 of every byte before it.
  std::string text = std::string(out.c_str()) + "\n";
  text += std::string(kChecksumKey) + ": " + hex64(fnv1a64(text.data(), text.size())) + "\n";
  const fs::path manifest_tmp = fs::path(staging) / (std::string(kManifest) + ".tmp");
  write_file_durably(manifest_tmp.string(), text);
  fs::rename(manifest_tmp, fs::path(staging) / kManifest);

  // Replace an older checkpoint of the same step (a resumed run saving again) only once the new
  // one is complete.
  const fs::path final_dir = fs::path(root) / checkpoint_dir_name(manifest.step);
  if (fs::exists(final_dir)) {
    fs::path old = final_dir.string() + ".old";
    fs::remove_all(old);
    fs::rename(final_dir, old);
    fs::rename(staging, final_dir);
    fs::remove_all(old);
  } else {
    fs::rename(staging, final_dir);
  }

  const std::vector<std::string> all = list_checkpoints(root);
  const std::string best = keep_best ? best_checkpoint(all) : std::string();
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i)
    if (all[i] != best) remove_checkpoint_folder(all[i]);
  // Staging folders of interrupted saves (no save runs while this one commits).
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0 &&
        (name.ends_with(".tmp") || name.ends_with(".old")))
      fs::remove_all(entry.path());
  }
  return final_dir.string();
}

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    int64_t step = step_of_dir_name(entry.path().filename().string());
    if (step < 0 || !fs::exists(entry.path() / kManifest)) continue;
    found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> dirs;
  for (auto& [step, dir] : found)
    dirs.push_back(dir);
  return dirs;
}

namespace {

void check_manifest_checksum(const std::string& path, const std::string& text) {
  const std::string marker = std::string("\n") + kChecksumKey + ": ";
  const size_t at = text.rfind(marker);
  ENGINE_CHECK(at != std::string::npos,
               "checkpoint manifest " + path + " has no " + kChecksumKey +
                   " line: it is cut short, or was written by an engine without manifest "
                   "checksums");
  const size_t body = at + 1;  // the checksum covers every byte before its own line
  const std::string saved = text.substr(at + marker.size(), 16);
  const std::string actual = hex64(fnv1a64(text.data(), body));
  ENGINE_CHECK(saved == actual, "checkpoint manifest " + path +
                                    " was changed after it was "
                                    "written: its checksum is " +
                                    actual + ", its " + kChecksumKey + " line says " + saved);
}

// Larger than any tensor a checkpoint holds (2^40 elements, 4 TiB in f32); beyond it a
// shape's element count is refused before any arithmetic on it can overflow.
constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

// A name that stays inside a folder: not empty, no separator, not "." or "..", no NUL.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

// The manifest's own numbers must agree with each other and with the folder's name.
void check_manifest_consistency(const std::string& path, const std::string& folder,
                                const Manifest& m) {
  auto refuse = [&](const std::string& what) {
    ENGINE_FAIL("checkpoint manifest " + path + " is inconsistent: " + what);
  };
  if (m.step < 0) refuse("step " + std::to_string(m.step) + " is negative");
  if (m.world_size < 1) refuse("world_size " + std::to_string(m.world_size) + " is below 1");
  const int64_t folder_step = step_of_dir_name(folder);
  if (folder_step >= 0 && folder_step != m.step)
    refuse("step " + std::to_string(m.step) + " but the folder is " + folder);
  auto data_step = m.state.find("data.step");
  if (data_step != m.state.end() && data_step->second != std::to_string(m.step))
    refuse("step " + std::to_string(m.step) + " but data.step " + data_step->second);
  // State the trainer reads back as numbers.
  for (const char* key : {"data.seed", "data.step", "train.tokens"}) {
    auto it = m.state.find(key);
    if (it == m.state.end()) continue;
    int64_t v = 0;
    const std::string& text = it->second;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || text.empty())
      refuse(std::string(key) + " is '" + text + "', not an integer");
  }
  if (auto it = m.state.find("train.time_ms"); it != m.state.end()) {
    char* end = nullptr;
    std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || *end != '\0')
      refuse("train.time_ms is '" + it->second + "', not a number");
  }
  // Optimizer step counters advance at most once per training step.
  for (const auto& [key, value] : m.counters)
    if (value < 0 || (key.ends_with("/step") && value > m.step))
      refuse("optimizer counter " + key + " = " + std::to_string(value) + " is outside [0, step " +
             std::to_string(m.step) + "]");

  // A manifest is read from files others share: its file entries may only name files inside
  // the checkpoint folder, and its slices may only describe ranges inside their tensors, before
  // anything is opened or copied.
  std::set<std::string> files;
  for (const FileInfo& f : m.files) {
    if (!is_plain_file_name(f.file))
      refuse("file entry '" + f.file +
             "' is not a plain file name inside the checkpoint folder (no separators, no '..')");
    files.insert(f.file);
  }
  std::map<std::string, const core::Shape*> shapes;
  for (const SliceInfo& s : m.slices) {
    const std::string what = "slice of tensor '" + s.name + "' in '" + s.file + "'";
    if (!files.count(s.file)) refuse(what + ": the file is not among the manifest's files");
    const int rank = static_cast<int>(s.global_shape.size());
    if (s.dim < 0 || s.dim >= std::max(rank, 1))
      refuse(what + ": dim " + std::to_string(s.dim) + " of a " + std::to_string(rank) +
             "-dimensional tensor");
    int64_t numel = 1;
    for (int64_t d : s.global_shape)
      if (d < 0 || __builtin_mul_overflow(numel, d, &numel) || numel > kMaxTensorElements)
        refuse(what + ": shape " + core::shape_str(s.global_shape) + " is not a tensor shape");
    const int64_t extent = rank == 0 ? 1 : s.global_shape[s.dim];
    if (s.begin < 0 || s.begin > s.end || s.end > extent)
      refuse(what + ": range [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
             ") along dim " + std::to_string(s.dim) + " is outside [0, " + std::to_string(extent) +
             ")");
    auto [it, fresh] = shapes.emplace(s.name, &s.global_shape);
    if (!fresh && *it->second != s.global_shape)
      refuse(what + ": shape " + core::shape_str(s.global_shape) + ", another slice says " +
             core::shape_str(*it->second));
  }
}

}  // namespace

Manifest read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifest).string();
  std::error_code ec;
  ENGINE_CHECK(fs::exists(dir, ec), "checkpoint " + dir + " does not exist");
  ENGINE_CHECK(fs::is_directory(dir, ec),
               "checkpoint " + dir + " is not a folder (a checkpoint is a step_XXXXXXXX folder)");
  const fs::file_status manifest_status = fs::symlink_status(path, ec);
  if (fs::exists(manifest_status) && !fs::is_regular_file(manifest_status))
    ENGINE_FAIL("checkpoint manifest " + path + " is not a regular file (it is " +
                (fs::is_directory(manifest_status) ? "a folder" : "a link, FIFO or device") + ")");
  if (!fs::exists(manifest_status)) {
    // A checkpoint.dir given where one of its checkpoints was meant.
    const std::vector<std::string> inside = list_checkpoints(dir);
    ENGINE_CHECK(inside.empty(), "checkpoint " + dir +
                                     " is a folder of checkpoints, not a checkpoint: give one "
                                     "of them, e.g. the newest " +
                                     inside.back());
    ENGINE_FAIL("checkpoint " + dir + " is incomplete: " + path + " is missing");
  }
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    ENGINE_CHECK(in.good(), "checkpoint manifest " + path + " cannot be read");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  check_manifest_checksum(path, text);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    ENGINE_FAIL("checkpoint manifest " + path + " is unreadable: " + e.what());
  }
  Manifest m;
  try {
    ENGINE_CHECK(root["format"] && root["format"].as<std::string>() == kFormat,
                 "checkpoint manifest " + path + ": not an " + kFormat + " manifest");
    m.step = root["step"].as<int64_t>();
    m.world_size = root["world_size"].as<int>();
    for (auto it = root["state"].begin(); it != root["state"].end(); ++it)
      m.state[it->first.as<std::string>()] = it->second.as<std::string>();
    for (auto it = root["counters"].begin(); it != root["counters"].end(); ++it)
      m.counters[it->first.as<std::string>()] = it->second.as<int64_t>();
    for (const auto& f : root["files"]) {
      FileInfo info;
      info.file = f["file"].as<std::string>();
      info.bytes = f["bytes"].as<uint64_t>();
      const std::string hex = f["fnv1a64"].as<std::string>();
      const auto parsed = std::from_chars(hex.data(), hex.data() + hex.size(), info.checksum, 16);
      ENGINE_CHECK(
          parsed.ec == std::errc() && parsed.ptr == hex.data() + hex.size() && !hex.empty(),
          "checkpoint manifest " + path + " is malformed: the checksum of " + info.file + " is '" +
              hex + "', not a hexadecimal number");
      m.files.push_back(info);
    }
    for (const auto& s : root["slices"]) {
      SliceInfo info;
      info.name = s["name"].as<std::string>();
      info.file = s["file"].as<std::string>();
      info.dim = s["dim"].as<int>();
      info.begin = s["begin"].as<int64_t>();
      info.end = s["end"].as<int64_t>();
      info.global_shape = s["shape"].as<std::vector<int64_t>>();
      m.slices.push_back(info);
    }
    m.config_yaml = root["config"].as<std::string>();
  } catch (const YAML::Exception& e) {
    ENGINE_FAIL("checkpoint manifest " + path + " is malformed: " + e.what());
  }
  check_manifest_consistency(path, fs::path(dir).lexically_normal().filename().string(), m);
  return m;
}

void verify_checkpoint(const std::string& dir) {
  Manifest m = read_manifest(dir);
  ENGINE_CHECK(static_cast<int>(m.files.size()) == m.world_size,
               "checkpoint " + dir + ": the manifest lists " + std::to_string(m.files.size()) +
                   " files for world size " + std::to_string(m.world_size));
  for (const auto& f : m.files) {
    const std::string path = (fs::path(dir) / f.file).string();
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(path, ec);
    ENGINE_CHECK(fs::exists(st), "checkpoint file " + path + " is missing");
    // A link could lead out of the folder; a FIFO or a device would block or never end.
    ENGINE_CHECK(fs::is_regular_file(st), "checkpoint " + dir + ": entry '" + f.file +
                                              "' is not a regular file (a link, FIFO or device)");
    const uint64_t bytes = fs::file_size(path);
    ENGINE_CHECK(bytes == f.bytes, "checkpoint file " + path + " has " + std::to_string(bytes) +
                                       " bytes, the manifest says " + std::to_string(f.bytes));
    const uint64_t sum = fnv1a64_file(path);
    ENGINE_CHECK(sum == f.checksum, "checkpoint file " + path + " is corrupt: checksum " +
                                        hex64(sum) + ", the manifest says " + hex64(f.checksum));
  }
}

std::string resume_refusal(const std::string& root, const std::string& chosen,
                           const std::string& reason) {
  // Offer the newest complete checkpoint older than the refused one.
  std::string offer;
  const std::string name = fs::path(chosen).lexically_normal().filename().string();
  const std::vector<std::string> all = list_checkpoints(root);
  for (const auto& dir : all)
    if (fs::path(dir).filename().string() < name) offer = dir;
  std::string msg = "cannot resume from " + chosen + ": " + reason;
  if (offer.empty()) return msg + "; there is no older checkpoint in " + root;
  // A resume from a checkpoint older than others in the folder is refused unless they go
  // (prepare_resume_from_older): the offer says so, or following it met the next refusal.
  const auto newer = static_cast<size_t>(std::count_if(all.begin(), all.end(), [&](const auto& d) {
    return fs::path(d).filename() > fs::path(offer).filename();
  }));
  msg += "; the next older checkpoint is " + offer + " (resume from it with --set " +
         "checkpoint.resume=" + offer;
  if (newer > 0)
    msg += " --set checkpoint.overwrite=true, which deletes the " + std::to_string(newer) +
           " newer checkpoint(s) in " + root + " once it is accepted";
  return msg + ")";
}

std::vector<std::string> incomplete_checkpoints(const std::string& root) {
  std::vector<std::string> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return found;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_directory() && step_of_dir_name(entry.path().filename().string()) >= 0 &&
        !fs::exists(fs::symlink_status(entry.path() / kManifest, ec)))
      found.push_back(entry.path().string());
  std::sort(found.begin(), found.end());
  return found;
}

std::string resolve_resume(const std::string& root, const std::string& resume) {
  if (resume.empty()) return "";
  std::string chosen = resume;
  if (resume == "auto") {
    // A step_ folder without a manifest is no checkpoint (nothing the engine writes leaves one:
    // saves are staged in .tmp folders, removals renamed to .old first); it is passed over, and
    // said so, since it may be the newest.
    for (const std::string& dir : incomplete_checkpoints(root))
      spdlog::warn(
          "checkpoint.resume=auto: passing over {}: it has no {} (an incomplete or "
          "damaged checkpoint; restore its manifest or remove the folder)",
          dir, kManifest);
    const std::vector<std::string> all = list_checkpoints(root);
    if (all.empty()) return "";
    chosen = all.back();
  }
  try {
    // The files' sizes and checksums, then every tensor header against its slice (a rank file
    // cut short or holding another dtype, re-signed in the manifest, passes the checksums).
    CheckpointReader reader(chosen);
  } catch (const core::Error& e) {
    throw core::Error(resume_refusal(root, chosen, e.what()));
  }
  return chosen;
}

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  verify_checkpoint(dir);
  manifest_ = read_manifest(dir);
  // Every slice against the tensor its file holds (the headers only), on every rank, before a
  // byte is copied: checked at the read, only the ranks reading a bad slice refused it, and the
  // others waited in a collective until Open MPI aborted the job some seconds later.
  for (const auto& s : manifest_.slices) {
    const core::StTensorInfo& info = reader(s.file).info(s.name);
    core::Shape expected = s.global_shape;
    if (!expected.empty()) expected[s.dim] = s.end - s.begin;
    ENGINE_CHECK(info.shape == expected && info.dtype == core::StDType::F32,
                 "checkpoint " + dir_ + " tensor " + s.name + ": " + s.file + " holds " +
                     core::st_dtype_name(info.dtype) + core::shape_str(info.shape) +
                     " for the slice [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                     ") along dim " + std::to_string(s.dim) + ", which is F32" +
                     core::shape_str(expected));
    by_name_[s.name].push_back(&s);
  }
}

CheckpointReader::~CheckpointReader() = default;

bool CheckpointReader::has(const std::string& name) const {
  return by_name_.count(name) != 0;
}

const core::Shape& CheckpointReader::global_shape(const std::string& name) const {
  auto it = by_name_.find(name);
  ENGINE_CHECK(it != by_name_.end(), "checkpoint " + dir_ + " has no tensor " + name);
  return it->second.front()->global_shape;
}

const core::SafetensorsReader& CheckpointReader::reader(const std::string& file) const {
  auto& slot = readers_[file];
  if (!slot) slot = std::make_unique<core::SafetensorsReader>((fs::path(dir_) / file).string());
  return *slot;
}

void CheckpointReader::read(const std::string& name, int dim, int64_t begin,
                            const core::Tensor& out) const {
  const core::Shape& global = global_shape(name);
  const std::string what = "checkpoint " + dir_ + " tensor " + name;
  ENGINE_CHECK(out.dim() == static_cast<int>(global.size()) && dim >= 0 && dim < out.dim(),
               what + ": requested " + core::shape_str(out.shape()) + " along dim " +
                   std::to_string(dim) + " of global " + core::shape_str(global));
  for (int d = 0; d < out.dim(); ++d)
    ENGINE_CHECK(
        d == dim ? begin >= 0 && begin + out.size(d) <= global[d] : out.size(d) == global[d],
        what + ": requested " + core::shape_str(out.shape()) + " at " + std::to_string(begin) +
            " along dim " + std::to_string(dim) + " does not fit global " +
            core::shape_str(global));
  ENGINE_CHECK(out.is_contiguous(), what + ": the output must be contiguous");
  ENGINE_CHECK(core::is_host_memory(out.device()),
               what + ": the output is on " + out.device().str() +
                   ", read into a host tensor and copy it over");
  const int64_t end = begin + out.size(dim);
  auto [outer, inner] = outer_inner(global, dim);
  float* dst = out.data<float>();
  std::vector<char> covered(static_cast<size_t>(end - begin), 0);
  for (const SliceInfo* s : by_name_.at(name)) {
    // Slices saved along another dimension are whole tensors only when they span it entirely.
    const int64_t extent = global[s->dim];
    const bool whole = s->begin == 0 && s->end == extent;
    if (s->dim != dim && !whole) continue;
    const int64_t s_begin = s->dim == dim ? s->begin : 0;
    const int64_t s_end = s->dim == dim ? s->end : global[dim];
    const int64_t lo = std::max(begin, s_begin), hi = std::min(end, s_end);
    if (lo >= hi || std::all_of(covered.begin() + (lo - begin), covered.begin() + (hi - begin),
                                [](char c) { return c != 0; }))
      continue;
    // The constructor checked that the file holds exactly this slice.
    core::Tensor src = reader(s->file).read(name);
    const float* sp = src.data<float>();
    const int64_t src_rows = s_end - s_begin, dst_rows = end - begin;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(dst + (o * dst_rows + (lo - begin)) * inner,
                  sp + (o * src_rows + (lo - s_begin)) * inner,
                  static_cast<size_t>((hi - lo) * inner) * sizeof(float));
    std::fill(covered.begin() + (lo - begin), covered.begin() + (hi - begin), 1);
  }
  ENGINE_CHECK(std::all_of(covered.begin(), covered.end(), [](char c) { return c != 0; }),
               what + ": the saved slices do not cover [" + std::to_string(begin) + ", " +
                   std::to_string(end) + ") along dim " + std::to_string(dim));
}

core::Tensor CheckpointReader::read_full(const std::string& name) const {
  core::Tensor t = core::Tensor::empty(global_shape(name));
  read(name, by_name_.at(name).front()->dim, 0, t);
  return t;
}

}  // namespace engine
