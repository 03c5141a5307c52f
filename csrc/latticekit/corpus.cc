#include "latticekit/corpus.h"

#include <limits>

namespace latticekit {

size_t ParseIdLines(const char *data, size_t size, std::vector<int64_t> *ids,
                    std::vector<int64_t> *lengths) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  size_t line = 1;
  int64_t in_line = 0;
  const char *p = data;
  const char *end = data + size;
  while (p < end) {
    const unsigned char c = static_cast<unsigned char>(*p);
    if (c >= '0' && c <= '9') {
      int64_t value = 0;
      for (; p < end && *p >= '0' && *p <= '9'; ++p) {
        const int digit = *p - '0';
        value = value > (kMax - digit) / 10 ? kMax : value * 10 + digit;
      }
      ids->push_back(value);
      ++in_line;
    } else if (c == '\n') {
      lengths->push_back(in_line);
      in_line = 0;
      ++line;
      ++p;
    } else if (c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f') {
      ++p;
    } else {
      return line;
    }
  }
  if (size > 0 && data[size - 1] != '\n') lengths->push_back(in_line);
  return 0;
}

}  // namespace latticekit
