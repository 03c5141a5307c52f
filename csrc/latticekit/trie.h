// Lookups in the sorted n-gram tables of latticekit/ngram_trie.py (prefix row, word).
#ifndef LATTICEKIT_TRIE_H_
#define LATTICEKIT_TRIE_H_

#include <cstddef>
#include <cstdint>

namespace latticekit {

// For each query (parent row, word), the row of that n-gram in a table of n_rows n-grams
// sorted by (prefix, word) whose prefixes index a table of n_parents rows; -1 where the
// table lacks it or the parent is outside [0, n_parents).
void LookupChildren(const int64_t *prefix, const int32_t *word, size_t n_rows, size_t n_parents,
                    const int64_t *query_parent, const int64_t *query_word, size_t n_queries,
                    int64_t *rows);

}  // namespace latticekit

#endif  // LATTICEKIT_TRIE_H_
