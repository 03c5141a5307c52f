#include "latticekit/trie.h"

#include <algorithm>
#include <vector>

namespace latticekit {

void LookupChildren(const int64_t *prefix, const int32_t *word, size_t n_rows, size_t n_parents,
                    const int64_t *query_parent, const int64_t *query_word, size_t n_queries,
                    int64_t *rows) {
  // first[p] .. first[p + 1]: the rows extending parent p (prefixes are sorted).
  std::vector<int64_t> first(n_parents + 1, 0);
  for (size_t i = 0; i < n_rows; ++i) {
    const int64_t p = prefix[i];
    if (p >= 0 && static_cast<size_t>(p) < n_parents) ++first[p + 1];
  }
  for (size_t p = 0; p < n_parents; ++p) first[p + 1] += first[p];
  for (size_t q = 0; q < n_queries; ++q) {
    const int64_t p = query_parent[q];
    const int64_t w = query_word[q];
    rows[q] = -1;
    if (p < 0 || static_cast<size_t>(p) >= n_parents) continue;
    const int32_t *begin = word + first[p];
    const int32_t *end = word + first[p + 1];
    const int32_t *at = std::lower_bound(begin, end, w, [](int32_t a, int64_t b) { return a < b; });
    if (at != end && *at == w) rows[q] = at - word;
  }
}

}  // namespace latticekit
