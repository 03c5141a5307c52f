// The binary model file: its header and section layout, shared by the builder
// (model_build.cc), which lays out a fresh image, and the loader (model_format.cc), which
// maps a file and checks it. Private to the core: nothing outside csrc/ includes it.
#ifndef LATTICEKIT_MODEL_FORMAT_H_
#define LATTICEKIT_MODEL_FORMAT_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "latticekit/model.h"

namespace latticekit {

constexpr char kMagic[8] = {'L', 'T', 'K', 'N', 'G', 'R', 'A', 'M'};
constexpr uint32_t kVersion = 2;
constexpr uint64_t kEndianMark = 0x0102030405060708ULL;
constexpr uint64_t kMaxTokens = uint64_t(1) << 26;

enum Section {
  kStateBegin,     // uint64 [order + 1]
  kStates,         // StateRecord [num_states + 1]
  kArcs,           // ArcRecords<uint16 or uint32> [num_arcs]
  kTokenToWord,    // uint32 [num_tokens]
  kTextBegin,      // uint64 [num_words + 1]
  kText,           // char [text_bytes]
  kNumSections
};

struct FileHeader {
  char magic[8];
  uint64_t endian_mark;
  uint32_t version;
  uint32_t header_size;
  uint32_t order;
  uint32_t flags;
  uint64_t num_words, num_states, num_arcs, num_tokens, text_bytes;
  uint64_t section_offset[kNumSections];
  uint64_t file_size;
  uint64_t checksum;  // of bytes [header_size, file_size)
};
constexpr uint32_t kFlagVocab = 1;
constexpr uint32_t kFlagWideWords = 2;
constexpr uint64_t kHeaderSize = (sizeof(FileHeader) + 63) & ~uint64_t(63);

inline uint64_t AlignUp(uint64_t x) { return (x + 63) & ~uint64_t(63); }

// Offsets of each section for the given sizes; returns the file size.
inline uint64_t Layout(const FileHeader &h, uint64_t *offsets) {
  const uint64_t word_bytes = (h.flags & kFlagWideWords) ? 4 : 2;
  const uint64_t sizes[kNumSections] = {
      8 * (uint64_t(h.order) + 1), sizeof(StateRecord) * (h.num_states + 1),
      (word_bytes + 4) * h.num_arcs, 4 * h.num_tokens, 8 * (h.num_words + 1), h.text_bytes};
  uint64_t at = kHeaderSize;
  for (int i = 0; i < kNumSections; ++i) {
    offsets[i] = at;
    at = AlignUp(at + sizes[i]);
  }
  return at;
}

// A model value as error messages show it.
inline std::string FormatValue(float x) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", static_cast<double>(x));
  return buffer;
}

}  // namespace latticekit

#endif  // LATTICEKIT_MODEL_FORMAT_H_
