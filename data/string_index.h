// A hash map from byte strings to non-negative int32 values, built for the tokenizer's hot
// lookups: open addressing with linear probing over a flat slot array, keys in one arena, the
// full 64-bit hash kept in the slot. A miss or hit usually costs one cache line of slots and one
// of key bytes, where a node-based std::unordered_map chases three pointers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace data {

class StringIndex {
 public:
  static constexpr int32_t kMissing = -1;

  // Inserts key -> value (value >= 0) unless the key is present; returns whether it inserted.
  bool insert(std::string_view key, int32_t value);
  // The value of key, or kMissing.
  int32_t find(std::string_view key) const;
  size_t size() const { return size_; }
  void clear();

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t value = kMissing;  // kMissing marks an empty slot
  };
  static uint64_t hash_of(std::string_view key);
  void grow();

  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

}  // namespace data
