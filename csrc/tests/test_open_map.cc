// Unit tests of OpenMap (latticekit/open_map.h), the core's hash map: insert and find, a present
// key never overwritten, clearing by stamp, growth past the load factor, keys that collide in
// the probe sequence (and wrap around the slot array), the stamp's wrap-around, random operation
// sequences against std::unordered_map (32-bit keys, as the search uses, and 64-bit keys, as the
// drafting cache does), and Release. test_core.cc's main runs them.
#include <cstdint>
#include <cstdio>
#include <random>
#include <unordered_map>
#include <vector>

#include "latticekit/open_map.h"

#include "check.h"

namespace latticekit {
namespace testing {
namespace {

using Map32 = internal::OpenMap<uint32_t>;  // the search's maps: 32-bit keys, 256 slots at first

// What FindOrInsert(key, value) gives: its return value and *inserted.
struct Insert {
  uint32_t value;
  bool inserted;
};

Insert FindOrInsert(Map32 *map, uint32_t key, uint32_t value) {
  Insert result;
  result.value = *map->FindOrInsert(key, value, &result.inserted);
  return result;
}

bool Has(const Map32 &map, uint32_t key, uint32_t value) {
  const uint32_t *found = map.Find(key);
  return found != nullptr && *found == value;
}

// The home slot of key in a map of 256 slots, as open_map.h's Hash computes it (Fibonacci
// hashing: the top 8 bits of key * 2^64 / golden ratio).
uint32_t HomeSlot256(uint32_t key) {
  return static_cast<uint32_t>((uint64_t(key) * 0x9E3779B97F4A7C15ULL) >> 56);
}

// The first count keys, from first up, whose home slot in 256 slots is slot.
std::vector<uint32_t> KeysAt(uint32_t slot, size_t count, uint32_t first = 0) {
  std::vector<uint32_t> keys;
  for (uint32_t key = first; keys.size() < count; ++key)
    if (HomeSlot256(key) == slot) keys.push_back(key);
  return keys;
}

void TestInsertFind() {
  Map32 map;
  CHECK(map.capacity_for_testing() == 256);
  for (uint32_t key : {0u, 1u, 7u, 0xFFFFFFFFu}) CHECK(map.Find(key) == nullptr);
  Insert r = FindOrInsert(&map, 5, 50);
  CHECK(r.inserted && r.value == 50);
  CHECK(Has(map, 5, 50));
  // A present key keeps its value: FindOrInsert returns it and does not overwrite.
  r = FindOrInsert(&map, 5, 99);
  CHECK(!r.inserted && r.value == 50);
  CHECK(Has(map, 5, 50));
  // Key 0 (what an empty slot holds) and the extremes are ordinary keys and values.
  CHECK(map.Find(0) == nullptr);
  r = FindOrInsert(&map, 0, 0xFFFFFFFFu);
  CHECK(r.inserted && r.value == 0xFFFFFFFFu);
  r = FindOrInsert(&map, 0xFFFFFFFFu, 0);
  CHECK(r.inserted && r.value == 0);
  CHECK(Has(map, 0, 0xFFFFFFFFu) && Has(map, 0xFFFFFFFFu, 0) && Has(map, 5, 50));
  for (uint32_t key : {1u, 4u, 6u, 0xFFFFFFFEu}) CHECK(map.Find(key) == nullptr);
}

void TestClear() {
  Map32 map;
  for (uint32_t key = 0; key < 100; ++key) FindOrInsert(&map, key * 7919, key);
  map.Clear();
  bool all_absent = true;
  for (uint32_t key = 0; key < 100; ++key) all_absent &= map.Find(key * 7919) == nullptr;
  CHECK(all_absent);
  // After a clear a key is new again: inserted, with the new value.
  bool all_new = true;
  for (uint32_t key = 0; key < 100; ++key) {
    const Insert r = FindOrInsert(&map, key * 7919, key + 1000);
    all_new &= r.inserted && r.value == key + 1000 && Has(map, key * 7919, key + 1000);
  }
  CHECK(all_new);
  // Many clears in a row, one key each time: only the last is present.
  for (uint32_t round = 0; round < 1000; ++round) {
    map.Clear();
    FindOrInsert(&map, round, round);
  }
  CHECK(Has(map, 999, 999) && map.Find(998) == nullptr && map.Find(0) == nullptr);
  // A clear frees every slot for the load factor too: 128 new keys after it fit in 256 slots.
  map.Clear();
  for (uint32_t key = 0; key < 128; ++key) FindOrInsert(&map, key, key);
  CHECK(map.capacity_for_testing() == 256);
}

void TestGrowth() {
  Map32 map;
  // At most half the slots are used: 128 keys fit in 256 slots, the 129th doubles them.
  for (uint32_t key = 0; key < 128; ++key) FindOrInsert(&map, key * 2654435761u, key);
  CHECK(map.capacity_for_testing() == 256);
  FindOrInsert(&map, 128u * 2654435761u, 128);
  CHECK(map.capacity_for_testing() == 512);
  // Every key survives every doubling, with its value.
  const uint32_t n = 100000;
  for (uint32_t key = 129; key < n; ++key) FindOrInsert(&map, key * 2654435761u, key);
  CHECK(map.capacity_for_testing() == 262144);
  bool all_found = true;
  for (uint32_t key = 0; key < n; ++key) all_found &= Has(map, key * 2654435761u, key);
  CHECK(all_found);
  bool none_inserted = true;
  for (uint32_t key = 0; key < n; ++key)
    none_inserted &= !FindOrInsert(&map, key * 2654435761u, 0).inserted;
  CHECK(none_inserted);
  // A clear keeps the slots; the keys are gone.
  map.Clear();
  CHECK(map.capacity_for_testing() == 262144);
  bool all_absent = true;
  for (uint32_t key = 0; key < n; ++key) all_absent &= map.Find(key * 2654435761u) == nullptr;
  CHECK(all_absent);

  // Growing after clears moves only the live keys: the slots of earlier generations, still
  // holding their keys, must not come back.
  Map32 cleared;
  for (uint32_t key = 0; key < 120; ++key) FindOrInsert(&cleared, key, key);
  cleared.Clear();
  for (uint32_t key = 1000; key < 1300; ++key) FindOrInsert(&cleared, key, key + 1);
  CHECK(cleared.capacity_for_testing() == 1024);
  bool old_absent = true, new_found = true;
  for (uint32_t key = 0; key < 120; ++key) old_absent &= cleared.Find(key) == nullptr;
  for (uint32_t key = 1000; key < 1300; ++key) new_found &= Has(cleared, key, key + 1);
  CHECK(old_absent && new_found);
}

void TestCollisions() {
  // 40 keys with the same home slot: one probe run of 40 slots.
  const std::vector<uint32_t> same = KeysAt(17, 50);
  Map32 map;
  for (uint32_t i = 0; i < 40; ++i) CHECK(FindOrInsert(&map, same[i], i).inserted);
  CHECK(map.capacity_for_testing() == 256);  // no growth: the keys really collide
  bool all_found = true;
  for (uint32_t i = 0; i < 40; ++i) all_found &= Has(map, same[i], i);
  CHECK(all_found);
  // Absent keys of the same home slot probe through the whole run to its end.
  bool absent = true;
  for (size_t i = 40; i < 50; ++i) absent &= map.Find(same[i]) == nullptr;
  CHECK(absent);
  // Keys homed in the slots the run overflows into find their place after it.
  const std::vector<uint32_t> next = KeysAt(30, 5);
  for (uint32_t i = 0; i < next.size(); ++i) FindOrInsert(&map, next[i], 100 + i);
  bool next_found = true;
  for (uint32_t i = 0; i < next.size(); ++i) next_found &= Has(map, next[i], 100 + i);
  CHECK(next_found && Has(map, same[0], 0) && Has(map, same[39], 39));

  // A run that starts in the last slot wraps around to slot 0, where keys homed at 0 and 1
  // then compete; in either insertion order every key is found.
  const std::vector<uint32_t> last = KeysAt(255, 6), first = KeysAt(0, 4), second = KeysAt(1, 3);
  for (int order = 0; order < 2; ++order) {
    Map32 wrap;
    std::vector<uint32_t> keys;
    if (order == 0) {
      keys.insert(keys.end(), last.begin(), last.end());
      keys.insert(keys.end(), first.begin(), first.end());
    } else {
      keys.insert(keys.end(), first.begin(), first.end());
      keys.insert(keys.end(), last.begin(), last.end());
    }
    keys.insert(keys.end(), second.begin(), second.end());
    for (uint32_t i = 0; i < keys.size(); ++i) FindOrInsert(&wrap, keys[i], i);
    CHECK(wrap.capacity_for_testing() == 256);
    bool found = true;
    for (uint32_t i = 0; i < keys.size(); ++i) found &= Has(wrap, keys[i], i);
    CHECK(found);
    const std::vector<uint32_t> absent_last = KeysAt(255, 1, last.back() + 1);
    CHECK(wrap.Find(absent_last[0]) == nullptr);
    // Clearing a wrapped run empties it too.
    wrap.Clear();
    bool cleared = true;
    for (uint32_t key : keys) cleared &= wrap.Find(key) == nullptr;
    CHECK(cleared);
  }
}

// The stamp is 32 bits: when Clear() wraps it to 0 the map really clears its slots and starts
// again at 1, so slots stamped long ago (with 1, 2, ...) do not come back as live.
void TestStampWrap() {
  Map32 map;
  for (uint32_t key = 0; key < 50; ++key) FindOrInsert(&map, key, key);  // stamp 1
  map.set_stamp_for_testing(0xFFFFFFFEu);  // as 2^32 - 3 clears would
  CHECK(map.Find(0) == nullptr && map.Find(49) == nullptr);
  for (uint32_t key = 100; key < 150; ++key) FindOrInsert(&map, key, key);  // stamp 2^32 - 2
  CHECK(Has(map, 100, 100));
  map.Clear();  // stamp 2^32 - 1
  CHECK(map.Find(100) == nullptr);
  for (uint32_t key = 200; key < 250; ++key) FindOrInsert(&map, key, key);
  CHECK(Has(map, 200, 200) && map.Find(0) == nullptr);
  map.Clear();  // wraps: every slot cleared, stamp 1 again
  bool all_absent = true;
  for (uint32_t key = 0; key < 300; ++key) all_absent &= map.Find(key) == nullptr;
  CHECK(all_absent);
  // The keys of stamp 1's first generation are new again, with new values.
  bool all_new = true;
  for (uint32_t key = 0; key < 50; ++key) {
    const Insert r = FindOrInsert(&map, key, key + 7);
    all_new &= r.inserted && r.value == key + 7;
  }
  CHECK(all_new);
  bool found = true;
  for (uint32_t key = 0; key < 50; ++key) found &= Has(map, key, key + 7);
  CHECK(found && map.Find(100) == nullptr && map.Find(200) == nullptr);
  map.Clear();  // stamp 2, as on any map
  CHECK(map.Find(0) == nullptr);
  CHECK(FindOrInsert(&map, 0, 1).inserted && Has(map, 0, 1));
}

// Random FindOrInsert / Find / Clear sequences against std::unordered_map: small key ranges
// (mostly present keys), large ones (mostly absent) and any 32-bit key, through growth; the
// second phase of each starts 16 clears before the stamp wraps around.
void TestAgainstUnorderedMap() {
  std::mt19937 rng(20240611);
  const uint32_t ranges[] = {16, 300, 5000, 0};  // 0: any key
  for (uint32_t range : ranges) {
    for (int sequence = 0; sequence < 4; ++sequence) {
      Map32 map;
      std::unordered_map<uint32_t, uint32_t> want;
      const auto random_key = [&]() {
        return range ? static_cast<uint32_t>(rng() % range) : static_cast<uint32_t>(rng());
      };
      bool agree = true;
      for (int phase = 0; phase < 2; ++phase) {
        if (phase == 1) {  // near the wrap, with no growth left to reset the stamp
          map.set_stamp_for_testing(0xFFFFFFF0u);
          want.clear();
        }
        const int ops = 20000;
        for (int op = 0; op < ops && agree; ++op) {
          const int dice = static_cast<int>(rng() % 1000);
          if (dice < 4 + 4 * phase) {
            map.Clear();
            want.clear();
          } else if (dice < 600) {
            const uint32_t key = random_key(), value = rng();
            const Insert r = FindOrInsert(&map, key, value);
            const auto emplaced = want.emplace(key, value);
            agree &= r.inserted == emplaced.second && r.value == emplaced.first->second;
          } else {
            const uint32_t key = random_key();
            const uint32_t *found = map.Find(key);
            const auto it = want.find(key);
            agree &= it == want.end() ? found == nullptr
                                      : found != nullptr && *found == it->second;
          }
        }
        for (const auto &kv : want) agree &= Has(map, kv.first, kv.second);
      }
      CHECK(agree);
      if (!agree) std::printf("  (OpenMap and unordered_map differ: key range %u)\n", range);
    }
  }
}

// 64-bit keys (the drafting cache's (node, token) pairs): random inserts, updates through the
// returned pointer and finds against std::unordered_map, every key value ordinary (~0 and 0
// included); Clear() keeps the slots, Release() gives them back.
void TestWideKeys() {
  internal::OpenMap<uint64_t> map(16);
  CHECK(map.capacity_for_testing() == 16);
  std::unordered_map<uint64_t, uint32_t> want;
  std::mt19937_64 rng(7);
  bool agree = true;
  for (int i = 0; i < 20000; ++i) {
    uint64_t key = rng() % 5000 + (rng() % 3 == 0 ? (uint64_t(rng() % 4) << 32) : 0);
    if (i % 997 == 0) key = i % 2 ? ~uint64_t(0) : 0;
    bool inserted;
    uint32_t *value = map.FindOrInsert(key, static_cast<uint32_t>(i), &inserted);
    const bool fresh = want.emplace(key, static_cast<uint32_t>(i)).second;
    agree &= inserted == fresh && *value == want[key];
    if (!fresh && rng() % 2 == 0) {
      *value = static_cast<uint32_t>(i);
      want[key] = static_cast<uint32_t>(i);
    }
  }
  CHECK(agree);
  CHECK(map.size() == want.size());
  bool all = true;
  for (const auto &kv : want) all = all && map.Find(kv.first) != nullptr && *map.Find(kv.first) == kv.second;
  CHECK(all);
  CHECK(map.Find(uint64_t(1) << 40) == nullptr);
  const size_t grown = map.capacity_for_testing();
  CHECK(grown >= 2 * want.size());
  map.Clear();
  CHECK(map.size() == 0 && map.Find(want.begin()->first) == nullptr && map.capacity_for_testing() == grown);
  bool inserted;
  map.FindOrInsert(42, 7, &inserted);
  map.Release();
  CHECK(map.size() == 0 && map.Find(42) == nullptr && map.capacity_for_testing() == 16);
  CHECK(map.bytes() < grown * 16);
  CHECK(*map.FindOrInsert(42, 8, &inserted) == 8 && inserted);
}

}  // namespace

void TestOpenMap() {
  TestInsertFind();
  TestClear();
  TestGrowth();
  TestCollisions();
  TestStampWrap();
  TestAgainstUnorderedMap();
  TestWideKeys();
}

}  // namespace testing
}  // namespace latticekit
