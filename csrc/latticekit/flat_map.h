// FlatMap64: an open-addressing hash map from a 64-bit key to a 32-bit value, for the drafting
// cache's tables (ngram_cache.h): linear probing, load factor at most 1/2 (a probe always ends at
// a free slot), Fibonacci hashing, keys and values in two arrays (12 bytes a slot). The key ~0 is
// reserved: it marks a free slot. Unit tests: csrc/tests/test_drafting.cc.
#ifndef LATTICEKIT_FLAT_MAP_H_
#define LATTICEKIT_FLAT_MAP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace latticekit {
namespace internal {

class FlatMap64 {
 public:
  static constexpr uint64_t kFree = ~uint64_t(0);

  FlatMap64() { Reset(16); }

  void Clear() { Reset(16); }
  size_t size() const { return used_; }

  // The value for key, or null.
  const uint32_t *Find(uint64_t key) const {
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kFree) return nullptr;
    }
  }
  uint32_t *Find(uint64_t key) {
    return const_cast<uint32_t *>(static_cast<const FlatMap64 *>(this)->Find(key));
  }

  // The value for key; inserts value (and sets *inserted) if absent. The pointer lives until
  // the next insertion.
  uint32_t *FindOrInsert(uint64_t key, uint32_t value, bool *inserted) {
    if (2 * (used_ + 1) > keys_.size()) Grow();
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) {
        *inserted = false;
        return &values_[i];
      }
      if (keys_[i] == kFree) {
        keys_[i] = key;
        values_[i] = value;
        ++used_;
        *inserted = true;
        return &values_[i];
      }
    }
  }

  size_t bytes() const { return keys_.capacity() * sizeof(uint64_t) + values_.capacity() * sizeof(uint32_t); }

 private:
  size_t Hash(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }

  void Reset(size_t slots) {
    keys_.assign(slots, kFree);
    values_.assign(slots, 0);
    mask_ = slots - 1;
    shift_ = 64;
    for (size_t s = slots; s > 1; s >>= 1) --shift_;
    used_ = 0;
  }

  void Grow() {
    std::vector<uint64_t> keys;
    std::vector<uint32_t> values;
    keys.swap(keys_);
    values.swap(values_);
    Reset(2 * keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == kFree) continue;
      size_t j = Hash(keys[i]);
      while (keys_[j] != kFree) j = (j + 1) & mask_;
      keys_[j] = keys[i];
      values_[j] = values[i];
      ++used_;
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t used_ = 0;
};

}  // namespace internal
}  // namespace latticekit

#endif  // LATTICEKIT_FLAT_MAP_H_
