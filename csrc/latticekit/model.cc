// Scoring with a compiled model: arc lookup, back-off, and introspection.
#include "latticekit/model.h"

#include <algorithm>
#include <string>
#include <vector>

namespace latticekit {

namespace {
template <typename Records>
uint32_t SearchArcs(const Records &words, uint32_t begin, uint32_t end, WordId w) {
  // Short ranges: linear scan; long ones: binary search.
  while (end - begin > 8) {
    uint32_t mid = begin + (end - begin) / 2;
    if (words.word(mid) <= w) begin = mid;
    else end = mid;
  }
  for (uint32_t a = begin; a < end; ++a) {
    const WordId v = words.word(a);
    if (v == w) return a;
    if (v > w) break;
  }
  return kNoArc;
}
}  // namespace

uint32_t Model::FindArc(StateId s, WordId w) const {
  if (s == kRootState) return w < num_words_ ? w : kNoArc;
  const uint32_t begin = ArcBegin(s), end = ArcEnd(s);
  return wide_words_ ? SearchArcs(Arcs32(), begin, end, w) : SearchArcs(Arcs16(), begin, end, w);
}

StateId Model::Normalize(StateId s) const {
  while (s != kRootState && ArcBegin(s) == ArcEnd(s) && BackoffWeight(s) == 0.0f)
    s = BackoffState(s);
  return s;
}

double Model::Advance(StateId s, WordId w, StateId *next) const {
  double total = 0.0;
  StateId t = s;
  while (true) {
    const uint32_t a = FindArc(t, w);
    if (a != kNoArc) {
      if (order_ == 1) {
        *next = kRootState;
      } else if (!IsTopArc(a)) {
        *next = Normalize(ArcState(a));
      } else {
        // Highest order: the next history is the longest suffix of (t, w) that is a state.
        StateId u = BackoffState(t);
        uint32_t b;
        while ((b = FindArc(u, w)) == kNoArc) u = BackoffState(u);
        *next = Normalize(ArcState(b));
      }
      return total + ArcLog10Prob(a);
    }
    total += BackoffWeight(t);
    t = BackoffState(t);
  }
}

StateId Model::StartState(bool bos) const {
  if (!bos || order_ == 1) return kRootState;
  return Normalize(kBosWord + 1);
}

double Model::Score(StateId start, const int32_t *tokens, size_t n, double *per_token,
                    StateId *end) const {
  double total = 0.0;
  StateId s = start;
  for (size_t i = 0; i < n; ++i) {
    const double lp = Advance(s, TokenToWord(tokens[i]), &s);
    if (per_token != nullptr) per_token[i] = lp;
    total += lp;
  }
  if (end != nullptr) *end = s;
  return total;
}

StateId Model::ContextState(const int32_t *context, size_t n, bool bos) const {
  const size_t keep = std::min<size_t>(n, static_cast<size_t>(order_ - 1));
  StateId s = StartState(bos);
  Score(s, context + (n - keep), keep, nullptr, &s);
  return s;
}

std::string Model::WordText(WordId w) const {
  return std::string(text_ + text_begin_[w], text_ + text_begin_[w + 1]);
}

void Model::NGrams(int n, int32_t *ids, float *log10_prob, float *log10_backoff) const {
  // Rows of order k are rebuilt from the rows of order k - 1: an arc's n-gram is its
  // source state's n-gram plus its word.
  std::vector<int32_t> rows, prev;
  for (int k = 1; k <= n; ++k) {
    const uint64_t first_arc = state_begin_[k] - 1;
    const uint64_t count = (k < order_ ? state_begin_[k + 1] : num_arcs_ + 1) - state_begin_[k];
    rows.assign(count * k, 0);
    const uint64_t src_first = state_begin_[k - 1];
    const uint64_t src_last = k > 1 ? state_begin_[k] : 1;
    for (uint64_t s = src_first; s < src_last; ++s) {
      for (uint32_t a = ArcBegin(s); a < ArcEnd(s); ++a) {
        const uint64_t i = a - first_arc;
        if (k > 1) std::copy_n(&prev[(s - src_first) * (k - 1)], k - 1, &rows[i * k]);
        rows[i * k + k - 1] = static_cast<int32_t>(ArcWord(a));
        if (k == n) {
          log10_prob[i] = ArcLog10Prob(a);
          log10_backoff[i] = k < order_ ? BackoffWeight(ArcState(a)) : 0.0f;
        }
      }
    }
    prev.swap(rows);
  }
  std::copy(prev.begin(), prev.end(), ids);
}

}  // namespace latticekit
