// StampedMap: the search's open-addressing hash map from a 32-bit key to a 32-bit value,
// cleared in O(1) by bumping a stamp (a slot is live when its stamp is the map's). Linear
// probing, load factor at most 1/2 (so a probe always ends at a free slot), Fibonacci
// hashing; FindOrInsert never overwrites a present key. Unit tests:
// csrc/tests/test_stamped_map.cc.
#ifndef LATTICEKIT_STAMPED_MAP_H_
#define LATTICEKIT_STAMPED_MAP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace latticekit {
namespace internal {

// Open-addressing map from a 32-bit key to a 32-bit value, cleared in O(1) by bumping a stamp.
class StampedMap {
 public:
  StampedMap() { Resize(256); }

  void Clear() {
    if (++stamp_ == 0) {  // wrapped: really clear
      for (Slot &s : slots_) s.stamp = 0;
      stamp_ = 1;
    }
    used_ = 0;
  }

  // The value for key, or null.
  const uint32_t *Find(uint32_t key) const {
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      const Slot &s = slots_[i];
      if (s.stamp != stamp_) return nullptr;
      if (s.key == key) return &s.value;
    }
  }

  // Returns the value for key; inserts value (and sets *inserted) if absent.
  uint32_t FindOrInsert(uint32_t key, uint32_t value, bool *inserted) {
    if (2 * (used_ + 1) > slots_.size()) Grow();
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      Slot &s = slots_[i];
      if (s.stamp != stamp_) {
        s.stamp = stamp_;
        s.key = key;
        s.value = value;
        ++used_;
        *inserted = true;
        return value;
      }
      if (s.key == key) {
        *inserted = false;
        return s.value;
      }
    }
  }

  // For tests: the number of slots; and a jump of the stamp to a higher one, as that many
  // Clear()s would (every key absent), to reach the wrap-around without 2^32 clears.
  size_t capacity_for_testing() const { return slots_.size(); }
  void set_stamp_for_testing(uint32_t stamp) {  // stamp > the current one, or Find may lie
    stamp_ = stamp;
    used_ = 0;
  }

 private:
  struct Slot {
    uint32_t key = 0;
    uint32_t stamp = 0;
    uint32_t value = 0;
  };

  size_t Hash(uint32_t key) const {
    return static_cast<size_t>((uint64_t(key) * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  void Resize(size_t n) {
    slots_.assign(n, Slot());
    mask_ = n - 1;
    shift_ = 64;
    for (size_t m = n; m > 1; m >>= 1) --shift_;
    stamp_ = 1;
    used_ = 0;
  }

  void Grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    const uint32_t old_stamp = stamp_;
    Resize(old.size() * 2);
    bool inserted;
    for (const Slot &s : old)
      if (s.stamp == old_stamp) FindOrInsert(s.key, s.value, &inserted);
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  uint32_t stamp_ = 1;
  size_t used_ = 0;
};

}  // namespace internal
}  // namespace latticekit

#endif  // LATTICEKIT_STAMPED_MAP_H_
