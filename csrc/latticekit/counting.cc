#include "latticekit/counting.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
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

namespace {

constexpr size_t kBlockValues = size_t{1} << 16;

std::FILE *OpenFile(const std::string &path, const char *mode) {
  std::FILE *file = std::fopen(path.c_str(), mode);
  if (file == nullptr) {
    const int err = errno;
    throw FileSystemError(path, err, std::string("cannot open: ") + std::strerror(err));
  }
  return file;
}

// Reads an array front to back (indices never decrease, gaps allowed): from memory, or from
// a raw file a block at a time.
template <typename T>
class SequentialReader {
 public:
  SequentialReader(const T *data, const std::string &path, size_t size)
      : data_(data), path_(path), size_(size) {
    if (data_ == nullptr && size_ > 0) file_ = OpenFile(path_, "rb");
  }
  ~SequentialReader() {
    if (file_ != nullptr) std::fclose(file_);
  }
  SequentialReader(const SequentialReader &) = delete;
  SequentialReader &operator=(const SequentialReader &) = delete;

  T operator[](size_t i) {
    if (data_ != nullptr) return data_[i];
    if (i < begin_ || i >= begin_ + buffer_.size()) Fill(i);
    return buffer_[i - begin_];
  }

 private:
  void Fill(size_t i) {
    if (i >= size_) throw std::logic_error("read past the end of " + path_);
    const size_t n = std::min(kBlockValues, size_ - i);
    // the file position is right after the buffer, unless nothing was read yet
    if (buffer_.empty() || i != begin_ + buffer_.size()) {
      if (std::fseek(file_, static_cast<long>(i * sizeof(T)), SEEK_SET) != 0)
        throw FileSystemError(path_, errno, "cannot seek");
    }
    buffer_.resize(n);
    if (std::fread(buffer_.data(), sizeof(T), n, file_) != n)
      throw FileSystemError(path_, std::ferror(file_) ? errno : 0, "cannot read (truncated?)");
    begin_ = i;
  }

  const T *data_;
  std::string path_;
  size_t size_;
  std::FILE *file_ = nullptr;
  std::vector<T> buffer_;
  size_t begin_ = 0;
};

// Appends values to a vector, or to a raw file through a block buffer.
template <typename T>
class Appender {
 public:
  Appender(std::vector<T> *values, const std::string &path) : values_(values), path_(path) {
    if (values_ == nullptr) {
      file_ = OpenFile(path_, "wb");
      buffer_.reserve(kBlockValues);
    }
  }
  ~Appender() {
    if (file_ != nullptr) std::fclose(file_);
  }
  Appender(const Appender &) = delete;
  Appender &operator=(const Appender &) = delete;

  void Push(T value) {
    if (values_ != nullptr) {
      values_->push_back(value);
      return;
    }
    buffer_.push_back(value);
    if (buffer_.size() == kBlockValues) Flush();
  }
  void Close() {
    if (file_ == nullptr) return;
    Flush();
    if (std::fclose(file_) != 0) {
      file_ = nullptr;
      throw FileSystemError(path_, errno, std::string("cannot write: ") + std::strerror(errno));
    }
    file_ = nullptr;
  }

 private:
  void Flush() {
    if (std::fwrite(buffer_.data(), sizeof(T), buffer_.size(), file_) != buffer_.size())
      throw FileSystemError(path_, errno, std::string("cannot write: ") + std::strerror(errno));
    buffer_.clear();
  }

  std::vector<T> *values_;
  std::string path_;
  std::FILE *file_ = nullptr;
  std::vector<T> buffer_;
};

// Writes a row map in memory (random access is not needed: rows are written in order).
class RowMapWriter {
 public:
  explicit RowMapWriter(const RowMap &map) : map_(map) {
    if (map_.rows == nullptr && !map_.path.empty())
      appender_ = std::make_unique<Appender<int64_t>>(nullptr, map_.path);
  }
  void Set(size_t i, int64_t row) {
    if (map_.rows != nullptr) {
      map_.rows[i] = row;
    } else if (appender_) {
      appender_->Push(row);  // called for every row, in order
    }
  }
  void Close() {
    if (appender_) appender_->Close();
  }

 private:
  RowMap map_;
  std::unique_ptr<Appender<int64_t>> appender_;
};

}  // namespace

size_t MergeCountOrder(const std::vector<CountTableView> &runs,
                       const std::vector<RowMap> &prefix_maps, int64_t vocab_size,
                       int64_t min_count, const std::vector<RowMap> &row_maps,
                       const CountTableOutput &output) {
  const size_t n_runs = runs.size();
  if (prefix_maps.size() != n_runs || row_maps.size() != n_runs)
    throw InvalidArgument("MergeCountOrder: one prefix map and one row map per run");
  const bool to_files = output.table == nullptr;
  if (to_files && (output.prefix_path.empty() || output.word_path.empty() ||
                   output.count_path.empty()))
    throw InvalidArgument("MergeCountOrder: give an output table or three output files");
  std::vector<std::unique_ptr<SequentialReader<int64_t>>> prefix, count, prefix_map;
  std::vector<std::unique_ptr<SequentialReader<int32_t>>> word;
  std::vector<std::unique_ptr<RowMapWriter>> row_map;
  for (size_t r = 0; r < n_runs; ++r) {
    const CountTableView &run = runs[r];
    prefix.push_back(std::make_unique<SequentialReader<int64_t>>(run.prefix, run.prefix_path, run.size));
    word.push_back(std::make_unique<SequentialReader<int32_t>>(run.word, run.word_path, run.size));
    count.push_back(std::make_unique<SequentialReader<int64_t>>(run.count, run.count_path, run.size));
    const RowMap &map = prefix_maps[r];
    prefix_map.push_back(map.present() ? std::make_unique<SequentialReader<int64_t>>(
                                             map.rows, map.path, map.size)
                                       : nullptr);
    row_map.push_back(std::make_unique<RowMapWriter>(row_maps[r]));
  }
  CountTable *table = output.table;
  Appender<int64_t> out_prefix(to_files ? nullptr : &table->prefix, output.prefix_path);
  Appender<int32_t> out_word(to_files ? nullptr : &table->word, output.word_path);
  Appender<int64_t> out_count(to_files ? nullptr : &table->count, output.count_path);

  constexpr int64_t kDone = std::numeric_limits<int64_t>::max();
  std::vector<size_t> cursor(n_runs, 0);
  std::vector<int64_t> head(n_runs, kDone);
  // Moves run r to its next row whose prefix survives, marking skipped rows as dropped.
  auto advance = [&](size_t r) {
    size_t &i = cursor[r];
    for (; i < runs[r].size; ++i) {
      int64_t p = (*prefix[r])[i];
      if (prefix_map[r]) p = (*prefix_map[r])[p];
      if (p < 0) {
        row_map[r]->Set(i, -1);
        continue;
      }
      head[r] = p * vocab_size + (*word[r])[i];
      return;
    }
    head[r] = kDone;
  };
  for (size_t r = 0; r < n_runs; ++r) advance(r);
  size_t merged = 0;
  while (true) {
    int64_t key = kDone;
    for (size_t r = 0; r < n_runs; ++r) key = std::min(key, head[r]);
    if (key == kDone) break;
    int64_t total = 0;
    for (size_t r = 0; r < n_runs; ++r)
      if (head[r] == key) total += (*count[r])[cursor[r]];
    const bool keep = total >= min_count;
    const int64_t merged_row = keep ? static_cast<int64_t>(merged) : -1;
    if (keep) {
      out_prefix.Push(key / vocab_size);
      out_word.Push(static_cast<int32_t>(key % vocab_size));
      out_count.Push(total);
      ++merged;
    }
    for (size_t r = 0; r < n_runs; ++r) {
      if (head[r] != key) continue;
      row_map[r]->Set(cursor[r], merged_row);
      ++cursor[r];
      advance(r);
    }
  }
  out_prefix.Close();
  out_word.Close();
  out_count.Close();
  for (auto &map : row_map) map->Close();
  return merged;
}

void ReleaseFreeMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace latticekit
