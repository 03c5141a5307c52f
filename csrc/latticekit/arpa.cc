#include "latticekit/arpa.h"

#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <unordered_map>

#include "latticekit/errors.h"

namespace latticekit {
namespace {

// Walks the buffer line by line, counting lines for error messages.
class LineReader {
 public:
  // partial: the text is the beginning of a longer one, so a last line without its newline
  // may be cut short and is not returned.
  LineReader(const char *data, size_t size, bool partial)
      : begin_(data), p_(data), end_(data + size), partial_(partial) {}

  bool Next(std::string_view *line) {
    if (p_ >= end_) return false;
    const char *start = p_;
    while (p_ < end_ && *p_ != '\n') ++p_;
    if (partial_ && p_ == end_) return false;
    const char *stop = p_;
    if (p_ < end_) ++p_;  // skip '\n'
    if (stop > start && stop[-1] == '\r') --stop;
    *line = std::string_view(start, stop - start);
    ++number_;
    return true;
  }
  long number() const { return number_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  size_t offset() const { return static_cast<size_t>(p_ - begin_); }

 private:
  const char *begin_;
  const char *p_;
  const char *end_;
  bool partial_;
  long number_ = 0;
};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// Splits on runs of blanks into at most max_fields fields; returns the count, or
// max_fields + 1 when there are more.
size_t Split(std::string_view s, std::string_view *fields, size_t max_fields) {
  size_t n = 0;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && IsSpace(s[i])) ++i;
    if (i >= s.size()) break;
    size_t j = i;
    while (j < s.size() && !IsSpace(s[j])) ++j;
    if (n == max_fields) return max_fields + 1;
    fields[n++] = s.substr(i, j - i);
    i = j;
  }
  return n;
}

// Thrown instead of "file ends early" when the parser reads the beginning of a text.
struct NeedMoreText {};

class ArpaParser {
 public:
  ArpaParser(const char *data, size_t size, const std::string &path, bool partial = false)
      : reader_(data, size, partial), path_(path), partial_(partial) {}

  // The header alone: false when the text ends before it does (partial parsers only).
  bool ParseHeader(std::vector<int64_t> *counts, size_t *header_lines_end) {
    try {
      ReadHeader();
    } catch (const NeedMoreText &) {
      return false;
    }
    counts->assign(counts_.begin(), counts_.end());
    *header_lines_end = reader_.offset();
    return true;
  }

  NGramTables Parse() {
    ReadHeader();
    tables_.orders.resize(counts_.size());
    for (size_t n = 1; n <= counts_.size(); ++n) ReadSection(n);
    ExpectEnd();
    tables_.words.reserve(word_ids_.size());
    for (std::string_view w : spellings_) tables_.words.emplace_back(w);
    return std::move(tables_);
  }

 private:
  [[noreturn]] void Fail(const std::string &what) { throw ArpaError(path_, reader_.number(), what); }
  [[noreturn]] void FailEof(const std::string &what) {
    if (partial_) throw NeedMoreText();
    throw ArpaError(path_, 0, "file ends early: " + what);
  }

  // Next line that is not blank; false at end of file.
  bool NextNonBlank(std::string_view *line) {
    while (reader_.Next(line)) {
      *line = Trim(*line);
      if (!line->empty()) return true;
    }
    return false;
  }

  void ReadHeader() {
    std::string_view line;
    // Anything before \data\ is commentary (SRILM and others write some).
    while (true) {
      if (!reader_.Next(&line)) FailEof("no \\data\\ section");
      if (Trim(line) == "\\data\\") break;
    }
    while (true) {
      if (!NextNonBlank(&line)) FailEof("the \\data\\ section is not followed by n-gram sections");
      if (line.substr(0, 5) != "ngram") break;
      std::string_view rest = Trim(line.substr(5));
      size_t eq = rest.find('=');
      if (eq == std::string_view::npos) Fail("expected 'ngram N=count', got '" + std::string(line) + "'");
      long order = ParseCount(Trim(rest.substr(0, eq)), line);
      long count = ParseCount(Trim(rest.substr(eq + 1)), line);
      if (order != static_cast<long>(counts_.size()) + 1)
        Fail("n-gram orders in the header must be 1, 2, 3, ... in turn; got order " +
             std::to_string(order) + " after " + std::to_string(counts_.size()));
      if (order > 255) Fail("order " + std::to_string(order) + " is larger than 255");
      counts_.push_back(count);
      count_lines_.push_back(reader_.number());
    }
    if (counts_.empty()) Fail("the \\data\\ section lists no 'ngram N=count' line");
    if (!partial_) CheckCountsFit();
    pending_ = line;  // the first section header, already read
    has_pending_ = true;
  }

  // The header's counts are believed only as far as the rest of the file can hold them, so
  // that a forged count cannot make the sections reserve more than the file's size: an
  // n-gram line of order n has n + 1 fields of at least one byte, each followed by a blank
  // or a newline (the last one too: the \end\ line follows).
  void CheckCountsFit() {
    const uint64_t left = reader_.remaining();  // after the first section's header line
    uint64_t need = 0;
    for (size_t n = 1; n <= counts_.size(); ++n) {
      const uint64_t per_line = 2 * (n + 1);
      const uint64_t count = static_cast<uint64_t>(counts_[n - 1]);
      if (count > left / per_line || (need += count * per_line) > left)
        throw ArpaError(path_, count_lines_[n - 1],
                        "the header announces " + std::to_string(count) + " " + std::to_string(n) +
                            "-grams, more than the rest of the file (" + std::to_string(left) +
                            " bytes) can hold");
    }
  }

  long ParseCount(std::string_view s, std::string_view line) {
    long value = -1;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || ptr != s.data() + s.size() || value < 0)
      Fail("expected 'ngram N=count' with non-negative integers, got '" + std::string(line) + "'");
    return value;
  }

  float ParseNumber(std::string_view s, const char *what) {
    double value = 0;
    const char *begin = s.data();
    const char *end = s.data() + s.size();
    if (begin != end && *begin == '+') ++begin;
    auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc::result_out_of_range) {
      // Denormal or huge magnitude: fall back to strtod's saturating reading.
      value = std::strtod(std::string(s).c_str(), nullptr);
    } else if (ec != std::errc() || ptr != end) {
      Fail(std::string("cannot parse ") + what + " '" + std::string(s) + "'");
    }
    // Beyond float32's range is +-inf (converting such a double to float is undefined);
    // what a value may be is the model builder's to say (model_build.cc, CheckValues).
    if (value > FLT_MAX) return HUGE_VALF;
    if (value < -FLT_MAX) return -HUGE_VALF;
    return static_cast<float>(value);
  }

  int32_t WordId(std::string_view w) {
    auto it = word_ids_.find(w);
    if (it != word_ids_.end()) return it->second;
    int32_t id = static_cast<int32_t>(spellings_.size());
    word_ids_.emplace(w, id);
    spellings_.push_back(w);
    return id;
  }

  void ReadSection(size_t order) {
    std::string_view line;
    if (has_pending_) {
      line = pending_;
      has_pending_ = false;
    } else if (!NextNonBlank(&line)) {
      FailEof("missing the \\" + std::to_string(order) + "-grams: section");
    }
    std::string expected = "\\" + std::to_string(order) + "-grams:";
    if (line != expected) Fail("expected '" + expected + "', got '" + std::string(line) + "'");

    OrderTable &table = tables_.orders[order - 1];
    const size_t count = static_cast<size_t>(counts_[order - 1]);
    table.ids.reserve(count * order);
    table.log10_prob.reserve(count);
    table.log10_backoff.reserve(count);
    table.lines.reserve(count);
    std::string_view fields[258];
    const size_t max_fields = order + 2;
    for (size_t i = 0; i < count; ++i) {
      if (!NextNonBlank(&line))
        FailEof("the \\" + std::to_string(order) + "-grams: section has " + std::to_string(i) +
                " entries but the header announces " + std::to_string(count));
      if (line.front() == '\\')
        Fail("the \\" + std::to_string(order) + "-grams: section has " + std::to_string(i) +
             " entries but the header announces " + std::to_string(count));
      size_t n = Split(line, fields, max_fields);
      if (n < order + 1 || n > order + 2)
        Fail("a " + std::to_string(order) + "-gram line needs a log-probability, " +
             std::to_string(order) + " words and an optional back-off weight; got " +
             (n > max_fields ? std::string("more fields") : std::to_string(n) + " fields"));
      float prob = ParseNumber(fields[0], "log-probability");
      float backoff = n == order + 2 ? ParseNumber(fields[order + 1], "back-off weight") : 0.0f;
      for (size_t k = 0; k < order; ++k) table.ids.push_back(WordId(fields[1 + k]));
      table.log10_prob.push_back(prob);
      table.log10_backoff.push_back(backoff);
      table.lines.push_back(static_cast<uint32_t>(reader_.number()));
    }
  }

  void ExpectEnd() {
    std::string_view line;
    if (!NextNonBlank(&line)) FailEof("missing \\end\\");
    if (line == "\\end\\") return;
    if (line.front() == '\\')
      Fail("expected \\end\\ after the " + std::to_string(counts_.size()) + "-grams, got '" +
           std::string(line) + "'");
    Fail("the \\" + std::to_string(counts_.size()) +
         "-grams: section has more entries than the header announces");
  }

  LineReader reader_;
  const std::string &path_;
  bool partial_;
  std::vector<long> counts_;
  std::vector<long> count_lines_;  // the line of each 'ngram N=count'
  std::string_view pending_;
  bool has_pending_ = false;
  std::unordered_map<std::string_view, int32_t> word_ids_;
  std::vector<std::string_view> spellings_;
  NGramTables tables_;
};

}  // namespace

NGramTables ParseArpa(const char *data, size_t size, const std::string &path) {
  return ArpaParser(data, size, path).Parse();
}

bool ParseArpaHeader(const char *data, size_t size, const std::string &path,
                     std::vector<int64_t> *counts, size_t *header_end) {
  return ArpaParser(data, size, path, /*partial=*/true).ParseHeader(counts, header_end);
}

namespace {

// Appends x as C's "%.7g" prints it, except that every NaN prints as "nan" (Python's way).
void AppendNumber(double x, std::string *out) {
  if (std::isnan(x)) {
    out->append("nan");
    return;
  }
  char buffer[32];
  const int length = std::snprintf(buffer, sizeof buffer, "%.7g", x);
  out->append(buffer, length);
}

}  // namespace

void FormatArpaLines(const char *words, const int64_t *word_offsets, size_t num_words,
                     const int32_t *ids, size_t n, int k, const double *log10_prob,
                     const double *log10_backoff, const uint8_t *show_backoff, std::string *out) {
  out->reserve(out->size() + n * (16 + 8 * static_cast<size_t>(k)));
  for (size_t i = 0; i < n; ++i) {
    AppendNumber(log10_prob[i], out);
    out->push_back('\t');
    for (int j = 0; j < k; ++j) {
      const int32_t w = ids[i * k + j];
      if (w < 0 || static_cast<size_t>(w) >= num_words)
        throw InvalidArgument("n-gram word id " + std::to_string(w) + " is outside the word table");
      if (j) out->push_back(' ');
      out->append(words + word_offsets[w], word_offsets[w + 1] - word_offsets[w]);
    }
    if (show_backoff[i]) {
      out->push_back('\t');
      AppendNumber(log10_backoff[i], out);
    }
    out->push_back('\n');
  }
}

}  // namespace latticekit
