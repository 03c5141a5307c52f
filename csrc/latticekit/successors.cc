// The ranked next tokens of a Katz model (successors.h).
#include "latticekit/successors.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "latticekit/errors.h"

namespace latticekit {

const double kLn10 = std::log(10.0);

KatzSuccessors::KatzSuccessors(const Model &model, const int64_t *token_of, size_t num_words)
    : model_(model), token_of_(token_of, token_of + num_words) {
  if (num_words != model.num_words())
    throw InvalidArgument("token_of has " + std::to_string(num_words) + " entries for a model of " +
                          std::to_string(model.num_words()) + " words");
  int64_t largest = -1;
  for (int64_t t : token_of_) largest = std::max(largest, t);
  word_of_.assign(static_cast<size_t>(largest + 1), 0);
  for (size_t w = 0; w < num_words; ++w)
    if (token_of_[w] >= 0) word_of_[token_of_[w]] = static_cast<WordId>(w);
  ranked_.resize(model.num_arcs());
  for (uint32_t a = 0; a < ranked_.size(); ++a) ranked_[a] = a;
  // Each state's arcs are contiguous; the states' ranges tile [0, num_arcs).
  for (StateId s = 0; s < model.num_states(); ++s) {
    uint32_t *begin = ranked_.data() + model.ArcBegin(s), *end = ranked_.data() + model.ArcEnd(s);
    std::sort(begin, end, [&](uint32_t a, uint32_t b) {
      const double pa = model.ArcLog10Prob(a), pb = model.ArcLog10Prob(b);
      if (pa != pb) return pa > pb;
      return token_of_[model.ArcWord(a)] < token_of_[model.ArcWord(b)];
    });
  }
}

size_t KatzSuccessors::bytes() const {
  return token_of_.capacity() * sizeof(int64_t) + word_of_.capacity() * sizeof(WordId) +
         ranked_.capacity() * sizeof(uint32_t);
}

KatzState::KatzState(const KatzSuccessors &index, const int32_t *context, size_t n) : index_(index) {
  const Model &model = index.model();
  const size_t keep = std::min<size_t>(n, static_cast<size_t>(model.order() - 1));
  const int32_t *words = context + (n - keep);
  // The known suffixes of the context, longest first: the state reached from the root by the
  // suffix's words, where every one of its arcs exists (orders below the highest lead to states).
  double offset = 0.0;
  for (size_t m = keep; m > 0; --m) {
    StateId s = kRootState;
    bool found = true;
    for (size_t j = keep - m; j < keep && found; ++j) {
      const uint32_t a = model.FindArc(s, index.Word(words[j]));
      if (a == kNoArc) found = false;
      else s = model.ArcState(a);
    }
    if (!found) continue;
    levels_.push_back({s, offset, model.ArcEnd(s) - model.ArcBegin(s)});
    offset += static_cast<double>(model.BackoffWeight(s));
  }
  levels_.push_back({kRootState, offset, model.ArcEnd(kRootState) - model.ArcBegin(kRootState)});
}

double KatzState::Log10Prob(WordId w) const {
  const Model &model = index_.model();
  for (const Level &level : levels_) {
    const uint32_t a = model.FindArc(level.state, w);
    if (a != kNoArc) return level.offset + static_cast<double>(model.ArcLog10Prob(a));
  }
  return -INFINITY;  // unreachable: every word has a unigram
}

namespace {
// The merge heap's order: a min-heap on (-score, token, level), as the Python reference's tuples.
struct Later {
  template <typename E>
  bool operator()(const E &a, const E &b) const {
    if (a.neg != b.neg) return a.neg > b.neg;
    if (a.token != b.token) return a.token > b.token;
    return a.level > b.level;
  }
};
}  // namespace

void KatzState::Push(uint32_t level, uint32_t position) {
  const Model &model = index_.model();
  const Level &l = levels_[level];
  const uint32_t *ranked = index_.RankedArcs(l.state);
  for (; position < l.size; ++position) {
    const uint32_t a = ranked[position];
    const int64_t token = index_.Token(model.ArcWord(a));
    if (token >= 0) {
      heap_.push_back({-(l.offset + static_cast<double>(model.ArcLog10Prob(a))), token, level, position});
      std::push_heap(heap_.begin(), heap_.end(), Later());
      return;
    }
  }
}

bool KatzState::Next(int64_t *token, double *logprob) {
  const Model &model = index_.model();
  if (!started_) {
    started_ = true;
    for (uint32_t level = 0; level < levels_.size(); ++level) Push(level, 0);
  }
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), Later());
    const Entry e = heap_.back();
    heap_.pop_back();
    Push(e.level, e.position + 1);
    const WordId w = model.ArcWord(index_.RankedArcs(levels_[e.level].state)[e.position]);
    bool shadowed = false;  // listed by a longer context: scored there
    for (uint32_t up = 0; up < e.level && !shadowed; ++up) shadowed = model.FindArc(levels_[up].state, w) != kNoArc;
    if (shadowed) continue;
    *token = e.token;
    *logprob = -e.neg * kLn10;
    return true;
  }
  return false;
}

bool KatzState::Ranked(size_t r, int64_t *token, double *logprob) {
  while (ranked_.size() <= r) {
    int64_t t;
    double lp;
    if (!Next(&t, &lp)) return false;
    ranked_.emplace_back(t, lp);
  }
  *token = ranked_[r].first;
  *logprob = ranked_[r].second;
  return true;
}

void KatzStateMemo::Start(const KatzSuccessors &index) {
  if (&index != index_ || states_.size() >= capacity_) {
    index_ = &index;
    states_.clear();
    where_.Clear();
  }
}

KatzState *KatzStateMemo::Get(const int32_t *context, size_t n) {
  const KatzSuccessors &index = *index_;
  const size_t keep = std::min<size_t>(n, static_cast<size_t>(index.order() - 1));
  context += n - keep;
  uint64_t hash = 0x9E3779B97F4A7C15ull ^ keep;
  for (size_t j = 0; j < keep; ++j) hash = (hash ^ static_cast<uint32_t>(context[j])) * 0x100000001B3ull + j;
  bool inserted;
  uint32_t *at = where_.FindOrInsert(hash, static_cast<uint32_t>(states_.size()), &inserted);
  if (!inserted) {
    Slot &slot = states_[*at];
    if (slot.key.size() == keep && std::equal(slot.key.begin(), slot.key.end(), context)) return slot.state.get();
    // another context with the same hash: a state of its own, outside the memo
    states_.push_back({{}, std::unique_ptr<KatzState>(new KatzState(index, context, keep))});
    return states_.back().state.get();
  }
  states_.push_back({std::vector<int32_t>(context, context + keep),
                     std::unique_ptr<KatzState>(new KatzState(index, context, keep))});
  return states_.back().state.get();
}

}  // namespace latticekit
