// A Katz back-off n-gram model compiled into a deterministic state machine with back-off
// links, stored as flat arrays that are written to and memory-mapped from one binary file.
//
// States are the model's histories: the root (empty history) and every n-gram of order
// < N. Arcs are the n-grams: the arc for (h, w) leaves the state of h. Arcs are sorted
// lexicographically by n-gram within each order, which makes two things implicit:
//   * the arcs of a state are contiguous and sorted by word (binary search);
//   * the arc with index a of order < N leads to state a + 1 (state ids follow arc order).
// The arcs of the highest order lead to the longest suffix of (h, w) that is a state,
// found at run time through the back-off links.
#ifndef LATTICEKIT_MODEL_H_
#define LATTICEKIT_MODEL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "latticekit/arpa.h"

namespace latticekit {

using StateId = uint32_t;
using WordId = uint32_t;

constexpr WordId kUnkWord = 0;  // <unk>
constexpr WordId kBosWord = 1;  // <s>
constexpr WordId kEosWord = 2;  // </s>
constexpr StateId kRootState = 0;
constexpr uint32_t kNoArc = 0xFFFFFFFFu;

// Owns (or maps) the bytes of a model image.
class ModelStorage;

// A state's record: its arcs are [arc_begin, the next record's arc_begin). One record, one
// cache line (mostly) for everything the search reads about a state.
struct StateRecord {
  uint32_t arc_begin;
  float backoff_weight;  // log10
  uint32_t backoff_state;
};
static_assert(sizeof(StateRecord) == 12, "StateRecord must be packed");

// Arcs are packed records of (word, log10 probability): 6 bytes with uint16 words, 8 with
// uint32 words, so that a word and its probability share a cache line.
template <typename Word>
struct ArcRecords {
  static constexpr size_t kStride = sizeof(Word) + sizeof(float);
  const unsigned char *base;
  Word word(uint32_t a) const {
    Word w;
    std::memcpy(&w, base + kStride * a, sizeof(Word));
    return w;
  }
  float log10_prob(uint32_t a) const {
    float p;
    std::memcpy(&p, base + kStride * a + sizeof(Word), sizeof(float));
    return p;
  }
};

class Model {
 public:
  // Compiles parsed n-gram tables. With has_vocab, vocab[t] is the spelling of token id t;
  // otherwise words spelled as canonical decimal integers are token ids. source labels
  // error messages. Throws ArpaError for inconsistent tables.
  static std::unique_ptr<Model> Build(NGramTables tables, const std::vector<std::string> &vocab,
                                      bool has_vocab, const std::string &source);
  // Maps a binary model file and checks it completely (checksum and structure).
  // Throws ModelFileError for anything that is not an intact model of this version.
  static std::unique_ptr<Model> Load(const std::string &path);
  // The binary model's bytes (what a file written from them loads as), size_bytes() long.
  const char *image() const;

  ~Model();
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;

  int order() const { return order_; }
  uint64_t count(int n) const;  // n-grams of order n, 1-based
  uint64_t num_words() const { return num_words_; }
  uint64_t num_states() const { return num_states_; }
  uint64_t num_arcs() const { return num_arcs_; }
  uint64_t num_tokens() const { return num_tokens_; }
  uint64_t size_bytes() const;
  bool has_vocab() const { return has_vocab_; }
  // The largest |log10 probability| of any arc and |log10 back-off weight| of any state:
  // what bounds a path's score (the search's alpha limit). Every model value is finite.
  double MaxAbsLog10Prob() const { return max_abs_log10_prob_; }
  double MaxAbsLog10Backoff() const { return max_abs_log10_backoff_; }
  // Distinct for every Model object of the process, never reused.
  uint64_t serial() const { return serial_; }

  // The word a token id stands for; ids the model lacks map to <unk>.
  WordId TokenToWord(int64_t token) const {
    return token >= 0 && static_cast<uint64_t>(token) < num_tokens_ ? token_to_word_[token]
                                                                     : kUnkWord;
  }
  // The state after <s> (bos) or the root state.
  StateId StartState(bool bos) const;
  // log10 p(w | history of s), full back-off chain; *next receives the state after w.
  double Advance(StateId s, WordId w, StateId *next) const;
  // Advances through tokens from start; returns the log10 total and, if per_token is not
  // null, writes each token's log10 probability.
  double Score(StateId start, const int32_t *tokens, size_t n, double *per_token,
               StateId *end) const;
  // State after feeding the last order-1 tokens of context from StartState(bos).
  StateId ContextState(const int32_t *context, size_t n, bool bos) const;


  // Raw structure, for the search. Arc a of state s lies in [ArcBegin(s), ArcEnd(s)).
  uint32_t FindArc(StateId s, WordId w) const;  // arc index of (s, w), or kNoArc
  uint32_t ArcBegin(StateId s) const { return states_[s].arc_begin; }
  uint32_t ArcEnd(StateId s) const { return states_[s + 1].arc_begin; }
  WordId ArcWord(uint32_t a) const { return wide_words_ ? Arcs32().word(a) : Arcs16().word(a); }
  float ArcLog10Prob(uint32_t a) const {
    return wide_words_ ? Arcs32().log10_prob(a) : Arcs16().log10_prob(a);
  }
  // Arcs of the highest order lead to no state of their own.
  bool IsTopArc(uint32_t a) const { return a + 1 >= num_states_; }
  StateId BackoffState(StateId s) const { return states_[s].backoff_state; }
  float BackoffWeight(StateId s) const { return states_[s].backoff_weight; }
  // Replaces a state without arcs and without back-off weight by its back-off state.
  StateId Normalize(StateId s) const;
  // Number of words in the history of s (0 for the root). States are numbered by it:
  // a state's back-off state always has a shorter history and a smaller id.
  int HistoryLength(StateId s) const {
    int n = 0;
    while (n + 1 < order_ && s >= state_begin_[n + 1]) ++n;
    return n;
  }
  // The state arc a leads to, for an arc below the highest order (!IsTopArc(a)).
  StateId ArcState(uint32_t a) const { return a + 1; }
  // Cache hints for the search, which knows its next memory accesses a little ahead.
  void PrefetchState(StateId s) const {
    __builtin_prefetch(states_ + s);
    __builtin_prefetch(states_ + s + 1);
  }
  void PrefetchArc(uint32_t a) const { __builtin_prefetch(arcs_ + arc_stride_ * a); }
  // Whether arc words are uint32 (else uint16): the Word of ArcSetLookup<Word> (arc_lookup.h).
  bool WideWords() const { return wide_words_; }

  // Introspection.
  std::string WordText(WordId w) const;
  // Re-creates the n-grams of order n in lexicographic order: ids [count, n], log10 values.
  void NGrams(int n, int32_t *ids, float *log10_prob, float *log10_backoff) const;

 private:
  Model();
  friend class ModelBuilder;
  template <typename Word>
  friend class ArcSetLookup;

  // The arc records, for tight loops: Arcs32() when WideWords(), else Arcs16().
  ArcRecords<uint16_t> Arcs16() const { return ArcRecords<uint16_t>{arcs_}; }
  ArcRecords<uint32_t> Arcs32() const { return ArcRecords<uint32_t>{arcs_}; }
  // The fence: the word of every kFenceStride-th arc (arcs 0, S, 2S, ...), built in memory
  // when the model is built or loaded (1/S of the arc words). In a long arc list a word
  // lies in the block of S arcs after the last fence word not above it, so a search of
  // this small, mostly cached array and a scan of one block replace a binary search over
  // the arc records (one cache miss per word instead of a dependent chain of them).
  static constexpr uint32_t kFenceStride = 8;
  // The 16-bit fences are followed by this many readable words (values unspecified), so
  // that a lookup may load 8 words at once from any position inside them.
  static constexpr uint32_t kFencePadding = 8;

  void BindViews();  // points the array members into storage_
  void BuildFence();
  // Checks the structure and that every value is finite (ModelFileError otherwise), and
  // records the values' largest magnitudes.
  void Validate();

  std::unique_ptr<ModelStorage> storage_;
  uint64_t serial_ = 0;
  int order_ = 0;
  bool has_vocab_ = false;
  bool wide_words_ = false;  // arc words are uint32 (else uint16)
  uint64_t num_words_ = 0, num_states_ = 0, num_arcs_ = 0, num_tokens_ = 0;
  const uint64_t *state_begin_ = nullptr;  // [order + 1]: first state of each order, then total
  const StateRecord *states_ = nullptr;      // [num_states + 1], the last one a sentinel
  const unsigned char *arcs_ = nullptr;      // [num_arcs] ArcRecords
  size_t arc_stride_ = 6;
  float max_abs_log10_prob_ = 0, max_abs_log10_backoff_ = 0;
  const uint32_t *token_to_word_ = nullptr;  // [num_tokens]
  const uint64_t *text_begin_ = nullptr;     // [num_words + 1]
  const char *text_ = nullptr;
  std::vector<uint16_t> fence16_;  // the fence, when !wide_words_ (then kFencePadding more)
  std::vector<uint32_t> fence32_;  // the fence, when wide_words_
  // The upper fence: every kFenceStride-th fence word (the word of every S * S-th arc), for
  // lists so long that their stretch of the fence is long itself.
  std::vector<uint16_t> upper16_;  // when !wide_words_, padded like fence16_ (kFencePadding more)
  std::vector<uint32_t> upper32_;
};

}  // namespace latticekit

#endif  // LATTICEKIT_MODEL_H_
