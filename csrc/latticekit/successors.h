// A Katz back-off model's next tokens after a context, most probable first, over its whole
// vocabulary, with the model's own back-off semantics: after a context whose known suffixes are
// the states s_0 (the longest), ..., s_L (the root),
//
//   log10 p(w | context) = bo(s_0) + ... + bo(s_{j-1}) + log10 P(s_j w),   j the first level with s_j w,
//
// so the tokens in decreasing probability are a merge of the levels' arcs (each state's arcs
// ranked once, offset by the back-off weights above it), a word taken at the first level that
// lists it and skipped at every lower one. The sums are Model::Advance's, in the same order and
// precision, so KatzState::Log10Prob equals Model::Score bit for bit. Only words that spell token
// ids are proposed (<unk>, <s>, </s> never are, though they are scored). This is the index behind
// latticekit/drafting/successors.py and the heads-free search (continuations.h).
#ifndef LATTICEKIT_SUCCESSORS_H_
#define LATTICEKIT_SUCCESSORS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "latticekit/open_map.h"
#include "latticekit/model.h"

namespace latticekit {

// Natural log of 10, as the Python layer's math.log(10.0).
extern const double kLn10;

// The next-token index of one model over token ids: each state's arcs ranked by decreasing
// probability (ties by token id), built once per model (a sort per state) and read-only after.
// The model must outlive it.
class KatzSuccessors {
 public:
  // token_of[w] (num_words entries, the model's word count): the token id word w spells (a
  // canonical decimal), or -1. Throws InvalidArgument when the count differs from the model's.
  KatzSuccessors(const Model &model, const int64_t *token_of, size_t num_words);

  const Model &model() const { return model_; }
  int order() const { return model_.order(); }
  // The word spelling a token id, <unk> (0) for every other id.
  WordId Word(int64_t token) const {
    return token >= 0 && static_cast<uint64_t>(token) < word_of_.size() ? word_of_[token] : 0;
  }
  int64_t Token(WordId w) const { return token_of_[w]; }
  // The arcs of state s, most probable first: RankedArcs(s)[0 .. ArcEnd(s) - ArcBegin(s)).
  const uint32_t *RankedArcs(StateId s) const { return ranked_.data() + model_.ArcBegin(s); }
  size_t bytes() const;

 private:
  const Model &model_;
  std::vector<int64_t> token_of_;
  std::vector<WordId> word_of_;   // token id -> word (0: the model lacks it)
  std::vector<uint32_t> ranked_;  // per state's arc range, its arcs by (-log10 p, token id)
};

// The model after one context (only its last order - 1 tokens matter): exact log-probabilities,
// and the ranked next tokens, merged as far as asked.
class KatzState {
 public:
  KatzState(const KatzSuccessors &index, const int32_t *context, size_t n);

  // log10 p(word | context), as the core sums it.
  double Log10Prob(WordId w) const;
  // Natural-log p(token | context); ids the model lacks score as <unk>.
  double LogProb(int64_t token) const { return Log10Prob(index_.Word(token)) * kLn10; }
  // The r-th most probable proposable token (0-based) and its natural-log probability, ties by
  // token id; false past the last.
  bool Ranked(size_t r, int64_t *token, double *logprob);

 private:
  struct Level {
    StateId state;
    double offset;  // the back-off weights above this level, log10
    uint32_t size;  // arcs of the state
  };
  struct Entry {  // a level's next proposable arc on the merge heap
    double neg;   // -(offset + log10 p)
    int64_t token;
    uint32_t level, position;
  };
  void Push(uint32_t level, uint32_t position);
  bool Next(int64_t *token, double *logprob);

  const KatzSuccessors &index_;
  std::vector<Level> levels_;
  std::vector<Entry> heap_;
  bool started_ = false;
  std::vector<std::pair<int64_t, double>> ranked_;
};

// The states a request's searches visit, kept from one search to the next: the contexts of a
// step's candidate tree mostly recur at the next step, their levels found and their tokens
// ranked once. Bounded: beyond capacity states it starts empty again. Not shared between
// threads (one per request).
class KatzStateMemo {
 public:
  explicit KatzStateMemo(size_t capacity) : capacity_(capacity) {}

  // Before a search under index: the memo is emptied if it holds another model's states or
  // more than its capacity (a search's own states stay valid until the next Start).
  void Start(const KatzSuccessors &index);
  // The state after context[0 .. n) (only its last order - 1 tokens matter) under Start's index.
  KatzState *Get(const int32_t *context, size_t n);
  size_t size() const { return states_.size(); }

 private:
  struct Slot {
    std::vector<int32_t> key;
    std::unique_ptr<KatzState> state;
  };
  size_t capacity_;
  const KatzSuccessors *index_ = nullptr;
  std::vector<Slot> states_;
  internal::OpenMap<uint64_t> where_{16};  // hash of the key -> slot
};

}  // namespace latticekit

#endif  // LATTICEKIT_SUCCESSORS_H_
