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

// One run's table of one order, borrowed (memory-mapped .npy files are fine).
struct CountTableView {
  const int64_t *prefix = nullptr;
  const int32_t *word = nullptr;
  const int64_t *count = nullptr;
  size_t size = 0;
};

// Merges the tables of one order of several runs, summing the counts of equal n-grams.
// prefix_rows[r] maps the rows of run r's table of the order below onto rows of the merged
// table below (-1: that row was dropped, and so is every n-gram extending it); null for
// unigrams. Merged n-grams counted fewer than min_count times are dropped. row_maps[r] (one
// entry per row of runs[r]) receives the merged row of each row of run r, or -1 if dropped.
CountTable MergeCountOrder(const std::vector<CountTableView> &runs,
                           const std::vector<const int64_t *> &prefix_rows, int64_t vocab_size,
                           int64_t min_count, const std::vector<int64_t *> &row_maps);

// Hands memory freed by counting threads back to the operating system: glibc keeps it in
// per-thread arenas otherwise (about 170 MB after counting 9M tokens in two threads). A no-op
// with other C libraries.
void ReleaseFreeMemory();

}  // namespace latticekit

#endif  // LATTICEKIT_COUNTING_H_
