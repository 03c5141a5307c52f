// Counting n-grams into sorted, hierarchical count tables, and merging such tables.
//
// The table of order k lists each distinct k-gram once as (prefix, word, count): prefix is the
// row of its first k - 1 words in the table of order k - 1 (0 for unigrams), word its last
// word. Rows are sorted by the key prefix * vocab_size + word, which is the lexicographic order
// of the n-grams because every lower table is sorted the same way (latticekit/lm/trie.py).
#ifndef LATTICEKIT_COUNTING_H_
#define LATTICEKIT_COUNTING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace latticekit {

struct CountTable {
  std::vector<int64_t> prefix;
  std::vector<int32_t> word;
  std::vector<int64_t> count;
  size_t size() const { return word.size(); }
};

// Counts every n-gram of orders 1..order of a stream of sentences written <s> w1 ... wn </s>
// back to back (the caller checks that shape), as OpenGrm's ngramcount does: an n-gram never
// extends past the eos word that ends its sentence. Returns order tables, some possibly empty.
// Throws InvalidArgument for an id outside [0, vocab_size), order < 1, or a stream of 2^32 ids
// or more.
std::vector<CountTable> CountStream(const int32_t *stream, size_t n, int order,
                                    int64_t vocab_size, int32_t eos);

// One run's table of one order: borrowed arrays, or, where a pointer is null, a raw file of
// native-endian values (int64 prefix, int32 word, int64 count) read front to back in blocks,
// so that merging spilled runs needs a few buffers, not the runs, in memory.
struct CountTableView {
  const int64_t *prefix = nullptr;
  const int32_t *word = nullptr;
  const int64_t *count = nullptr;
  std::string prefix_path, word_path, count_path;
  size_t size = 0;
};

// A row map (int64 per row): in memory, or a raw file where rows is null and path is set;
// neither means "none" (no prefix map for unigrams; no row map wanted at the highest order).
struct RowMap {
  int64_t *rows = nullptr;
  std::string path;
  size_t size = 0;
  bool present() const { return rows != nullptr || !path.empty(); }
};

// Where a merged table goes: files (every path set) or, with empty paths, *table.
struct CountTableOutput {
  std::string prefix_path, word_path, count_path;
  CountTable *table = nullptr;
};

// Merges the tables of one order of several runs, summing the counts of equal n-grams, in one
// pass over the sorted runs (no sort). prefix_maps[r] maps the rows of run r's table of the
// order below onto rows of the merged table below (-1: that row was dropped, and so is every
// n-gram extending it); absent for unigrams. Merged n-grams counted fewer than min_count times
// are dropped. row_maps[r], when present, receives the merged row of each row of run r (-1 if
// dropped). Returns the number of merged rows. Throws std::runtime_error if a file cannot be
// read or written.
size_t MergeCountOrder(const std::vector<CountTableView> &runs,
                       const std::vector<RowMap> &prefix_maps, int64_t vocab_size,
                       int64_t min_count, const std::vector<RowMap> &row_maps,
                       const CountTableOutput &output);

// Hands memory freed by counting threads back to the operating system: glibc keeps it in
// per-thread arenas otherwise (about 170 MB after counting 9M tokens in two threads). A no-op
// with other C libraries.
void ReleaseFreeMemory();

}  // namespace latticekit

#endif  // LATTICEKIT_COUNTING_H_
