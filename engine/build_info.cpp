#include "engine/build_info.h"

// ENGINE_VERSION_STRING and ENGINE_COMMIT_STRING: generated at every build by
// cmake/write_build_info.cmake (rewritten only when they change, so a build at the same commit
// compiles nothing).
#include "engine_build_info_generated.h"

namespace engine {

const char* engine_version() {
  return ENGINE_VERSION_STRING;
}

const char* engine_commit() {
  return ENGINE_COMMIT_STRING;
}

std::string engine_build_line() {
  return std::string("engine ") + engine_version() + " (commit " + engine_commit() + ")";
}

}  // namespace engine
