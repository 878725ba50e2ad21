#include "engine/export_target.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "core/check.h"
#include "core/output_file.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

// Whether `path` is `folder` or lies below it (both resolved; compared component by component,
// so /a/step_1 is not inside /a/step_10).
bool within(const fs::path& path, const fs::path& folder) {
  const auto [f, p] = std::mismatch(folder.begin(), folder.end(), path.begin(), path.end());
  return f == folder.end();
}

// What may be at `out`: nothing, or a regular file that is no program (a weights file is never
// executable; replacing /usr/bin/python3 or the engine itself as root is no export), or for
// --format hf a folder whose two files are nothing or regular files.
void check_kind(const std::string& out, bool hf_folder) {
  const std::string what = "engine export: --out";
  struct stat st {};
  if (hf_folder) {
    std::string folder = out;  // "dir/" of a file: lstat would say only "Not a directory"
    while (folder.size() > 1 && folder.ends_with('/'))
      folder.pop_back();
    if (::lstat(folder.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      core::check_output_file(folder, what);  // names a link or a device as such
      ENGINE_FAIL(what + " " + folder +
                  " is a file, not a folder: --format hf writes a folder (config.json, "
                  "model.safetensors); give a new name or a folder");
    }
    for (const char* file : {"config.json", "model.safetensors"})
      core::check_output_file((fs::path(out) / file).string(), what + " " + out + ":");
    return;
  }
  ENGINE_CHECK(!out.ends_with('/'),
               what + " '" + out +
                   "' ends in '/': the engine format writes one .safetensors file; give its name "
                   "(--format hf writes a folder)");
  core::check_output_file(out, what);
  if (::lstat(out.c_str(), &st) == 0 && (st.st_mode & (S_IXUSR | S_IXGRP | S_IXOTH))) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    ENGINE_FAIL(what + " " + out + " is an executable file (mode " + mode +
                "): a weights file is never one, and export does not replace a program; remove "
                "it first if it is yours to replace, or choose another path");
  }
}

}  // namespace

void check_export_target(const std::string& out, const std::string& checkpoint, bool hf_folder) {
  ENGINE_CHECK(!out.empty(),
               "engine export: --out is empty: give the file to write (for --format "
               "hf, the folder)");
  check_kind(out, hf_folder);
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(fs::absolute(out), ec);
  ENGINE_CHECK(!ec, "engine export: cannot resolve --out " + out + ": " + ec.message());
  const fs::path source = fs::weakly_canonical(fs::absolute(checkpoint), ec);
  ENGINE_CHECK(!ec,
               "engine export: cannot resolve the checkpoint " + checkpoint + ": " + ec.message());
  const std::string resolved =
      target.string() == out ? std::string() : " (" + target.string() + ")";
  ENGINE_CHECK(
      !within(target, source),
      "engine export: --out " + out + resolved +
          (target == source ? " is the checkpoint folder " : " is inside the checkpoint ") +
          checkpoint +
          " that it reads: writing there would change that checkpoint; give a path "
          "outside it");
  for (fs::path folder = target; folder.has_relative_path(); folder = folder.parent_path()) {
    ENGINE_CHECK(!fs::exists(folder / "manifest.yaml", ec),
                 "engine export: --out " + out + resolved + " is inside the checkpoint folder " +
                     folder.string() +
                     " (it holds a manifest.yaml): writing there would change that checkpoint; "
                     "give a path outside it");
  }
}

}  // namespace engine
