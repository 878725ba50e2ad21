// Parameter-name globs: '*' matches any run of characters (dots included), '?' one character.
#pragma once

#include <string_view>

namespace optim {

bool glob_match(std::string_view pattern, std::string_view name);

}  // namespace optim
