// Reading training corpora: lines of decimal token ids.
#ifndef LATTICEKIT_CORPUS_H_
#define LATTICEKIT_CORPUS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace latticekit {

// Parses a block of lines, each a sentence of decimal token ids separated by spaces or tabs
// (any of " \t\r\v\f"; lines end with '\n', the last one possibly without it). Appends the
// ids to *ids and the number of ids of every line (0 for a blank line) to *lengths; an id too
// large for int64 is stored as INT64_MAX. Returns 0, or the 1-based line, within the block, of
// the first line holding anything else (the caller words the error from that line).
size_t ParseIdLines(const char *data, size_t size, std::vector<int64_t> *ids,
                    std::vector<int64_t> *lengths);

}  // namespace latticekit

#endif  // LATTICEKIT_CORPUS_H_
