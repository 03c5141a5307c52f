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
#include <type_traits>
#include <utility>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

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
  // Whether arc words are uint32 (else uint16): the Word of ArcSetLookup<Word>.
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

#endif  // LATTICEKIT_MODEL_H_
