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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
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
  // Writes the binary model to path via a temporary file and a rename.
  void Save(const std::string &path) const;

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
  uint32_t ArcBegin(StateId s) const { return arc_begin_[s]; }
  uint32_t ArcEnd(StateId s) const { return arc_begin_[s + 1]; }
  WordId ArcWord(uint32_t a) const { return wide_words_ ? arc_word32_[a] : arc_word16_[a]; }
  float ArcLog10Prob(uint32_t a) const { return arc_prob_[a]; }
  // Arcs of the highest order lead to no state of their own.
  bool IsTopArc(uint32_t a) const { return a + 1 >= num_states_; }
  StateId BackoffState(StateId s) const { return backoff_state_[s]; }
  float BackoffWeight(StateId s) const { return backoff_weight_[s]; }
  // Replaces a state without arcs and without back-off weight by its back-off state.
  StateId Normalize(StateId s) const;
  // Number of words in the history of s (0 for the root). States are numbered by it:
  // a state's back-off state always has a shorter history and a smaller id.
  int HistoryLength(StateId s) const {
    int n = 0;
    while (n + 1 < order_ && s >= state_begin_[n + 1]) ++n;
    return n;
  }
  // Cache hints for the search, which knows its next memory accesses a little ahead.
  void PrefetchState(StateId s) const {
    __builtin_prefetch(arc_begin_ + s);
    __builtin_prefetch(backoff_weight_ + s);
    __builtin_prefetch(backoff_state_ + s);
  }
  void PrefetchArcWords(uint32_t a) const {
    if (wide_words_)
      __builtin_prefetch(arc_word32_ + a);
    else
      __builtin_prefetch(arc_word16_ + a);
  }
  void PrefetchArcProb(uint32_t a) const { __builtin_prefetch(arc_prob_ + a); }
  // The arc word array, for tight loops: uint32 words when WideWords(), else uint16.
  bool WideWords() const { return wide_words_; }
  const uint16_t *ArcWords16() const { return arc_word16_; }
  const uint32_t *ArcWords32() const { return arc_word32_; }

  // Introspection.
  std::string WordText(WordId w) const;
  // Re-creates the n-grams of order n in lexicographic order: ids [count, n], log10 values.
  void NGrams(int n, int32_t *ids, float *log10_prob, float *log10_backoff) const;

 private:
  Model();
  friend class ModelBuilder;

  void BindViews();  // points the array members into storage_
  void Validate() const;

  std::unique_ptr<ModelStorage> storage_;
  int order_ = 0;
  bool has_vocab_ = false;
  bool wide_words_ = false;  // arc words are uint32 (else uint16)
  uint64_t num_words_ = 0, num_states_ = 0, num_arcs_ = 0, num_tokens_ = 0;
  const uint64_t *state_begin_ = nullptr;  // [order + 1]: first state of each order, then total
  const uint32_t *arc_begin_ = nullptr;    // [num_states + 1]
  const float *backoff_weight_ = nullptr;  // [num_states] log10
  const uint32_t *backoff_state_ = nullptr;  // [num_states]
  const uint16_t *arc_word16_ = nullptr;     // [num_arcs] when !wide_words_
  const uint32_t *arc_word32_ = nullptr;     // [num_arcs] when wide_words_
  const float *arc_prob_ = nullptr;          // [num_arcs] log10
  const uint32_t *token_to_word_ = nullptr;  // [num_tokens]
  const uint64_t *text_begin_ = nullptr;     // [num_words + 1]
  const char *text_ = nullptr;
};

}  // namespace latticekit

#endif  // LATTICEKIT_MODEL_H_
