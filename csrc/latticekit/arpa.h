// Reading ARPA back-off language models into flat per-order tables, and printing n-gram
// lines as OpenGrm's ngramprint --ARPA does.
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

// Reads only the header of the beginning of an ARPA text (commentary, \data\ and its
// 'ngram N=count' lines). Returns false when the text ends before the header does; throws
// ArpaError for a malformed header. On success counts[n - 1] is the announced count of order
// n, and *header_end the size of the header, the first section's header line included.
bool ParseArpaHeader(const char *data, size_t size, const std::string &path,
                     std::vector<int64_t> *counts, size_t *header_end);

// Appends the ARPA lines of n n-grams of order k to out, one "prob<TAB>w1 ... wk[<TAB>backoff]"
// line each, numbers printed with C's %.7g (NaN as "nan"). Word w is spelled by the bytes
// words[word_offsets[w] .. word_offsets[w + 1]); ids is row-major [n, k]; the back-off field
// is printed where show_backoff[i] is non-zero. Throws InvalidArgument for an id outside
// [0, num_words).
void FormatArpaLines(const char *words, const int64_t *word_offsets, size_t num_words,
                     const int32_t *ids, size_t n, int k, const double *log10_prob,
                     const double *log10_backoff, const uint8_t *show_backoff, std::string *out);

}  // namespace latticekit

#endif  // LATTICEKIT_ARPA_H_
