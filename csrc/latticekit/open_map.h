// OpenMap<Key>: the core's one hash map, from an unsigned integer key (32 or 64 bits) to a 32-bit
// value. Open addressing with linear probing, load factor at most 1/2 (so a probe always ends at
// a free slot), Fibonacci hashing. A slot is live when its stamp is the map's, so Clear() is O(1)
// (the search clears its maps per column, the successor index per call) and every key value is
// an ordinary key; Release() also frees the slots (the drafting cache's reset). FindOrInsert never
// overwrites a present key. Unit tests: csrc/tests/test_open_map.cc (against std::unordered_map).
#ifndef LATTICEKIT_OPEN_MAP_H_
#define LATTICEKIT_OPEN_MAP_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace latticekit {
namespace internal {

template <typename Key>
class OpenMap {
  static_assert(std::is_same<Key, uint32_t>::value || std::is_same<Key, uint64_t>::value,
                "OpenMap keys are uint32_t or uint64_t");

 public:
  // slots: the initial number of slots, a power of two >= 2.
  explicit OpenMap(size_t slots = 256) : initial_slots_(slots) { Resize(slots); }

  // Every key absent, in O(1); the slots stay allocated.
  void Clear() {
    if (++stamp_ == 0) {  // wrapped: really clear
      for (Slot &s : slots_) s.stamp = 0;
      stamp_ = 1;
    }
    used_ = 0;
  }

  // Every key absent, and the slots back to the initial number (memory released).
  void Release() {
    std::vector<Slot>().swap(slots_);
    Resize(initial_slots_);
  }

  size_t size() const { return used_; }
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }

  // The value for key, or null. The pointer lives until the next insertion.
  const uint32_t *Find(Key key) const {
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      const Slot &s = slots_[i];
      if (s.stamp != stamp_) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  uint32_t *Find(Key key) { return const_cast<uint32_t *>(static_cast<const OpenMap *>(this)->Find(key)); }

  // The value for key; inserts value (and sets *inserted) if absent, never overwriting a present
  // key's. The pointer lives until the next insertion.
  uint32_t *FindOrInsert(Key key, uint32_t value, bool *inserted) {
    if (2 * (used_ + 1) > slots_.size()) Grow();
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      Slot &s = slots_[i];
      if (s.stamp != stamp_) {
        s.stamp = stamp_;
        s.key = key;
        s.value = value;
        ++used_;
        *inserted = true;
        return &s.value;
      }
      if (s.key == key) {
        *inserted = false;
        return &s.value;
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
    Key key = 0;
    uint32_t stamp = 0;
    uint32_t value = 0;
  };

  size_t Hash(Key key) const { return static_cast<size_t>((uint64_t(key) * 0x9E3779B97F4A7C15ULL) >> shift_); }

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
  size_t initial_slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  uint32_t stamp_ = 1;
  size_t used_ = 0;
};

}  // namespace internal
}  // namespace latticekit

#endif  // LATTICEKIT_OPEN_MAP_H_
