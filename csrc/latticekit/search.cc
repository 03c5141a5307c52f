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

struct Node {
  double f;       // g + heuristic: priority
  double g;       // score so far: draft + alpha * ln p
  double log10_lm;
  int32_t parent;
  int32_t arc;    // arc index within its row
  int32_t pos;    // positions consumed
  StateId state;
};

}  // namespace

struct PBestSearch::Impl {
  explicit Impl(const Model &m) : model(m) {}

  const Model &model;
  std::vector<WordId> words;     // [h, k]
  std::vector<double> future;    // [h, k]: heuristic per arc
  std::vector<Node> nodes;
  std::vector<int32_t> heap;
  StampedTable<uint32_t> pops;         // (pos, state) -> times expanded
  StampedTable<Transition> memo;       // (state, word) -> transition
  std::vector<int32_t> path_a, path_b; // scratch for tie-breaking
  const LatticeView *lattice = nullptr;

  int32_t TokenAt(const Node &n) const {
    return lattice->tokens[static_cast<size_t>(n.pos - 1) * lattice->k + n.arc];
  }

  // Fills out with the token sequence of node i (root first).
  void Tokens(int32_t i, std::vector<int32_t> *out) const {
    out->clear();
    for (; nodes[i].pos > 0; i = nodes[i].parent) out->push_back(TokenAt(nodes[i]));
    std::reverse(out->begin(), out->end());
  }

  // Heap order: true when a should come out after b (lower score, or equal score and a
  // larger token sequence, a prefix counting as smaller than its extensions).
  bool Later(int32_t a, int32_t b) {
    const Node &x = nodes[a], &y = nodes[b];
    if (x.f != y.f) return x.f < y.f;
    Tokens(a, &path_a);
    Tokens(b, &path_b);
    return std::lexicographical_compare(path_b.begin(), path_b.end(), path_a.begin(), path_a.end());
  }

  void Push(const Node &n) {
    nodes.push_back(n);
    heap.push_back(static_cast<int32_t>(nodes.size() - 1));
    std::push_heap(heap.begin(), heap.end(), [this](int32_t a, int32_t b) { return Later(a, b); });
  }

  int32_t Pop() {
    std::pop_heap(heap.begin(), heap.end(), [this](int32_t a, int32_t b) { return Later(a, b); });
    int32_t i = heap.back();
    heap.pop_back();
    return i;
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
  const double alpha_log10 = alpha * kLn10;  // converts log10 model scores to alpha * ln

  // Heuristic: future[j * k + b] bounds the best score of columns j+1.. given that column
  // j took arc b, using for each adjacent pair of arcs the largest probability any history
  // ending in the first token gives the second (a bigram relaxation of the model, exact
  // over the model's states). Computed backwards over the lattice.
  s.words.resize(static_cast<size_t>(h) * k);
  s.future.assign(static_cast<size_t>(h) * k, 0.0);
  for (int i = 0; i < h; ++i) {
    const int width = lattice.widths ? lattice.widths[i] : k;
    if (width < 1 || width > k) throw InvalidArgument("lattice width out of range");
    for (int j = 0; j < width; ++j)
      s.words[static_cast<size_t>(i) * k + j] = model.TokenToWord(lattice.tokens[static_cast<size_t>(i) * k + j]);
  }
  for (int i = h - 2; i >= 0; --i) {
    const int width = lattice.widths ? lattice.widths[i] : k;
    const int next_width = lattice.widths ? lattice.widths[i + 1] : k;
    const size_t row = static_cast<size_t>(i) * k, next = row + k;
    for (int a = 0; a < width; ++a) {
      double best = -std::numeric_limits<double>::infinity();
      for (int b = 0; b < next_width; ++b) {
        double v = lattice.scores[next + b] + s.future[next + b];
        if (alpha_log10 > 0) v += alpha_log10 * model.PairUpperBound(s.words[row + a], s.words[next + b]);
        best = std::max(best, v);
      }
      s.future[row + a] = best;
    }
  }
  double root_heuristic = -std::numeric_limits<double>::infinity();
  {
    const int width = lattice.widths ? lattice.widths[0] : k;
    for (int b = 0; b < width; ++b) {
      double v = lattice.scores[b] + s.future[b];
      if (alpha_log10 > 0) v += alpha_log10 * model.WordUpperBound(s.words[b]);
      root_heuristic = std::max(root_heuristic, v);
    }
  }

  s.nodes.clear();
  s.heap.clear();
  s.pops.Clear();
  s.memo.Clear();
  stats_ = SearchStats();

  Node root{root_heuristic, 0.0, 0.0, -1, -1, 0, start};
  s.Push(root);
  int found = 0;
  while (!s.heap.empty() && found < p) {
    const int32_t i = s.Pop();
    ++stats_.pops;
    const Node node = s.nodes[i];
    if (node.pos == h) {
      // A complete path: write it out, best first. Draft scores are summed in position
      // order so that score == draft_score + alpha * lm_score as a reader computes it.
      int32_t *tokens = out.tokens + static_cast<size_t>(found) * h;
      std::vector<int32_t> &arcs = s.path_a;
      arcs.assign(h, 0);
      for (int32_t j = i; s.nodes[j].pos > 0; j = s.nodes[j].parent) {
        const Node &n = s.nodes[j];
        arcs[n.pos - 1] = n.arc;
        tokens[n.pos - 1] = s.TokenAt(n);
      }
      double draft = 0.0;
      for (int pos = 0; pos < h; ++pos) draft += lattice.scores[static_cast<size_t>(pos) * k + arcs[pos]];
      const double lm = node.log10_lm * kLn10;
      out.score[found] = alpha == 0 ? draft : draft + alpha * lm;
      out.draft_score[found] = draft;
      out.lm_score[found] = lm;
      ++found;
      continue;
    }
    bool inserted;
    uint32_t *count = s.pops.FindOrInsert((uint64_t(node.pos) << 32) | node.state, &inserted);
    if (++*count > static_cast<uint32_t>(p)) continue;
    ++stats_.expansions;
    const int width = lattice.widths ? lattice.widths[node.pos] : k;
    const size_t row = static_cast<size_t>(node.pos) * k;
    for (int j = 0; j < width; ++j) {
      const WordId w = s.words[row + j];
      Transition *t = s.memo.FindOrInsert((uint64_t(node.state) << 32) | w, &inserted);
      if (inserted) {
        t->log10_prob = model.Advance(node.state, w, &t->next);
        ++stats_.transitions;
      }
      Node child;
      child.g = node.g + lattice.scores[row + j];
      if (alpha_log10 != 0) child.g += alpha_log10 * t->log10_prob;
      child.f = child.g + s.future[row + j];
      child.log10_lm = node.log10_lm + t->log10_prob;
      child.parent = i;
      child.arc = j;
      child.pos = node.pos + 1;
      child.state = t->next;
      s.Push(child);
    }
  }
  return found;
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
