#include "latticekit/counting.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "latticekit/errors.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace latticekit {
namespace {

// Sorts (key, value) pairs by key with a least-significant-digit radix sort, 11 bits a pass;
// passes where every key has the same digit are skipped. Stable. keys < 2^bits.
void RadixSortPairs(std::vector<uint64_t> *keys, std::vector<uint32_t> *values, int bits) {
  constexpr int kDigitBits = 11;
  constexpr size_t kBuckets = size_t{1} << kDigitBits;
  const size_t n = keys->size();
  std::vector<uint64_t> key_buffer(n);
  std::vector<uint32_t> value_buffer(n);
  std::vector<size_t> offsets(kBuckets);
  for (int shift = 0; shift < bits; shift += kDigitBits) {
    std::fill(offsets.begin(), offsets.end(), 0);
    const uint64_t *k = keys->data();
    for (size_t i = 0; i < n; ++i) ++offsets[(k[i] >> shift) & (kBuckets - 1)];
    if (n == 0 || offsets[(k[0] >> shift) & (kBuckets - 1)] == n) continue;
    size_t total = 0;
    for (size_t &o : offsets) {
      const size_t c = o;
      o = total;
      total += c;
    }
    const uint32_t *v = values->data();
    for (size_t i = 0; i < n; ++i) {
      const size_t at = offsets[(k[i] >> shift) & (kBuckets - 1)]++;
      key_buffer[at] = k[i];
      value_buffer[at] = v[i];
    }
    keys->swap(key_buffer);
    values->swap(value_buffer);
  }
}

int BitLength(uint64_t x) {
  int bits = 0;
  while (x) {
    ++bits;
    x >>= 1;
  }
  return bits;
}

}  // namespace

std::vector<CountTable> CountStream(const int32_t *stream, size_t n, int order,
                                    int64_t vocab_size, int32_t eos) {
  if (order < 1) throw InvalidArgument("order must be >= 1, got " + std::to_string(order));
  if (n >= std::numeric_limits<uint32_t>::max())
    throw InvalidArgument("a counted chunk must hold fewer than 2^32 ids");
  if (vocab_size < 1 || vocab_size > std::numeric_limits<int32_t>::max())
    throw InvalidArgument("vocab_size must be in [1, 2^31)");
  std::vector<CountTable> tables(order);
  // Unigrams: one bucket per word id.
  std::vector<int64_t> unigram(vocab_size, 0);
  for (size_t i = 0; i < n; ++i) {
    const int32_t w = stream[i];
    if (w < 0 || w >= vocab_size)
      throw InvalidArgument("word id " + std::to_string(w) + " is outside [0, " +
                            std::to_string(vocab_size) + ")");
    ++unigram[w];
  }
  std::vector<uint32_t> row_of_word(vocab_size, 0);
  CountTable &first = tables[0];
  for (int64_t w = 0; w < vocab_size; ++w) {
    if (!unigram[w]) continue;
    row_of_word[w] = static_cast<uint32_t>(first.size());
    first.prefix.push_back(0);
    first.word.push_back(static_cast<int32_t>(w));
    first.count.push_back(unigram[w]);
  }
  // active[j]: start of the j-th (k-1)-gram of the stream, row[j]: its row in table k - 1.
  std::vector<uint32_t> active(n), row(n);
  for (size_t i = 0; i < n; ++i) {
    active[i] = static_cast<uint32_t>(i);
    row[i] = row_of_word[stream[i]];
  }
  std::vector<uint64_t> keys;
  std::vector<uint32_t> slot;
  const uint64_t V = static_cast<uint64_t>(vocab_size);
  for (int k = 2; k <= order; ++k) {
    // A k-gram starts where a (k-1)-gram starts that does not end the sentence.
    size_t m = 0;
    keys.resize(active.size());
    for (size_t j = 0; j < active.size(); ++j) {
      const uint32_t start = active[j];
      if (stream[start + k - 2] == eos) continue;
      keys[m] = row[j] * V + static_cast<uint64_t>(stream[start + k - 1]);
      active[m] = start;
      ++m;
    }
    keys.resize(m);
    active.resize(m);
    if (m == 0) break;
    slot.resize(m);
    for (size_t j = 0; j < m; ++j) slot[j] = static_cast<uint32_t>(j);
    RadixSortPairs(&keys, &slot, BitLength(tables[k - 2].size() * V));
    CountTable &table = tables[k - 1];
    row.resize(m);
    for (size_t j = 0; j < m;) {
      size_t end = j + 1;
      while (end < m && keys[end] == keys[j]) ++end;
      const uint32_t r = static_cast<uint32_t>(table.size());
      table.prefix.push_back(static_cast<int64_t>(keys[j] / V));
      table.word.push_back(static_cast<int32_t>(keys[j] % V));
      table.count.push_back(static_cast<int64_t>(end - j));
      for (size_t i = j; i < end; ++i) row[slot[i]] = r;
      j = end;
    }
  }
  return tables;
}

CountTable MergeCountOrder(const std::vector<CountTableView> &runs,
                           const std::vector<const int64_t *> &prefix_rows, int64_t vocab_size,
                           int64_t min_count, const std::vector<int64_t *> &row_maps) {
  const size_t n_runs = runs.size();
  if (prefix_rows.size() != n_runs || row_maps.size() != n_runs)
    throw InvalidArgument("MergeCountOrder: one prefix map and one row map per run");
  constexpr int64_t kDone = std::numeric_limits<int64_t>::max();
  std::vector<size_t> cursor(n_runs, 0);
  std::vector<int64_t> head(n_runs, kDone);
  // Moves run r to its next row whose prefix survives, marking skipped rows as dropped.
  auto advance = [&](size_t r) {
    const CountTableView &run = runs[r];
    size_t &i = cursor[r];
    for (; i < run.size; ++i) {
      int64_t prefix = run.prefix[i];
      if (prefix_rows[r] != nullptr) prefix = prefix_rows[r][prefix];
      if (prefix < 0) {
        row_maps[r][i] = -1;
        continue;
      }
      head[r] = prefix * vocab_size + run.word[i];
      return;
    }
    head[r] = kDone;
  };
  size_t total = 0;
  for (size_t r = 0; r < n_runs; ++r) {
    total += runs[r].size;
    advance(r);
  }
  CountTable out;
  out.prefix.reserve(total / (n_runs ? n_runs : 1));
  out.word.reserve(total / (n_runs ? n_runs : 1));
  out.count.reserve(total / (n_runs ? n_runs : 1));
  while (true) {
    int64_t key = kDone;
    for (size_t r = 0; r < n_runs; ++r) key = std::min(key, head[r]);
    if (key == kDone) break;
    int64_t count = 0;
    for (size_t r = 0; r < n_runs; ++r)
      if (head[r] == key) count += runs[r].count[cursor[r]];
    const bool keep = count >= min_count;
    const int64_t merged_row = keep ? static_cast<int64_t>(out.size()) : -1;
    if (keep) {
      out.prefix.push_back(key / vocab_size);
      out.word.push_back(static_cast<int32_t>(key % vocab_size));
      out.count.push_back(count);
    }
    for (size_t r = 0; r < n_runs; ++r) {
      if (head[r] != key) continue;
      row_maps[r][cursor[r]] = merged_row;
      ++cursor[r];
      advance(r);
    }
  }
  return out;
}

void ReleaseFreeMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace latticekit
