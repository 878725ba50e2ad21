#include "engine/export_target.h"

#include <algorithm>
#include <filesystem>

#include "core/check.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

// Whether `path` is `folder` or lies below it (both resolved; compared component by component,
// so /a/step_1 is not inside /a/step_10).
bool within(const fs::path& path, const fs::path& folder) {
  const auto [f, p] = std::mismatch(folder.begin(), folder.end(), path.begin(), path.end());
  return f == folder.end();
}

}  // namespace

void check_export_target(const std::string& out, const std::string& checkpoint) {
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
