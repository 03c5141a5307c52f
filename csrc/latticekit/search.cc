#include "latticekit/search.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "latticekit/errors.h"

namespace latticekit {
namespace {

constexpr double kLn10 = 2.302585092994045684;

// Open-addressing map from a 64-bit key to V, cleared in O(1) by bumping a stamp.
template <typename V>
class StampedTable {
 public:
  StampedTable() { Resize(256); }

  void Clear() {
    if (++stamp_ == 0) {  // wrapped: really clear
      for (Slot &s : slots_) s.stamp = 0;
      stamp_ = 1;
    }
    used_ = 0;
  }

  // The value for key, or null.
  const V *Find(uint64_t key) const {
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      const Slot &s = slots_[i];
      if (s.stamp != stamp_) return nullptr;
      if (s.key == key) return &s.value;
    }
  }

  // Returns the value for key, inserting a default one (and setting *inserted) if absent.
  V *FindOrInsert(uint64_t key, bool *inserted) {
    if (2 * (used_ + 1) > slots_.size()) Grow();
    size_t i = Hash(key);
    while (true) {
      Slot &s = slots_[i];
      if (s.stamp != stamp_) {
        s.stamp = stamp_;
        s.key = key;
        s.value = V();
        ++used_;
        *inserted = true;
        return &s.value;
      }
      if (s.key == key) {
        *inserted = false;
        return &s.value;
      }
      i = (i + 1) & mask_;
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    uint32_t stamp = 0;
    V value;
  };

  size_t Hash(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  void Resize(size_t n) {
    slots_.assign(n, Slot());
    mask_ = n - 1;
    shift_ = 64;
    for (size_t m = n; m > 1; m >>= 1) --shift_;
    stamp_ = 1;
    used_ = 0;
  }

  void Grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    const uint32_t old_stamp = stamp_;
    Resize(old.size() * 2);
    for (const Slot &s : old) {
      if (s.stamp != old_stamp) continue;
      bool inserted;
      *FindOrInsert(s.key, &inserted) = s.value;
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  uint32_t stamp_ = 1;
  size_t used_ = 0;
};

struct Transition {
  double log10_prob = 0;
  StateId next = 0;
};

// A partial path: its token sequence is the chain of nodes ending at node.
struct Entry {
  double g;         // draft + alpha * ln p so far
  double log10_lm;  // n-gram log10 probability so far
  int32_t node;
};

struct PathNode {
  int32_t parent;  // -1 for the empty path
  int32_t arc;     // arc index within its column
};

// The hypotheses that sit in one model state, at most p, best first after Finish().
struct StateList {
  StateId state;
  std::vector<Entry> entries;
};

}  // namespace

struct PBestSearch::Impl {
  explicit Impl(const Model &m) : model(m) {}

  const Model &model;
  const LatticeView *lattice = nullptr;
  int p = 1;
  double alpha = 0, alpha_log10 = 0;

  std::vector<WordId> words;          // [h, k]
  std::vector<PathNode> nodes;
  StampedTable<Transition> memo;      // (state, word) -> transition, at every back-off level
  StampedTable<uint32_t> index;       // state -> position in lists (current column)
  std::vector<StateList> lists, next_lists;
  std::vector<StateId> order;         // collapse work queue (max-heap of state ids)
  StampedTable<uint8_t> column_words; // words of the current column
  std::vector<int32_t> seq_a, seq_b;  // scratch for tie-breaking
  std::vector<Entry> moved, merged;   // scratch for collapsing lists
  std::vector<Entry> final_entries;
  SearchStats *stats = nullptr;

  void Sequence(int32_t node, int depth, std::vector<int32_t> *out) const {
    out->assign(depth, 0);
    for (int d = depth; d > 0; --d) {
      (*out)[d - 1] = lattice->tokens[static_cast<size_t>(d - 1) * lattice->k + nodes[node].arc];
      node = nodes[node].parent;
    }
  }

  // Strict order of partial paths of equal length: higher g first, then tokens ascending.
  // A candidate not yet in nodes is (parent node, arc at column depth - 1).
  bool Better(double ga, int32_t parent_a, int32_t arc_a, double gb, int32_t parent_b,
              int32_t arc_b, int depth) {
    if (ga != gb) return ga > gb;
    Sequence(parent_a, depth - 1, &seq_a);
    Sequence(parent_b, depth - 1, &seq_b);
    const size_t row = static_cast<size_t>(depth - 1) * lattice->k;
    seq_a.push_back(lattice->tokens[row + arc_a]);
    seq_b.push_back(lattice->tokens[row + arc_b]);
    return seq_a < seq_b;
  }
  bool BetterEntry(const Entry &a, const Entry &b, int depth) {
    if (a.g != b.g) return a.g > b.g;
    return Better(a.g, nodes[a.node].parent, nodes[a.node].arc, b.g, nodes[b.node].parent,
                  nodes[b.node].arc, depth);
  }

  // log10 p(w | s) and the next state, memoised at every back-off level so that states
  // sharing a back-off state share the work.
  Transition Step(StateId s, WordId w) {
    bool inserted;
    Transition *t = memo.FindOrInsert((uint64_t(s) << 32) | w, &inserted);
    if (!inserted) return *t;
    ++stats->transitions;
    Transition result;
    const uint32_t a = model.FindArc(s, w);
    if (a != kNoArc) {
      result.log10_prob = model.ArcLog10Prob(a);
      if (model.order() == 1) {
        result.next = kRootState;
      } else if (model.IsTopArc(a)) {
        result.next = Step(model.BackoffState(s), w).next;
      } else {
        result.next = model.Normalize(a + 1);
      }
    } else {
      const Transition lower = Step(model.BackoffState(s), w);
      result.log10_prob = model.BackoffWeight(s) + lower.log10_prob;
      result.next = lower.next;
    }
    // Step may have grown the table: look the slot up again.
    *memo.FindOrInsert((uint64_t(s) << 32) | w, &inserted) = result;
    return result;
  }

  // Whether some arc of s carries a word of the current column.
  bool MatchesColumn(StateId s, int column, int width) {
    if (s == kRootState) return true;
    const uint32_t begin = model.ArcBegin(s), end = model.ArcEnd(s);
    if (begin == end) return false;
    const size_t row = static_cast<size_t>(column) * lattice->k;
    if (end - begin <= static_cast<uint32_t>(4 * width)) {
      for (uint32_t a = begin; a < end; ++a)
        if (column_words.Find(model.ArcWord(a)) != nullptr) return true;
      return false;
    }
    for (int j = 0; j < width; ++j)
      if (model.FindArc(s, words[row + j]) != kNoArc) return true;
    return false;
  }
};

PBestSearch::PBestSearch(const Model &model) : impl_(new Impl(model)) {}
PBestSearch::~PBestSearch() = default;

int PBestSearch::Run(const LatticeView &lattice, StateId start, int p, double alpha,
                     const PathsOut &out) {
  Impl &s = *impl_;
  const Model &model = s.model;
  const int h = lattice.h, k = lattice.k;
  if (p < 1) throw InvalidArgument("p must be at least 1");
  if (h < 1 || k < 1) throw InvalidArgument("a lattice needs at least one position and one arc");
  if (!(alpha >= 0) || std::isinf(alpha)) throw InvalidArgument("alpha must be finite and >= 0");
  s.lattice = &lattice;
  s.p = p;
  s.alpha = alpha;
  s.alpha_log10 = alpha * kLn10;
  s.stats = &stats_;
  stats_ = SearchStats();
  s.words.resize(static_cast<size_t>(h) * k);
  for (int i = 0; i < h; ++i) {
    const int width = lattice.widths ? lattice.widths[i] : k;
    if (width < 1 || width > k) throw InvalidArgument("lattice width out of range");
    for (int j = 0; j < width; ++j)
      s.words[static_cast<size_t>(i) * k + j] = model.TokenToWord(lattice.tokens[static_cast<size_t>(i) * k + j]);
  }
  s.memo.Clear();
  s.nodes.clear();
  s.nodes.push_back(PathNode{-1, -1});
  s.lists.clear();
  s.lists.push_back(StateList{start, {Entry{0.0, 0.0, 0}}});

  for (int column = 0; column < h; ++column) {
    const int width = lattice.widths ? lattice.widths[column] : k;
    const size_t row = static_cast<size_t>(column) * k;
    // 1. Collapse: a state none of whose arcs carries a word of this column behaves, from
    //    here on, exactly like its back-off state plus its back-off weight. Move its
    //    hypotheses down, highest state ids (longest histories) first, merging lists.
    s.column_words.Clear();
    bool inserted;
    for (int j = 0; j < width; ++j) *s.column_words.FindOrInsert(s.words[row + j], &inserted) = 1;
    s.index.Clear();
    s.order.clear();
    for (uint32_t i = 0; i < s.lists.size(); ++i) {
      *s.index.FindOrInsert(s.lists[i].state, &inserted) = i;
      s.order.push_back(s.lists[i].state);
    }
    std::make_heap(s.order.begin(), s.order.end());
    s.next_lists.clear();
    while (!s.order.empty()) {
      std::pop_heap(s.order.begin(), s.order.end());
      const StateId state = s.order.back();
      s.order.pop_back();
      const uint32_t at = *s.index.FindOrInsert(state, &inserted);
      if (s.MatchesColumn(state, column, width)) continue;
      // Shift by the back-off weight and merge into the back-off state's list.
      const StateId lower = model.BackoffState(state);
      const double bo = model.BackoffWeight(state);
      std::vector<Entry> &moved = s.moved;
      moved.clear();
      moved.swap(s.lists[at].entries);
      for (Entry &e : moved) {
        e.log10_lm += bo;
        if (s.alpha_log10 != 0) e.g += s.alpha_log10 * bo;
      }
      uint32_t *slot = s.index.FindOrInsert(lower, &inserted);
      if (inserted) {
        *slot = static_cast<uint32_t>(s.lists.size());
        s.lists.push_back(StateList{lower, std::move(moved)});
        s.order.push_back(lower);
        std::push_heap(s.order.begin(), s.order.end());
      } else {
        std::vector<Entry> &dest = s.lists[*slot].entries;
        std::vector<Entry> &merged = s.merged;
        merged.clear();
        size_t a = 0, b = 0;
        while (merged.size() < static_cast<size_t>(p) && (a < dest.size() || b < moved.size())) {
          if (b == moved.size() || (a < dest.size() && s.BetterEntry(dest[a], moved[b], column)))
            merged.push_back(dest[a++]);
          else
            merged.push_back(moved[b++]);
        }
        dest.swap(merged);
      }
    }
    // 2. Expand the remaining states over the column's arcs; keep the p best per next state.
    s.index.Clear();
    for (const StateList &list : s.lists) {
      if (list.entries.empty()) continue;
      ++stats_.expansions;
      for (int j = 0; j < width; ++j) {
        const Transition t = s.Step(list.state, s.words[row + j]);
        const double add = lattice.scores[row + j] + (s.alpha_log10 != 0 ? s.alpha_log10 * t.log10_prob : 0.0);
        uint32_t *slot = s.index.FindOrInsert(t.next, &inserted);
        if (inserted) {
          *slot = static_cast<uint32_t>(s.next_lists.size());
          s.next_lists.push_back(StateList{t.next, {}});
        }
        std::vector<Entry> &heap = s.next_lists[*slot].entries;  // worst on top once full
        auto worse = [&](const Entry &x, const Entry &y) { return s.BetterEntry(x, y, column + 1); };
        for (const Entry &e : list.entries) {
          const double g = e.g + add;
          if (static_cast<int>(heap.size()) == p) {
            const Entry &worst = heap.front();
            if (!s.Better(g, e.node, j, worst.g, s.nodes[worst.node].parent, s.nodes[worst.node].arc, column + 1))
              break;  // entries are best first: the rest of this list cannot enter either
            std::pop_heap(heap.begin(), heap.end(), worse);
            heap.pop_back();
          }
          s.nodes.push_back(PathNode{e.node, j});
          heap.push_back(Entry{g, e.log10_lm + t.log10_prob, static_cast<int32_t>(s.nodes.size() - 1)});
          std::push_heap(heap.begin(), heap.end(), worse);
        }
      }
    }
    for (StateList &list : s.next_lists) {
      auto worse = [&](const Entry &x, const Entry &y) { return s.BetterEntry(x, y, column + 1); };
      std::sort_heap(list.entries.begin(), list.entries.end(), worse);
    }
    s.lists.swap(s.next_lists);
  }

  // 3. The p best complete paths over all final states.
  std::vector<Entry> &final_entries = s.final_entries;
  final_entries.clear();
  for (const StateList &list : s.lists)
    final_entries.insert(final_entries.end(), list.entries.begin(), list.entries.end());
  const size_t found = std::min<size_t>(p, final_entries.size());
  std::partial_sort(final_entries.begin(), final_entries.begin() + found, final_entries.end(),
                    [&](const Entry &x, const Entry &y) { return s.BetterEntry(x, y, h); });
  for (size_t r = 0; r < found; ++r) {
    const Entry &e = final_entries[r];
    // Draft scores are summed in position order, so that score == draft_score + alpha *
    // lm_score exactly as a reader recomputes it.
    int32_t *tokens = out.tokens + r * h;
    std::vector<int32_t> &arcs = s.seq_a;
    arcs.resize(h);
    for (int32_t node = e.node, d = h; d > 0; node = s.nodes[node].parent, --d) {
      arcs[d - 1] = s.nodes[node].arc;
      tokens[d - 1] = lattice.tokens[static_cast<size_t>(d - 1) * k + arcs[d - 1]];
    }
    double draft = 0.0;
    for (int d = 0; d < h; ++d) draft += lattice.scores[static_cast<size_t>(d) * k + arcs[d]];
    const double lm = e.log10_lm * kLn10;
    out.score[r] = alpha == 0 ? draft : draft + alpha * lm;
    out.draft_score[r] = draft;
    out.lm_score[r] = lm;
  }
  stats_.pops = s.nodes.size();
  return static_cast<int>(found);
}

void PBestBatch(const Model &model, const int32_t *tokens, const float *scores,
                const int32_t *widths, int64_t batch, int h, int k, const int32_t *context,
                const int64_t *context_offsets, bool bos, int p, double alpha, int threads,
                int32_t *out_tokens, double *out_score, double *out_draft, double *out_lm,
                int32_t *out_count, int64_t *out_pops, int64_t *out_transitions) {
  if (batch <= 0) return;
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, batch)));
  std::atomic<int64_t> next(0);
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&]() {
    try {
      PBestSearch search(model);
      while (true) {
        const int64_t b = next.fetch_add(1);
        if (b >= batch) break;
        LatticeView lattice;
        lattice.tokens = tokens + b * h * k;
        lattice.scores = scores + b * h * k;
        lattice.widths = widths ? widths + b * h : nullptr;
        lattice.h = h;
        lattice.k = k;
        StateId start = model.StartState(bos);
        if (context != nullptr) {
          const int64_t begin = context_offsets[b], end = context_offsets[b + 1];
          start = model.ContextState(context + begin, static_cast<size_t>(end - begin), bos);
        }
        PathsOut out;
        out.tokens = out_tokens + b * p * h;
        out.score = out_score + b * p;
        out.draft_score = out_draft + b * p;
        out.lm_score = out_lm + b * p;
        out_count[b] = search.Run(lattice, start, p, alpha, out);
        if (out_pops != nullptr) out_pops[b] = static_cast<int64_t>(search.stats().pops);
        if (out_transitions != nullptr)
          out_transitions[b] = static_cast<int64_t>(search.stats().transitions);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(batch);
    }
  };
  if (threads == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (int t = 0; t < threads; ++t) pool.emplace_back(work);
    for (std::thread &t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace latticekit
