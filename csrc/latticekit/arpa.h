// Reading ARPA back-off language models into flat per-order tables.
#ifndef LATTICEKIT_ARPA_H_
#define LATTICEKIT_ARPA_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace latticekit {

// The n-grams of one order: ids index NGramTables::words, row-major [count, order].
struct OrderTable {
  std::vector<int32_t> ids;
  std::vector<float> log10_prob;
  std::vector<float> log10_backoff;
  std::vector<uint32_t> lines;  // source line of each n-gram, for error messages (0: none)
  size_t size() const { return log10_prob.size(); }
};

// A back-off model as its n-gram lists. words[i] is the spelling of word id i.
struct NGramTables {
  std::vector<std::string> words;
  std::vector<OrderTable> orders;  // orders[n - 1] holds the n-grams
};

// Parses ARPA text held in memory. path only labels error messages.
// Throws ArpaError naming the path and the 1-based line of the first problem.
NGramTables ParseArpa(const char *data, size_t size, const std::string &path);

}  // namespace latticekit

#endif  // LATTICEKIT_ARPA_H_
