// What was built: the engine's version and the commit of the source tree it was built from,
// for `engine --version`, the run's banner and the first record of metrics.jsonl, so that a
// log says which code made it.
#pragma once

#include <string>

namespace engine {

// The project's version (CMakeLists.txt's project(VERSION)).
const char* engine_version();
// The source tree's commit, 12 hex digits, with "-dirty" when tracked files differed from it
// at build time; "unknown" when the tree was built outside a git checkout (a bundle's copy).
const char* engine_commit();
// "engine 0.1 (commit 0123456789ab)": the one line --version prints and the banner starts with.
std::string engine_build_line();

}  // namespace engine
