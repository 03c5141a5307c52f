// The binary model image: binding a model's views into its bytes, loading (mapping and
// checking) a file, and the structure checks shared with the builder.
#include "latticekit/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "latticekit/errors.h"
#include "latticekit/model_format.h"
#include "latticekit/storage.h"

namespace latticekit {

Model::Model() {
  static std::atomic<uint64_t> next_serial(1);
  serial_ = next_serial.fetch_add(1);
}
Model::~Model() = default;


void Model::BindViews() {
  const char *base = storage_->data();
  FileHeader h;
  std::memcpy(&h, base, sizeof(h));
  order_ = static_cast<int>(h.order);
  has_vocab_ = (h.flags & kFlagVocab) != 0;
  wide_words_ = (h.flags & kFlagWideWords) != 0;
  num_words_ = h.num_words;
  num_states_ = h.num_states;
  num_arcs_ = h.num_arcs;
  num_tokens_ = h.num_tokens;
  const uint64_t *off = h.section_offset;
  state_begin_ = reinterpret_cast<const uint64_t *>(base + off[kStateBegin]);
  states_ = reinterpret_cast<const StateRecord *>(base + off[kStates]);
  arcs_ = reinterpret_cast<const unsigned char *>(base + off[kArcs]);
  arc_stride_ = wide_words_ ? ArcRecords<uint32_t>::kStride : ArcRecords<uint16_t>::kStride;
  token_to_word_ = reinterpret_cast<const uint32_t *>(base + off[kTokenToWord]);
  text_begin_ = reinterpret_cast<const uint64_t *>(base + off[kTextBegin]);
  text_ = base + off[kText];
}

void Model::BuildFence() {
  const uint64_t n = (num_arcs_ + kFenceStride - 1) / kFenceStride;
  if (wide_words_) {
    fence32_.resize(n);
    for (uint64_t g = 0; g < n; ++g) fence32_[g] = Arcs32().word(static_cast<uint32_t>(g * kFenceStride));
  } else {
    fence16_.assign(n + kFencePadding, 0xFFFF);
    for (uint64_t g = 0; g < n; ++g) fence16_[g] = Arcs16().word(static_cast<uint32_t>(g * kFenceStride));
  }
  const uint64_t n_upper = (n + kFenceStride - 1) / kFenceStride;
  if (wide_words_) {
    upper32_.resize(n_upper);
    for (uint64_t g = 0; g < n_upper; ++g) upper32_[g] = fence32_[g * kFenceStride];
  } else {
    upper16_.assign(n_upper + kFencePadding, 0xFFFF);
    for (uint64_t g = 0; g < n_upper; ++g) upper16_[g] = fence16_[g * kFenceStride];
  }
}

uint64_t Model::count(int n) const {
  return (n < order_ ? state_begin_[n + 1] : num_arcs_ + 1) - state_begin_[n];
}

uint64_t Model::size_bytes() const { return storage_->size(); }

const char *Model::image() const { return storage_->data(); }

std::unique_ptr<Model> Model::Load(const std::string &path) {
  std::unique_ptr<ModelStorage> storage(ModelStorage::Map(path));
  const size_t size = storage->size();
  auto fail = [&](const std::string &what) -> ModelFileError {
    return ModelFileError(path + ": " + what);
  };
  if (size < sizeof(FileHeader) || std::memcmp(storage->data(), kMagic, 8) != 0)
    throw fail("not a latticekit binary model (bad magic); build one with NGramLM.save");
  FileHeader h;
  std::memcpy(&h, storage->data(), sizeof(h));
  if (h.endian_mark != kEndianMark) throw fail("written on a machine of other byte order");
  if (h.version != kVersion)
    throw fail("format version " + std::to_string(h.version) + ", this latticekit reads version " +
               std::to_string(kVersion) + "; rebuild it from the ARPA file");
  if (h.header_size != kHeaderSize || h.order < 1 || h.order > 255 ||
      (h.flags & ~(kFlagVocab | kFlagWideWords)) != 0 || h.num_words < 3 ||
      h.num_states < 1 || h.num_arcs < h.num_words || h.num_states > h.num_arcs + 1 ||
      h.num_arcs >= (uint64_t(1) << 32) - 2 || h.num_tokens > kMaxTokens ||
      h.text_bytes > size)
    throw fail("corrupted header");
  uint64_t offsets[kNumSections];
  const uint64_t expected_size = Layout(h, offsets);
  if (expected_size != h.file_size || std::memcmp(offsets, h.section_offset, sizeof(offsets)) != 0)
    throw fail("corrupted header (section table)");
  if (size < h.file_size)
    throw fail("truncated: " + std::to_string(size) + " bytes, expected " +
               std::to_string(h.file_size));
  if (size > h.file_size) throw fail("trailing bytes after the model");
  for (uint64_t i = sizeof(FileHeader); i < kHeaderSize; ++i)
    if (storage->data()[i] != 0) throw fail("corrupted header (padding)");
  if (Checksum64(storage->data() + kHeaderSize, size - kHeaderSize) != h.checksum)
    throw fail("checksum mismatch: the file is corrupted");
  std::unique_ptr<Model> model(new Model());
  model->storage_ = std::move(storage);
  model->BindViews();
  try {
    model->Validate();
  } catch (const ModelFileError &e) {
    throw fail(e.what());
  }
  model->BuildFence();
  return model;
}

void Model::Validate() {
  auto check = [](bool ok, const char *what) {
    if (!ok) throw ModelFileError(std::string("inconsistent model structure: ") + what);
  };
  // A file with a valid checksum may still be crafted: its values are checked too (in the
  // loops that read their records anyway), and their largest magnitudes recorded.
  auto check_value = [](float x, const char *what, uint64_t at) {
    if (!std::isfinite(x))
      throw ModelFileError(std::string("a ") + what + " is " + FormatValue(x) + " (at " + std::to_string(at) +
                           "); every model value must be finite");
  };
  float max_prob = 0, max_backoff = 0;
  check(state_begin_[0] == 0 && state_begin_[1] == 1, "state table");
  for (int n = 1; n <= order_; ++n) check(state_begin_[n] >= state_begin_[n - 1] && state_begin_[n] <= num_states_, "state table");
  check(state_begin_[order_] == num_states_, "state table");
  check(ArcBegin(0) == 0 && ArcEnd(0) == num_words_, "root arcs");
  for (uint64_t s = 0; s < num_states_; ++s) {
    check(ArcBegin(s) <= ArcEnd(s), "arc table");
    const float bo = BackoffWeight(static_cast<StateId>(s));
    check_value(bo, "back-off weight", s);
    max_backoff = std::max(max_backoff, std::fabs(bo));
  }
  check(states_[num_states_].arc_begin == num_arcs_, "arc table");
  check(states_[num_states_].backoff_weight == 0.0f && states_[num_states_].backoff_state == 0,
        "state table sentinel");
  for (int n = 1; n <= order_; ++n)
    check(ArcBegin(state_begin_[n - 1]) == state_begin_[n] - 1, "arcs per order");
  check(BackoffState(0) == 0 && BackoffWeight(0) == 0.0f, "back-off links");
  for (int n = 1; n < order_; ++n)
    for (uint64_t s = state_begin_[n]; s < state_begin_[n + 1]; ++s)
      check(BackoffState(s) < state_begin_[n], "back-off links");
  for (uint64_t s = 0; s < num_states_; ++s) {
    for (uint32_t a = ArcBegin(s); a < ArcEnd(s); ++a) {
      const uint64_t w = ArcWord(a);
      check(w < num_words_, "arc word");
      if (s == 0) check(w == a, "root arcs");
      if (a > ArcBegin(s)) check(ArcWord(a - 1) < w, "arc order");
      const float p = ArcLog10Prob(a);
      check_value(p, "log-probability", a);
      max_prob = std::max(max_prob, std::fabs(p));
    }
  }
  for (uint64_t t = 0; t < num_tokens_; ++t) check(token_to_word_[t] < num_words_, "token table");
  check(text_begin_[0] == 0, "word table");
  for (uint64_t w = 0; w < num_words_; ++w) check(text_begin_[w] <= text_begin_[w + 1], "word table");
  FileHeader h;
  std::memcpy(&h, storage_->data(), sizeof(h));
  check(text_begin_[num_words_] == h.text_bytes, "word table");
  max_abs_log10_prob_ = max_prob;
  max_abs_log10_backoff_ = max_backoff;
}

}  // namespace latticekit
