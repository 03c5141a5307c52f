// Looking up a set of words in the arc lists of a Model's states: ArcSetLookup, which the
// search uses for every column of a lattice, and the fence count it is built on.
#ifndef LATTICEKIT_ARC_LOOKUP_H_
#define LATTICEKIT_ARC_LOOKUP_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "latticekit/model.h"

namespace latticekit {

// How many of the n words at f are <= key.
inline uint32_t CountNotAbove(const uint32_t *f, uint32_t n, WordId key) {
  uint32_t count = 0;
  for (uint32_t i = 0; i < n; ++i) count += f[i] <= key;
  return count;
}

// The same for 16-bit words (n < 2^19). f[n .. n + 7] must be readable
// (Model::kFencePadding); their values do not matter.
inline uint32_t CountNotAbove(const uint16_t *f, uint32_t n, WordId key) {
#ifdef __SSE2__
  // x <= key exactly when the unsigned saturating difference x - key is 0. Each 16-bit lane
  // counts at most n / 8 + 1 words. The last 0-7 words are one more load of 8, its lanes
  // past n masked off: no scalar tail, no data-dependent branch.
  const __m128i k = _mm_set1_epi16(static_cast<short>(key)), zero = _mm_setzero_si128();
  __m128i acc = zero;
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i *>(f + i));
    acc = _mm_sub_epi16(acc, _mm_cmpeq_epi16(_mm_subs_epu16(x, k), zero));
  }
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i *>(f + i));
  const __m128i lane = _mm_set_epi16(7, 6, 5, 4, 3, 2, 1, 0);
  const __m128i in_range = _mm_cmplt_epi16(lane, _mm_set1_epi16(static_cast<short>(n - i)));
  acc = _mm_sub_epi16(acc, _mm_and_si128(in_range, _mm_cmpeq_epi16(_mm_subs_epu16(x, k), zero)));
  __m128i sum = _mm_madd_epi16(acc, _mm_set1_epi16(1));  // 4 x int32
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(1, 0, 3, 2)));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(sum));
#else
  uint32_t count = 0;
  for (uint32_t i = 0; i < n; ++i) count += f[i] <= key;
  return count;
#endif
}

// Looks up one set of words in the arc lists of many states: which arcs of a state carry
// a word of the set. (The search looks up a lattice column's words in every state of the
// column's back-off tree; Model::FindArc looks up one word in one state.) Word is the arc
// records' word type: uint32_t when the model's WideWords(), else uint16_t. Keeps its
// buffers from one set to the next; not thread-safe.
template <typename Word>
class ArcSetLookup {
 public:
  explicit ArcSetLookup(const Model &model) : model_(model), arcs_{model.arcs_} {
    if constexpr (std::is_same<Word, uint32_t>::value) {
      fence_ = model.fence32_.data();
      upper_ = model.upper32_.data();
    } else {
      static_assert(std::is_same<Word, uint16_t>::value, "arc words are uint16 or uint32");
      fence_ = model.fence16_.data();
      upper_ = model.upper16_.data();
    }
  }

  // The words looked up from now on: ascending, distinct, each below the model's num_words().
  void SetWords(const std::vector<WordId> &words) {
    for (WordId w : words_) word_bits_[w >> 6] = 0;
    words_ = words;
    word_bits_.resize((model_.num_words() + 63) / 64, 0);
    for (WordId w : words_) word_bits_[w >> 6] |= uint64_t(1) << (w & 63);
    scan_limit_ = static_cast<uint32_t>(std::max<size_t>(8 * words_.size(), Model::kFenceStride));
    if (hits_.size() < scan_limit_ + 1) hits_.resize(scan_limit_ + 1);
  }

  // Calls found(a, w) for every arc a of one state's arcs [begin, end) (its ArcBegin and
  // ArcEnd) whose word w is in the set, in arc order (so ascending w), and prefetches the
  // state each such arc leads to.
  template <typename Found>
  void ForEachArc(uint32_t begin, uint32_t end, Found found) {
    if (end - begin <= scan_limit_) {
      // A short list: the arcs whose word is in the set, collected without a branch per arc
      // (few are, and which ones is unpredictable).
      uint32_t n_hits = 0;
      for (uint32_t a = begin; a < end; ++a) {
        const WordId w = arcs_.word(a);
        hits_[n_hits] = a;
        n_hits += static_cast<uint32_t>(word_bits_[w >> 6] >> (w & 63)) & 1;
      }
      for (uint32_t i = 0; i < n_hits; ++i) {
        const uint32_t a = hits_[i];
        found(a, static_cast<WordId>(arcs_.word(a)));
        Prefetch(a);
      }
      return;
    }
    FenceBlocks(begin, end);
    for (size_t i = 0; i < words_.size(); ++i) {
      // The first arc of the block whose word is not below w, found without branching on
      // the words: a binary search of a full block, a count in a shorter one.
      const WordId w = words_[i];
      const uint32_t b = blocks_[i].first, e = blocks_[i].second;
      uint32_t a = b;
      if (e - b == Model::kFenceStride) {
        static_assert(Model::kFenceStride == 8, "three halving steps");
        a += arcs_.word(a + 3) < w ? 4 : 0;
        a += arcs_.word(a + 1) < w ? 2 : 0;
        a += arcs_.word(a) < w ? 1 : 0;
      } else {
        for (uint32_t c = b; c < e; ++c) a += arcs_.word(c) < w ? 1 : 0;
      }
      if (a < e && arcs_.word(a) == w) {
        found(a, w);
        Prefetch(a);
      }
    }
  }

 private:
  // A found arc's successor state will be read soon (its probability shares the arc's
  // record, already in cache).
  void Prefetch(uint32_t a) const {
    if (!model_.IsTopArc(a)) model_.PrefetchState(model_.ArcState(a));
  }

  // A long arc list [begin, end), longer than S = Model::kFenceStride: for every word w of
  // the set, the block of at most S arcs that may hold it, the one after the last fence word
  // not above w (or the arcs before the list's first fence word). Up to kCountedFence fence
  // words, they are counted (SSE2, no chain of dependent loads); a longer stretch of the
  // fence is narrowed to S fence words by the upper fence first, counted the same way or,
  // for the longest lists, binary-searched from where the previous, smaller word ended.
  // The blocks are prefetched, to be scanned next, so that their cache misses overlap.
  static constexpr uint32_t kCountedFence = 256;  // fence words counted, not searched
  void FenceBlocks(uint32_t begin, uint32_t end) {
    constexpr uint32_t kS = Model::kFenceStride;
    const uint32_t g0 = (begin + kS - 1) / kS, g1 = (end - 1) / kS;  // g0 <= g1
    blocks_.resize(words_.size());
    const uint32_t n_fence = g1 - g0 + 1;
    // A very long list: its upper fence words first, then the (at most S) fence words
    // after the last upper one not above w.
    const uint32_t u0 = (g0 + kS - 1) / kS, u1 = g1 / kS;
    uint32_t u = u0;
    for (size_t i = 0; i < words_.size(); ++i) {
      const WordId w = words_[i];
      uint32_t a = g0, e = g1 + 1;  // fence words [a, e) hold the last one not above w, if any
      if (n_fence > kCountedFence && u0 <= u1) {
        const uint32_t n_upper = u1 - u0 + 1;
        uint32_t below;
        if (n_upper <= kCountedFence) {
          below = CountNotAbove(upper_ + u0, n_upper, w);
        } else {  // progressive binary search, from where the previous (smaller) word ended
          for (uint32_t len = u1 - u + 1; len > 1;) {
            const uint32_t half = len / 2;
            u = upper_[u + half] <= w ? u + half : u;
            len -= half;
          }
          below = upper_[u] <= w ? u - u0 + 1 : 0;
        }
        if (below == 0) {
          e = u0 * kS;  // the fence words before the first upper one (maybe none)
        } else {
          a = (u0 + below - 1) * kS;
          e = std::min(g1 + 1, a + kS);
        }
      }
      // No fence word <= w (count 0 happens only with a == g0): w can only precede them all.
      const uint32_t count = CountNotAbove(fence_ + a, e - a, w);
      const uint32_t g = a + count - 1;
      blocks_[i] = count > 0 ? std::make_pair(g * kS, std::min(end, g * kS + kS))
                             : std::make_pair(begin, g0 * kS);
      if (blocks_[i].first < blocks_[i].second) {
        model_.PrefetchArc(blocks_[i].first);
        model_.PrefetchArc(blocks_[i].second - 1);
      }
    }
  }

  const Model &model_;
  const ArcRecords<Word> arcs_;
  const Word *fence_ = nullptr;
  const Word *upper_ = nullptr;
  std::vector<WordId> words_;
  std::vector<uint64_t> word_bits_;  // words_ as a bit set over the model's words
  uint32_t scan_limit_ = 0;          // lists up to this long are scanned, longer ones fenced
  std::vector<uint32_t> hits_;       // a short list's arcs whose word is in the set
  std::vector<std::pair<uint32_t, uint32_t>> blocks_;  // per word: arcs that may hold it
};

}  // namespace latticekit

#endif  // LATTICEKIT_ARC_LOOKUP_H_
