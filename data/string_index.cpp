#include "data/string_index.h"

#include <cstring>
#include <functional>
#include <limits>

#include "core/check.h"

namespace data {

uint64_t StringIndex::hash_of(std::string_view key) {
  // std::hash (murmur-based), then a splitmix finaliser so the low bits used as the slot index
  // depend on every input bit.
  uint64_t h = std::hash<std::string_view>{}(key);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

int32_t StringIndex::find(std::string_view key) const {
  if (slots_.empty()) return kMissing;
  const uint64_t h = hash_of(key);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.value == kMissing) return kMissing;
    if (s.hash == h && s.length == key.size() &&
        std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
      return s.value;
    }
  }
}

bool StringIndex::insert(std::string_view key, int32_t value) {
  ENGINE_CHECK(value >= 0, "StringIndex: values must be non-negative");
  ENGINE_CHECK(arena_.size() + key.size() <= std::numeric_limits<uint32_t>::max(),
               "StringIndex: key arena exceeds 4 GiB");
  if (2 * (size_ + 1) > slots_.size()) grow();  // load factor at most 1/2
  const uint64_t h = hash_of(key);
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  for (;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.value == kMissing) break;
    if (s.hash == h && s.length == key.size() &&
        std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
      return false;
    }
  }
  slots_[i] = {h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), value};
  arena_.append(key);
  ++size_;
  return true;
}

void StringIndex::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 64 : 2 * old.size(), Slot{});
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.value == kMissing) continue;
    size_t i = s.hash & mask;
    while (slots_[i].value != kMissing)
      i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void StringIndex::clear() {
  slots_.clear();
  arena_.clear();
  size_ = 0;
}

}  // namespace data
