// Model::Build: compiles parsed n-gram tables (arpa.h) into a model image.
#include "latticekit/model.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "latticekit/errors.h"
#include "latticekit/model_format.h"
#include "latticekit/storage.h"

namespace latticekit {
namespace {

constexpr float kMissingUnkLog10 = -100.0f;  // what KenLM substitutes when <unk> is absent
constexpr float kZeroProbLog10 = -99.0f;     // a zero probability (-inf), as SRILM writes it

bool ParseTokenId(const std::string &s, uint64_t *id) {
  if (s.empty() || s.size() > 10) return false;
  if (s.size() > 1 && s[0] == '0') return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *id = v;
  return true;
}

// The n-grams of one order during the build, in internal word ids.
struct BuildOrder {
  std::vector<WordId> ids;  // [count, n]
  std::vector<float> prob, backoff;
  std::vector<uint32_t> line;
  std::vector<uint8_t> filler;  // prefix added because a higher order needed it
  size_t size() const { return prob.size(); }
};

int LexCompare(const WordId *a, const WordId *b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  }
  return 0;
}

void SortLexicographically(BuildOrder *order, size_t n, int bits) {
  const size_t count = order->size();
  std::vector<uint32_t> perm(count);
  std::iota(perm.begin(), perm.end(), 0u);
  const WordId *ids = order->ids.data();
  if (n * bits <= 64) {
    std::vector<std::pair<uint64_t, uint32_t>> keys(count);
    for (size_t i = 0; i < count; ++i) {
      uint64_t key = 0;
      for (size_t k = 0; k < n; ++k) key = (key << bits) | ids[i * n + k];
      keys[i] = {key, static_cast<uint32_t>(i)};
    }
    std::sort(keys.begin(), keys.end());
    for (size_t i = 0; i < count; ++i) perm[i] = keys[i].second;
  } else {
    std::sort(perm.begin(), perm.end(), [ids, n](uint32_t a, uint32_t b) {
      return LexCompare(ids + size_t(a) * n, ids + size_t(b) * n, n) < 0;
    });
  }
  BuildOrder sorted;
  sorted.ids.resize(order->ids.size());
  sorted.prob.resize(count);
  sorted.backoff.resize(count);
  sorted.line.resize(count);
  sorted.filler.resize(count);
  for (size_t i = 0; i < count; ++i) {
    uint32_t j = perm[i];
    std::copy_n(ids + size_t(j) * n, n, sorted.ids.data() + i * n);
    sorted.prob[i] = order->prob[j];
    sorted.backoff[i] = order->backoff[j];
    sorted.line[i] = order->line[j];
    sorted.filler[i] = order->filler[j];
  }
  *order = std::move(sorted);
}

}  // namespace

class ModelBuilder {
 public:
  ModelBuilder(NGramTables tables, const std::vector<std::string> &vocab, bool has_vocab,
               const std::string &source)
      : tables_(std::move(tables)), vocab_(vocab), has_vocab_(has_vocab), source_(source) {}

  std::unique_ptr<Model> Build() {
    order_ = static_cast<int>(tables_.orders.size());
    if (order_ < 1) throw ArpaError(source_, 0, "the model has no n-grams");
    AssignWordIds();
    ConvertOrders();
    for (int n = 1; n <= order_; ++n) {
      CheckValues(n);
      SortLexicographically(&orders_[n - 1], n, bits_);
      CheckDuplicates(n);
    }
    for (int n = order_; n >= 2; --n) AddMissingPrefixes(n);
    Allocate();
    PlaceArcs();
    LinkBackoffStates();
    FillPrefixProbabilities();
    FillTokensAndText();
    FileHeader *h = reinterpret_cast<FileHeader *>(model_->storage_->mutable_data());
    h->checksum = Checksum64(model_->storage_->data() + kHeaderSize, h->file_size - kHeaderSize);
    model_->Validate();  // never throws (CheckValues); records the values' maxima
    model_->BuildFence();
    return std::move(model_);
  }

 private:
  [[noreturn]] void Fail(uint32_t line, const std::string &what) {
    throw ArpaError(source_, line, what);
  }

  std::string Spell(const WordId *ids, size_t n) {
    std::string s;
    for (size_t k = 0; k < n; ++k) {
      if (k) s += ' ';
      s += words_[ids[k]];
    }
    return s;
  }

  void AssignWordIds() {
    const OrderTable &unigrams = tables_.orders[0];
    const size_t num_parsed = tables_.words.size();
    std::vector<int64_t> unigram_of(num_parsed, -1);
    for (size_t i = 0; i < unigrams.size(); ++i) {
      int32_t w = unigrams.ids[i];
      if (unigram_of[w] >= 0)
        Fail(unigrams.lines.empty() ? 0 : unigrams.lines[i],
             "duplicate 1-gram '" + tables_.words[w] + "'");
      unigram_of[w] = static_cast<int64_t>(i);
    }
    // Every word of a higher order must be a unigram.
    for (size_t n = 2; n <= tables_.orders.size(); ++n) {
      const OrderTable &t = tables_.orders[n - 1];
      for (size_t i = 0; i < t.ids.size(); ++i) {
        if (unigram_of[t.ids[i]] < 0)
          Fail(t.lines.empty() ? 0 : t.lines[i / n],
               "word '" + tables_.words[t.ids[i]] + "' of a " + std::to_string(n) +
                   "-gram is not among the 1-grams");
      }
    }
    auto find = [&](const char *w) -> int64_t {
      for (size_t i = 0; i < num_parsed; ++i)
        if (tables_.words[i] == w && unigram_of[i] >= 0) return static_cast<int64_t>(i);
      return -1;
    };
    int64_t unk = find("<unk>"), bos = find("<s>"), eos = find("</s>");
    if (bos < 0) Fail(0, "the model has no <s> 1-gram (KenLM requires it too)");
    if (eos < 0) Fail(0, "the model has no </s> 1-gram (KenLM requires it too)");
    // Internal order: <unk>, <s>, </s>, then decimal token ids ascending, then other words.
    std::vector<uint32_t> rest;
    for (size_t i = 0; i < num_parsed; ++i) {
      if (unigram_of[i] < 0 || int64_t(i) == unk || int64_t(i) == bos || int64_t(i) == eos)
        continue;
      rest.push_back(static_cast<uint32_t>(i));
    }
    std::vector<uint64_t> numeric(num_parsed, std::numeric_limits<uint64_t>::max());
    for (uint32_t i : rest) {
      uint64_t id;
      if (ParseTokenId(tables_.words[i], &id)) numeric[i] = id;
    }
    std::sort(rest.begin(), rest.end(), [&](uint32_t a, uint32_t b) {
      if (numeric[a] != numeric[b]) return numeric[a] < numeric[b];
      return tables_.words[a] < tables_.words[b];
    });
    remap_.assign(num_parsed, 0);
    words_.clear();
    unigram_source_.clear();
    auto add = [&](int64_t parsed, const std::string &text) {
      if (parsed >= 0) remap_[parsed] = static_cast<WordId>(words_.size());
      words_.push_back(text);
      unigram_source_.push_back(parsed >= 0 ? unigram_of[parsed] : -1);
    };
    add(unk, "<unk>");
    add(bos, "<s>");
    add(eos, "</s>");
    for (uint32_t i : rest) add(i, tables_.words[i]);
    num_words_ = words_.size();
    if (num_words_ >= (uint64_t(1) << 32) - 1) Fail(0, "too many words");
    bits_ = 1;
    while ((uint64_t(1) << bits_) < num_words_) ++bits_;
  }

  void ConvertOrders() {
    orders_.resize(order_);
    // Unigrams in internal word order; <unk> is added when the file lacks it.
    BuildOrder &uni = orders_[0];
    const OrderTable &src = tables_.orders[0];
    for (WordId w = 0; w < num_words_; ++w) {
      int64_t i = unigram_source_[w];
      uni.ids.push_back(w);
      uni.prob.push_back(i >= 0 ? src.log10_prob[i] : kMissingUnkLog10);
      uni.backoff.push_back(i >= 0 ? src.log10_backoff[i] : 0.0f);
      uni.line.push_back(i >= 0 && !src.lines.empty() ? src.lines[i] : 0);
      uni.filler.push_back(0);
    }
    for (int n = 2; n <= order_; ++n) {
      OrderTable &t = tables_.orders[n - 1];
      BuildOrder &o = orders_[n - 1];
      o.ids.resize(t.ids.size());
      for (size_t i = 0; i < t.ids.size(); ++i) o.ids[i] = remap_[t.ids[i]];
      o.prob = std::move(t.log10_prob);
      o.backoff = std::move(t.log10_backoff);
      o.line = t.lines.empty() ? std::vector<uint32_t>(o.prob.size(), 0) : std::move(t.lines);
      o.filler.assign(o.prob.size(), 0);
      t = OrderTable();
    }
  }

  // What a model value may be, whatever the source (ARPA, n-gram tables, FST): a
  // log-probability is <= 0, and -inf (probability zero; also any value below float32's
  // range, such as -1e39 or -1e999) is stored as kZeroProbLog10 so that every path keeps a
  // finite score; NaN or positive ones are refused. Back-off weights must be finite.
  void CheckValues(int n) {
    BuildOrder &o = orders_[n - 1];
    for (size_t i = 0; i < o.size(); ++i) {
      float &prob = o.prob[i];
      const float backoff = o.backoff[i];
      if (prob <= 0 && std::isfinite(backoff)) {
        if (std::isinf(prob)) prob = kZeroProbLog10;
        continue;
      }
      std::string problem;
      if (std::isnan(prob)) {
        problem = "log-probability is NaN";
      } else if (prob > 0) {
        problem = "log-probability " + FormatValue(prob) + " is positive";
      } else if (std::isnan(backoff)) {
        problem = "back-off weight is NaN";
      } else {
        problem = std::string("back-off weight is ") + (backoff > 0 ? "+" : "-") +
                  "inf (or beyond float32's range, ~3.4e38)";
      }
      Fail(o.line[i], problem + " in " + std::to_string(n) + "-gram '" + Spell(&o.ids[i * n], n) + "'");
    }
  }

  void CheckDuplicates(int n) {
    const BuildOrder &o = orders_[n - 1];
    for (size_t i = 1; i < o.size(); ++i) {
      if (LexCompare(&o.ids[(i - 1) * n], &o.ids[i * n], n) == 0)
        Fail(std::max(o.line[i - 1], o.line[i]),
             "duplicate " + std::to_string(n) + "-gram '" + Spell(&o.ids[i * n], n) + "'");
    }
  }

  // ARPA files may hold an n-gram whose prefix is missing (after some pruning tools). The
  // prefix is added with the probability that back-off gives it and back-off weight 0,
  // which leaves every score unchanged and makes every history a state.
  void AddMissingPrefixes(int n) {
    BuildOrder &high = orders_[n - 1];
    BuildOrder &low = orders_[n - 2];
    const size_t m = n - 1;
    BuildOrder missing;
    size_t j = 0;
    for (size_t i = 0; i < high.size(); ++i) {
      const WordId *prefix = &high.ids[i * n];
      if (i > 0 && LexCompare(&high.ids[(i - 1) * n], prefix, m) == 0) continue;
      while (j < low.size() && LexCompare(&low.ids[j * m], prefix, m) < 0) ++j;
      if (j < low.size() && LexCompare(&low.ids[j * m], prefix, m) == 0) continue;
      missing.ids.insert(missing.ids.end(), prefix, prefix + m);
      missing.prob.push_back(std::numeric_limits<float>::quiet_NaN());
      missing.backoff.push_back(0.0f);
      missing.line.push_back(high.line[i]);
      missing.filler.push_back(1);
    }
    if (missing.size() == 0) return;
    if (m == 1) Fail(missing.line[0], "internal: a unigram prefix is missing");
    BuildOrder merged;
    size_t a = 0, b = 0;
    auto take = [&](BuildOrder &from, size_t &k) {
      merged.ids.insert(merged.ids.end(), &from.ids[k * m], &from.ids[k * m] + m);
      merged.prob.push_back(from.prob[k]);
      merged.backoff.push_back(from.backoff[k]);
      merged.line.push_back(from.line[k]);
      merged.filler.push_back(from.filler[k]);
      ++k;
    };
    while (a < low.size() || b < missing.size()) {
      if (b == missing.size() ||
          (a < low.size() && LexCompare(&low.ids[a * m], &missing.ids[b * m], m) < 0))
        take(low, a);
      else
        take(missing, b);
    }
    low = std::move(merged);
    num_fillers_ += missing.size();
  }

  void Allocate() {
    counts_.resize(order_);
    for (int n = 1; n <= order_; ++n) counts_[n - 1] = orders_[n - 1].size();
    num_states_ = 1;
    for (int n = 1; n < order_; ++n) num_states_ += counts_[n - 1];
    num_arcs_ = num_states_ - 1 + counts_[order_ - 1];
    if (num_arcs_ >= (uint64_t(1) << 32) - 2)
      Fail(0, "the model has " + std::to_string(num_arcs_) +
                  " n-grams; at most 4,294,967,293 are supported");
    if (has_vocab_) {
      num_tokens_ = vocab_.size();
    } else {
      num_tokens_ = 0;
      for (const std::string &w : words_) {
        uint64_t id;
        if (ParseTokenId(w, &id)) num_tokens_ = std::max(num_tokens_, id + 1);
      }
    }
    if (num_tokens_ > kMaxTokens)
      throw VocabularyTooLarge(num_tokens_);
    text_bytes_ = 0;
    for (const std::string &w : words_) text_bytes_ += w.size();

    FileHeader h;
    std::memset(&h, 0, sizeof(h));
    std::memcpy(h.magic, kMagic, 8);
    h.endian_mark = kEndianMark;
    h.version = kVersion;
    h.header_size = static_cast<uint32_t>(kHeaderSize);
    h.order = static_cast<uint32_t>(order_);
    h.flags = (has_vocab_ ? kFlagVocab : 0) | (num_words_ > 65535 ? kFlagWideWords : 0);
    h.num_words = num_words_;
    h.num_states = num_states_;
    h.num_arcs = num_arcs_;
    h.num_tokens = num_tokens_;
    h.text_bytes = text_bytes_;
    h.file_size = Layout(h, h.section_offset);
    model_.reset(new Model());
    model_->storage_.reset(ModelStorage::Allocate(h.file_size));
    std::memcpy(model_->storage_->mutable_data(), &h, sizeof(h));
    model_->BindViews();
  }

  static InvalidArgument VocabularyTooLarge(uint64_t n) {
    return InvalidArgument("token ids up to " + std::to_string(n - 1) +
                           " are too large for a direct token table (at most " +
                           std::to_string(kMaxTokens - 1) + "); pass a vocab instead");
  }

  template <typename T>
  T *Mutable(const T *p) {
    return const_cast<T *>(p);
  }

  void PlaceArcs() {
    Model &m = *model_;
    uint64_t *state_begin = Mutable(m.state_begin_);
    state_begin[0] = 0;
    for (int n = 1; n <= order_; ++n) state_begin[n] = state_begin[n - 1] + (n == 1 ? 1 : counts_[n - 2]);
    // state_begin[n] = 1 + sum_{k<n} counts[k]; the arcs of order n start at state_begin[n] - 1.
    StateRecord *states = Mutable(m.states_);
    unsigned char *arcs = Mutable(m.arcs_);
    const size_t word_bytes = m.wide_words_ ? 4 : 2;
    std::vector<uint32_t> source(num_arcs_);
    for (int n = 1; n <= order_; ++n) {
      const BuildOrder &o = orders_[n - 1];
      const uint64_t first_arc = state_begin[n] - 1;
      const BuildOrder *low = n > 1 ? &orders_[n - 2] : nullptr;
      size_t rank = 0;  // of the prefix among the (n-1)-grams, by merge walk
      for (size_t i = 0; i < o.size(); ++i) {
        const uint64_t a = first_arc + i;
        uint64_t src = 0;
        if (low != nullptr) {
          const WordId *prefix = &o.ids[i * n];
          while (LexCompare(&low->ids[rank * (n - 1)], prefix, n - 1) < 0) ++rank;
          src = state_begin[n - 1] + rank;
        }
        source[a] = static_cast<uint32_t>(src);
        const WordId w = o.ids[i * n + n - 1];
        unsigned char *record = arcs + m.arc_stride_ * a;
        if (word_bytes == 2) {
          const uint16_t w16 = static_cast<uint16_t>(w);
          std::memcpy(record, &w16, 2);
        } else {
          std::memcpy(record, &w, 4);
        }
        std::memcpy(record + word_bytes, &o.prob[i], 4);
        if (n < order_) states[a + 1].backoff_weight = o.backoff[i];
      }
    }
    for (uint64_t a = 0; a < num_arcs_; ++a) ++states[source[a] + 1].arc_begin;
    for (uint64_t s = 0; s < num_states_; ++s) states[s + 1].arc_begin += states[s].arc_begin;
  }

  // The back-off state of a history is its longest proper suffix that is a state.
  void LinkBackoffStates() {
    Model &m = *model_;
    StateRecord *states = Mutable(m.states_);
    states[0].backoff_state = 0;
    for (int n = 1; n < order_; ++n) {
      const BuildOrder &o = orders_[n - 1];
      const uint64_t first = m.state_begin_[n];
      for (size_t i = 0; i < o.size(); ++i) {
        const WordId *g = &o.ids[i * n];
        StateId link = kRootState;
        for (int start = 1; start < n; ++start) {
          StateId s = kRootState;
          bool found = true;
          for (int k = start; k < n; ++k) {
            uint32_t a = m.FindArc(s, g[k]);
            if (a == kNoArc) {
              found = false;
              break;
            }
            s = a + 1;
          }
          if (found) {
            link = s;
            break;
          }
        }
        states[first + i].backoff_state = link;
      }
    }
  }

  void FillPrefixProbabilities() {
    if (num_fillers_ == 0) return;
    Model &m = *model_;
    unsigned char *arcs = Mutable(m.arcs_);
    const size_t word_bytes = m.wide_words_ ? 4 : 2;
    const StateRecord *states = m.states_;
    for (int n = 2; n < order_; ++n) {
      const BuildOrder &o = orders_[n - 1];
      const uint64_t first_arc = m.state_begin_[n] - 1;
      for (size_t i = 0; i < o.size(); ++i) {
        if (!o.filler[i]) continue;
        const uint64_t a = first_arc + i;
        // The prefix state is the source of arc a; scoring from its back-off state gives
        // the probability the n-gram had before it was added.
        const StateId src = static_cast<StateId>(
            std::upper_bound(states, states + num_states_ + 1, uint32_t(a),
                             [](uint32_t v, const StateRecord &r) { return v < r.arc_begin; }) -
            states - 1);
        StateId next;
        const double p = m.BackoffWeight(src) +
                         m.Advance(m.BackoffState(src), o.ids[i * n + n - 1], &next);
        if (!(std::fabs(p) <= FLT_MAX))
          Fail(o.line[i], "the " + std::to_string(n) + "-gram '" + Spell(&o.ids[i * n], n) +
                              "' is missing and the probability back-off gives it (log10 " +
                              std::to_string(p) + ") is beyond float32's range");
        const float p32 = static_cast<float>(p);
        std::memcpy(arcs + m.arc_stride_ * a + word_bytes, &p32, 4);
      }
    }
  }

  void FillTokensAndText() {
    Model &m = *model_;
    uint32_t *token_to_word = Mutable(m.token_to_word_);
    if (has_vocab_) {
      std::unordered_map<std::string, WordId> index;
      index.reserve(num_words_ * 2);
      for (WordId w = 0; w < num_words_; ++w) index.emplace(words_[w], w);
      for (uint64_t t = 0; t < num_tokens_; ++t) {
        auto it = index.find(vocab_[t]);
        token_to_word[t] = it == index.end() ? kUnkWord : it->second;
      }
    } else {
      for (WordId w = 0; w < num_words_; ++w) {
        uint64_t id;
        if (ParseTokenId(words_[w], &id)) token_to_word[id] = w;
      }
    }
    uint64_t *text_begin = Mutable(m.text_begin_);
    char *text = Mutable(m.text_);
    uint64_t at = 0;
    for (WordId w = 0; w < num_words_; ++w) {
      text_begin[w] = at;
      std::memcpy(text + at, words_[w].data(), words_[w].size());
      at += words_[w].size();
    }
    text_begin[num_words_] = at;
  }

  NGramTables tables_;
  const std::vector<std::string> &vocab_;
  bool has_vocab_;
  const std::string &source_;
  int order_ = 0;
  int bits_ = 1;
  std::vector<std::string> words_;
  std::vector<int64_t> unigram_source_;
  std::vector<WordId> remap_;
  std::vector<BuildOrder> orders_;
  std::vector<uint64_t> counts_;
  uint64_t num_words_ = 0, num_states_ = 0, num_arcs_ = 0, num_tokens_ = 0, text_bytes_ = 0;
  uint64_t num_fillers_ = 0;
  std::unique_ptr<Model> model_;
};

std::unique_ptr<Model> Model::Build(NGramTables tables, const std::vector<std::string> &vocab,
                                    bool has_vocab, const std::string &source) {
  return ModelBuilder(std::move(tables), vocab, has_vocab, source).Build();
}

}  // namespace latticekit
