#include "core/check.h"

namespace core {

void throw_error(const char* file, int line, const std::string& message) {
  std::string where = file;
  auto slash = where.rfind('/');
  if (slash != std::string::npos) where = where.substr(slash + 1);
  throw Error(message + " (" + where + ":" + std::to_string(line) + ")");
}

}  // namespace core
