#include "latticekit/search.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "latticekit/arc_lookup.h"
#include "latticekit/errors.h"
#include "latticekit/stamped_map.h"

namespace latticekit {
namespace {

constexpr double kLn10 = 2.302585092994045684;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int32_t kUnreached = -1;  // a consuming cell that no prefix reaches
constexpr StateId kNoState = 0xFFFFFFFFu;
// No partial score may exceed this in magnitude (PBestSearch::Run bounds alpha by it): a sum of two such
// scores (pass 2's V + W) and the rounding margin stay far from double's 1.8e308.
constexpr double kScoreLimit = 1e300;

using internal::StampedMap;

// A model state in the back-off tree of one column: an active state (one that some
// prefix reaches) or a back-off ancestor of one.
struct TreeNode {
  StateId state;
  int32_t parent;  // node index of the back-off state; -1 for the root
  int32_t slot;    // the active state's slot, or -1 for an ancestor only
  float log10_bo;  // back-off weight to the parent
  uint32_t arc_begin, arc_end;
  uint32_t use_begin, use_end;  // its consuming cells in `uses`
};

// A consuming cell: tree node x has an explicit n-gram for the word of column arc j.
// The root consumes every arc (its cells are j = 0 .. width - 1, in order); any other
// node only the few words it has, so a column costs its consuming cells, not nodes x arcs.
struct Use {
  uint32_t node;    // its tree node
  int32_t j;
  uint32_t arc;     // the n-gram's arc in the model
  StateId next_state;  // the state after the word (kNoState until needed)
  int32_t next;     // successor slot, or kUnreached
  double add;       // draft + al * log10 p(word | node), plus any back-off paid on arrival
};

// Groups the items first .. last - 1 by key (< num_keys), counting-sort style: the items of
// key g are (*members)[(*begin)[g] .. (*begin)[g + 1]), ascending.
template <typename KeyOf>
void GroupByKey(uint32_t first, uint32_t last, size_t num_keys, KeyOf key_of,
                std::vector<uint32_t> *begin, std::vector<uint32_t> *members) {
  begin->assign(num_keys + 1, 0);
  for (uint32_t i = first; i < last; ++i) ++(*begin)[key_of(i) + 1];
  for (size_t g = 0; g < num_keys; ++g) (*begin)[g + 1] += (*begin)[g];
  members->resize(last - first);
  for (uint32_t i = first; i < last; ++i) (*members)[(*begin)[key_of(i)]++] = i;
  for (size_t g = num_keys; g > 0; --g) (*begin)[g] = (*begin)[g - 1];
  (*begin)[0] = 0;
}

struct Column {
  uint32_t node_begin = 0, node_end = 0;  // its tree nodes, parents before children
  int width = 0;
};

// Pass 3: a partial path, its token sequence being the chain of path nodes ending at node.
struct Entry {
  double g;
  int32_t node;
};

struct PathNode {
  int32_t parent;  // -1 for the empty path
  int32_t arc;     // arc index within its column
};

}  // namespace

// The search runs in up to three passes over the lattice's columns, one class each. They
// share a SearchGraph: the lattice, the slots with pass 1's best prefixes, the columns' trees
// and consuming cells, and the tie-break's arc-sequence buffers seq_a/seq_b (which pass 1's
// PrefixLess and PBestSearch::Run's winner choice use). Each pass keeps its other scratch to
// itself; BackwardPass publishes completion and cell_of, which PBestPass reads.
//
// Pass 1 (ForwardPass: forward, best path per state). For each column it builds the
// back-off tree of the states the prefixes reach (the "active" states) and resolves every
// (tree node, column arc) against the model once: either the node has an explicit n-gram
// for the arc's word (the node "consumes" the arc) or the arc backs off to the parent. A
// prefix in active state d takes arc j exactly at the nearest node on d's back-off chain
// that consumes j, after paying the back-off weights on the way. Only the consuming cells
// are kept (Flow says how their best prefixes are found), and only they create successor
// states: the work per column is its nodes plus its consuming cells, not nodes x arcs.
//
// For p = 1 that is the answer. For p > 1, pass 2 (BackwardPass) runs the consuming cells
// backwards to get, for every state, the best completion score W, and from the best path
// through each state a lower bound tau on the p-th best path score (paths through distinct
// states of a column are distinct). Pass 3 (PBestPass) is the p-best dynamic programme over
// (position, state), restricted to prefixes g with g + W >= tau: it touches little more
// than the p best paths themselves.
namespace {

// What the passes share: the lattice in the model's words; the active states after each
// position ("slots") with pass 1's best prefix into each; the columns' back-off trees and
// their consuming cells, which pass 1 builds and passes 2 and 3 read.
struct SearchGraph {
  explicit SearchGraph(const Model &m) : model(m) {}

  const Model &model;
  const LatticeView *lattice = nullptr;
  int h = 0, k = 0;
  double al = 0;  // alpha * ln 10: a log10 model weight -> its share of g
  SearchStats *stats = nullptr;

  std::vector<WordId> words;   // [h, k]
  std::vector<double> draft;   // [h, k]
  std::vector<int> widths;     // [h]

  // Slots: the active states after t tokens, t = 0..h; slots of t in [slot_begin[t], slot_begin[t + 1]).
  std::vector<uint32_t> slot_begin;
  std::vector<StateId> slot_state;
  std::vector<int32_t> slot_node;    // its tree node in column t (t < h)
  std::vector<double> best;          // pass 1: best prefix score V
  std::vector<int32_t> back_slot;    // pass 1: the best prefix's previous slot and arc
  std::vector<int32_t> back_arc;

  std::vector<Column> columns;
  std::vector<TreeNode> nodes;
  // Every column's consuming cells, grouped by node: the first num_uses of uses (which
  // only grows, so that adding a cell is a plain store).
  std::vector<Use> uses;
  uint32_t num_uses = 0;

  std::vector<int32_t> seq_a, seq_b;  // PrefixLess's arc sequences

  int32_t Token(int t, int j) const { return lattice->tokens[static_cast<size_t>(t) * k + j]; }

  // ---- Ties: partial paths of equal score order by token sequence, then arc sequence.

  // The arcs of pass 1's best prefix in slot s after t tokens.
  void PrefixArcs(int t, int32_t s, std::vector<int32_t> *out) const {
    out->resize(t);
    for (int d = t; d > 0; --d) {
      (*out)[d - 1] = back_arc[s];
      s = back_slot[s];
    }
  }
  bool ArcsLess(const std::vector<int32_t> &a, const std::vector<int32_t> &b) const {
    for (size_t d = 0; d < a.size(); ++d) {
      const int32_t ta = Token(static_cast<int>(d), a[d]), tb = Token(static_cast<int>(d), b[d]);
      if (ta != tb) return ta < tb;
    }
    return a < b;
  }
  // Whether best prefix (t, s1) extended by arc j1 orders before (t, s2) extended by j2.
  bool PrefixLess(int t, int32_t s1, int32_t j1, int32_t s2, int32_t j2) {
    PrefixArcs(t, s1, &seq_a);
    PrefixArcs(t, s2, &seq_b);
    if (j1 >= 0) {
      seq_a.push_back(j1);
      seq_b.push_back(j2);
    }
    return ArcsLess(seq_a, seq_b);
  }

  // The consuming cell of arc j at node x, or -1 when x backs off for it.
  int64_t FindUse(uint32_t x, int32_t j) const {
    const TreeNode &node = nodes[x];
    if (node.parent < 0) return node.use_begin + j;
    for (uint32_t u = node.use_begin; u < node.use_end; ++u)
      if (uses[u].j == j) return u;
    return -1;
  }
};

// ---- Pass 1: the columns' trees and consuming cells, and the best prefix per slot.
class ForwardPass {
 public:
  explicit ForwardPass(SearchGraph &graph)
      : graph(graph), model(graph.model), lookup16(graph.model), lookup32(graph.model) {}

  // Runs every column from the slot of start.
  void Run(StateId start) {
    const int h = graph.h;
    graph.slot_begin.assign(h + 2, 0);
    graph.slot_state.assign(1, start);
    graph.best.assign(1, 0.0);
    graph.back_slot.assign(1, -1);
    graph.back_arc.assign(1, -1);
    graph.slot_begin[1] = 1;
    graph.columns.resize(h);
    graph.nodes.clear();
    graph.num_uses = 0;
    for (int t = 0; t < h; ++t) {
      graph.slot_node.resize(graph.slot_state.size());
      Extend(t);
    }
    graph.stats->expansions = graph.nodes.size();
  }

 private:
  // Keeps the better of (value, src) and (v, v_src), best prefixes after t tokens.
  void Offer(int t, double *value, int32_t *src, double v, int32_t v_src) {
    if (v > *value || (v == *value && v != kNegInf && graph.PrefixLess(t, v_src, -1, *src, -1))) {
      *value = v;
      *src = v_src;
    }
  }

  int32_t NextSlot(StateId state) {
    bool inserted;
    const uint32_t s = slot_of_state.FindOrInsert(state, static_cast<uint32_t>(graph.slot_state.size()), &inserted);
    if (inserted) {
      graph.slot_state.push_back(state);
      graph.best.push_back(kNegInf);
      graph.back_slot.push_back(-1);
      graph.back_arc.push_back(-1);
    }
    return static_cast<int32_t>(s);
  }

  // The tree of column t: active slots plus their back-off ancestors, parents first.
  void BuildTree(int t) {
    Column &col = graph.columns[t];
    col.width = graph.widths[t];
    // Every prefix score is finite (PBestSearch::Run bounds alpha, the model's values are
    // finite), so the root takes every arc of a reached state and every column has a
    // reached state.
    if (graph.slot_begin[t] == graph.slot_begin[t + 1])
      throw std::logic_error("the search reached no state at position " + std::to_string(t));
    node_of_state.Clear();
    pending.clear();
    bool inserted;
    for (uint32_t s = graph.slot_begin[t]; s < graph.slot_begin[t + 1]; ++s) {
      node_of_state.FindOrInsert(graph.slot_state[s], static_cast<uint32_t>(pending.size()), &inserted);
      pending.push_back(Pending{graph.slot_state[s], static_cast<int32_t>(s), 0});
    }
    const int order = model.order();
    order_count.assign(order, 0);
    for (const Pending &q : pending) model.PrefetchState(q.state);
    for (size_t i = 0; i < pending.size(); ++i) {
      const StateId state = pending[i].state;
      pending[i].order = model.HistoryLength(state);
      ++order_count[pending[i].order];
      if (state == kRootState) continue;
      const StateId lower = model.BackoffState(state);
      node_of_state.FindOrInsert(lower, static_cast<uint32_t>(pending.size()), &inserted);
      if (inserted) {
        pending.push_back(Pending{lower, -1, 0});
        model.PrefetchState(lower);  // read when the loop reaches it
      }
    }
    // Counting sort by history length: a parent's history is shorter than its child's.
    uint32_t at = 0;
    for (int n = 0; n < order; ++n) {
      const uint32_t c = order_count[n];
      order_count[n] = at;
      at += c;
    }
    rank.resize(pending.size());
    for (size_t i = 0; i < pending.size(); ++i) rank[i] = order_count[pending[i].order]++;
    const uint32_t n = static_cast<uint32_t>(pending.size());
    col.node_begin = static_cast<uint32_t>(graph.nodes.size());
    col.node_end = col.node_begin + n;
    graph.nodes.resize(col.node_end);
    for (size_t i = 0; i < pending.size(); ++i) {
      const Pending &q = pending[i];
      TreeNode &node = graph.nodes[col.node_begin + rank[i]];
      node.state = q.state;
      node.slot = q.slot;
      node.arc_begin = model.ArcBegin(q.state);
      node.arc_end = model.ArcEnd(q.state);
      model.PrefetchArc(node.arc_begin);
      if (q.state == kRootState) {
        node.parent = -1;
        node.log10_bo = 0.0f;
      } else {
        node.parent = static_cast<int32_t>(col.node_begin + rank[*node_of_state.Find(model.BackoffState(q.state))]);
        node.log10_bo = model.BackoffWeight(q.state);
      }
      if (q.slot >= 0) graph.slot_node[q.slot] = static_cast<int32_t>(col.node_begin + rank[i]);
    }
    // Every node but the root (local index 0) is the child of its parent.
    GroupByKey(1, n, n, [&](uint32_t i) { return graph.nodes[col.node_begin + i].parent - col.node_begin; },
               &child_begin, &children);
  }

  void AddUse(uint32_t x, int32_t j, uint32_t a) {
    std::vector<Use> &uses = graph.uses;
    if (graph.num_uses == uses.size()) uses.resize(std::max<size_t>(1024, 2 * uses.size()));
    uses[graph.num_uses++] = Use{x, j, a, kNoState, kUnreached, 0.0};
  }

  // The consuming cells of column t: for every node, the column arcs whose word it has.
  template <typename Word>
  void FindArcs(int t, ArcSetLookup<Word> &lookup) {
    const Column &col = graph.columns[t];
    const int width = col.width;
    const WordId *row = &graph.words[static_cast<size_t>(t) * graph.k];
    column_word.Clear();
    same_word_next.assign(width, -1);
    chain_tail.resize(width);
    column_words.clear();
    bool inserted;
    for (int j = 0; j < width; ++j) {  // chains list a word's arcs ascending
      const uint32_t first = column_word.FindOrInsert(row[j], static_cast<uint32_t>(j), &inserted);
      if (inserted) {
        column_words.push_back(row[j]);
        chain_tail[j] = j;
      } else {
        same_word_next[chain_tail[first]] = j;
        chain_tail[first] = j;
      }
    }
    std::sort(column_words.begin(), column_words.end());
    lookup.SetWords(column_words);
    for (uint32_t x = col.node_begin; x < col.node_end; ++x) {
      TreeNode &node = graph.nodes[x];
      node.use_begin = graph.num_uses;
      if (node.state == kRootState) {
        for (int j = 0; j < width; ++j) AddUse(x, j, row[j]);  // root arc w is word w
      } else {
        lookup.ForEachArc(node.arc_begin, node.arc_end, [&](uint32_t a, WordId w) {
          // Every column arc of the word, from the first.
          for (int32_t j = static_cast<int32_t>(*column_word.Find(w)); j >= 0; j = same_word_next[j])
            AddUse(x, j, a);
        });
      }
      node.use_end = graph.num_uses;
    }
  }

  // The state after the word of consuming cell u at node x.
  StateId NextState(uint32_t x, uint32_t u) {
    Use &use = graph.uses[u];
    if (use.next_state != kNoState) return use.next_state;
    StateId next;
    if (model.order() == 1) {
      next = kRootState;
    } else if (!model.IsTopArc(use.arc)) {
      next = model.Normalize(model.ArcState(use.arc));
    } else {
      // Highest order: the longest suffix of (history, word) that is a state, which is
      // where the nearest ancestor consuming the word leads.
      uint32_t y = static_cast<uint32_t>(graph.nodes[x].parent);
      int64_t v;
      while ((v = graph.FindUse(y, use.j)) < 0) y = static_cast<uint32_t>(graph.nodes[y].parent);
      next = NextState(y, static_cast<uint32_t>(v));
    }
    graph.uses[u].next_state = next;
    return next;
  }

  // Extends the best prefix f (from slot src) through consuming cell u at node x.
  void Consume(int t, uint32_t x, uint32_t u, double f, int32_t src) {
    ++graph.stats->transitions;
    if (f == kNegInf) return;  // stays kUnreached
    const int32_t j = graph.uses[u].j;
    // A successor without arcs backs off whatever comes next: unless the lattice ends
    // here, go to its back-off state now and pay the weight on arrival.
    StateId state = NextState(x, u);
    double add = graph.draft[static_cast<size_t>(t) * graph.k + j] + graph.al * model.ArcLog10Prob(graph.uses[u].arc);
    if (t + 1 < graph.h && state != kRootState && model.ArcBegin(state) == model.ArcEnd(state)) {
      double log10_bo = 0.0;
      do {
        log10_bo += model.BackoffWeight(state);
        state = model.BackoffState(state);
      } while (state != kRootState && model.ArcBegin(state) == model.ArcEnd(state));
      add += graph.al * log10_bo;
    }
    const int32_t next = NextSlot(state);
    graph.uses[u].add = add;
    graph.uses[u].next = next;
    ++graph.stats->pops;
    const double v = f + add;
    if (v > graph.best[next] ||
        (v == graph.best[next] && graph.PrefixLess(t, src, j, graph.back_slot[next], graph.back_arc[next]))) {
      graph.best[next] = v;
      graph.back_slot[next] = src;
      graph.back_arc[next] = j;
    }
  }

  // Extends the prefixes by column t.
  void Extend(int t) {
    BuildTree(t);
    if (model.WideWords())
      FindArcs(t, lookup32);
    else
      FindArcs(t, lookup16);
    Flow(t);
  }

  // A prefix in active state d takes arc j at the nearest node on d's back-off chain that
  // consumes j, after paying the back-off weights on the way. So the best prefix reaching
  // a consuming cell (x, j) is the best over x's subtree, cut below the other consumers
  // of j. Per node, up() is that best over the whole subtree; for arc j, only the nodes on
  // the chains of j's (few) consumers differ from it, and only those are recomputed.
  void Flow(int t) {
    const std::vector<TreeNode> &nodes = graph.nodes;
    const std::vector<Use> &uses = graph.uses;
    const double al = graph.al;
    const Column &col = graph.columns[t];
    const uint32_t nb = col.node_begin, n = col.node_end - nb;
    const int width = col.width;
    up.resize(n);
    up_src.resize(n);
    contrib.resize(n);
    fl.resize(n);
    fl_src.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      const int32_t s = nodes[nb + i].slot;
      up[i] = s >= 0 ? graph.best[s] : kNegInf;
      up_src[i] = s;
    }
    for (uint32_t i = n; i-- > 1;) {  // children before parents; only the root lacks one
      const TreeNode &node = nodes[nb + i];
      contrib[i] = up[i] == kNegInf ? kNegInf : up[i] + al * node.log10_bo;
      const uint32_t parent = static_cast<uint32_t>(node.parent) - nb;
      Offer(t, &up[parent], &up_src[parent], contrib[i], up_src[i]);
    }
    // Children best first, so that the best child outside a flow problem is found early.
    for (uint32_t x = 0; x < n; ++x)
      if (child_begin[x + 1] - child_begin[x] > 1)
        std::sort(children.begin() + child_begin[x], children.begin() + child_begin[x + 1],
                  [&](uint32_t a, uint32_t b) { return contrib[a] > contrib[b]; });

    // The consuming cells of other nodes than the root, by arc.
    const TreeNode &root = nodes[nb];
    GroupByKey(root.use_end, graph.num_uses, width,
               [&](uint32_t u) { return uses[u].j; }, &word_begin, &word_uses);
    if (involved.size() < n) {
      involved.assign(n, 0);
      consumer.assign(n, 0);
      epoch = 0;
    }
    slot_of_state.Clear();  // the successor slots of this column
    for (int j = 0; j < width; ++j) {
      MarkInvolved(nb, j);
      double root_flow = up[0];
      int32_t root_src = up_src[0];
      if (!involved_list.empty()) {
        SolveFlows(t, nb);
        for (uint32_t w = word_begin[j]; w < word_begin[j + 1]; ++w) {
          const uint32_t u = word_uses[w];
          const uint32_t x = uses[u].node - nb;
          Consume(t, nb + x, u, fl[x], fl_src[x]);
        }
        root_flow = fl[0];
        root_src = fl_src[0];
      }
      Consume(t, nb, root.use_begin + j, root_flow, root_src);
    }
    graph.slot_begin[t + 2] = static_cast<uint32_t>(graph.slot_state.size());
  }

  // Arc j's flow problem: its consumers (other than the root) and the nodes on their
  // back-off chains, in involved_list; consumer[x] and involved[x] are epoch for them.
  void MarkInvolved(uint32_t nb, int j) {
    if (++epoch == 0) {  // wrapped
      std::fill(involved.begin(), involved.end(), 0);
      std::fill(consumer.begin(), consumer.end(), 0);
      epoch = 1;
    }
    involved_list.clear();
    for (uint32_t w = word_begin[j]; w < word_begin[j + 1]; ++w) {
      const uint32_t u = word_uses[w];
      uint32_t x = graph.uses[u].node - nb;
      consumer[x] = epoch;
      while (involved[x] != epoch) {
        involved[x] = epoch;
        involved_list.push_back(x);
        if (x == 0) break;
        x = static_cast<uint32_t>(graph.nodes[nb + x].parent) - nb;
      }
    }
  }

  // fl[x]: the best prefix reaching involved node x for the current arc, over x's subtree
  // cut below the arc's other consumers (children first; an uninvolved child brings its
  // whole subtree's best, contrib).
  void SolveFlows(int t, uint32_t nb) {
    const std::vector<TreeNode> &nodes = graph.nodes;
    std::sort(involved_list.begin(), involved_list.end(), std::greater<uint32_t>());
    for (uint32_t x : involved_list) {
      const int32_t s = nodes[nb + x].slot;
      fl[x] = s >= 0 ? graph.best[s] : kNegInf;
      fl_src[x] = s;
    }
    for (uint32_t x : involved_list) {  // children first
      for (uint32_t i = child_begin[x]; i < child_begin[x + 1]; ++i) {
        const uint32_t c = children[i];
        if (contrib[c] == kNegInf || contrib[c] < fl[x]) break;  // nothing later does better
        if (involved[c] != epoch) Offer(t, &fl[x], &fl_src[x], contrib[c], up_src[c]);
      }
      if (x != 0 && consumer[x] != epoch && fl[x] != kNegInf) {
        const uint32_t parent = static_cast<uint32_t>(nodes[nb + x].parent) - nb;
        Offer(t, &fl[parent], &fl_src[parent], fl[x] + graph.al * nodes[nb + x].log10_bo, fl_src[x]);
      }
    }
  }

  SearchGraph &graph;
  const Model &model;
  ArcSetLookup<uint16_t> lookup16;  // for a model without WideWords()
  ArcSetLookup<uint32_t> lookup32;

  // Scratch, per column; node-indexed arrays are local (index - node_begin).
  StampedMap node_of_state, slot_of_state;
  struct Pending {
    StateId state;
    int32_t slot;
    int order;
  };
  std::vector<Pending> pending;
  std::vector<uint32_t> rank;
  std::vector<uint32_t> order_count;
  std::vector<uint32_t> child_begin, children;  // children of each node (CSR), best first
  std::vector<double> up, contrib, fl;
  std::vector<int32_t> up_src, fl_src;
  std::vector<uint32_t> involved, consumer;  // stamps: in this arc's flow problem / consumes it
  uint32_t epoch = 0;
  std::vector<uint32_t> word_begin, word_uses, involved_list;
  StampedMap column_word;               // word -> first arc j with it
  std::vector<int32_t> same_word_next;  // next arc j with the same word, or -1
  std::vector<int32_t> chain_tail;      // last arc j of the chain a first arc starts
  std::vector<WordId> column_words;     // the column's distinct words, ascending
};

// ---- Pass 2: best completion per slot, and tau.
//
// From node x, arc j continues at the nearest consuming cell on x's back-off chain, after
// the chain's back-off weights: per node and arc, the cell's value if x consumes the arc,
// else its parent's after x's back-off weight (parents first, one row of the column's
// arcs per node). W(d) is the best of d's row. tau is the p-th best of V + W over the
// slots of a column (distinct states, so distinct paths), the best over columns.
class BackwardPass {
 public:
  explicit BackwardPass(const SearchGraph &graph) : graph(graph) {}

  std::vector<double> completion;  // best completion score W, per slot
  // [nodes, k]: the consuming cell that arc j reaches from node x (for pass 3).
  std::vector<int32_t> cell_of;

  // Returns tau.
  double Run(int p) {
    const std::vector<TreeNode> &nodes = graph.nodes;
    const int h = graph.h, k = graph.k;
    const uint32_t total = static_cast<uint32_t>(graph.slot_state.size());
    completion.assign(total, kNegInf);
    for (uint32_t s = graph.slot_begin[h]; s < graph.slot_begin[h + 1]; ++s) completion[s] = 0.0;
    double tau = kNegInf;
    cell_of.resize(nodes.size() * k);
    for (int t = h - 1; t >= 0; --t) {
      const Column &col = graph.columns[t];
      const uint32_t nb = col.node_begin, n = col.node_end - nb;
      const int width = col.width;
      rows.resize(static_cast<size_t>(n) * width);
      top.clear();  // min-heap of the p best V + W of this column
      for (uint32_t x = 0; x < n; ++x) {
        const TreeNode &node = nodes[nb + x];
        double *row = &rows[static_cast<size_t>(x) * width];
        int32_t *cell = &cell_of[static_cast<size_t>(nb + x) * k];
        if (x > 0) {
          const double bo = graph.al * node.log10_bo;
          const double *parent_row = &rows[static_cast<size_t>(node.parent - nb) * width];
          for (int j = 0; j < width; ++j) row[j] = parent_row[j] + bo;
          std::copy_n(&cell_of[static_cast<size_t>(node.parent) * k], width, cell);
        }
        for (uint32_t u = node.use_begin; u < node.use_end; ++u) {
          const Use &use = graph.uses[u];
          row[use.j] = use.next >= 0 ? use.add + completion[use.next] : kNegInf;
          cell[use.j] = static_cast<int32_t>(u);
        }
        if (node.slot < 0) continue;
        double w = kNegInf;
        for (int j = 0; j < width; ++j) w = std::max(w, row[j]);
        completion[node.slot] = w;
        const double v = graph.best[node.slot] + w;
        if (static_cast<int>(top.size()) < p) {
          top.push_back(v);
          std::push_heap(top.begin(), top.end(), std::greater<double>());
        } else if (v > top.front()) {
          std::pop_heap(top.begin(), top.end(), std::greater<double>());
          top.back() = v;
          std::push_heap(top.begin(), top.end(), std::greater<double>());
        }
      }
      if (static_cast<int>(top.size()) == p) tau = std::max(tau, top.front());
    }
    return tau;
  }

 private:
  const SearchGraph &graph;
  std::vector<double> rows;  // [column nodes, width]
  std::vector<double> top;
};

// ---- Pass 3: the p best prefixes per slot, for prefixes that can still make the top p.
class PBestPass {
 public:
  PBestPass(const SearchGraph &graph, const BackwardPass &backward_pass)
      : graph(graph), backward(backward_pass) {}

  void Run(int p, double threshold) {
    const std::vector<TreeNode> &nodes = graph.nodes;
    const std::vector<Use> &uses = graph.uses;
    const std::vector<double> &completion = backward.completion;
    const int h = graph.h, k = graph.k;
    const uint32_t total = static_cast<uint32_t>(graph.slot_state.size());
    if (lists.size() < total) lists.resize(total);
    for (uint32_t s = 0; s < total; ++s) lists[s].clear();
    path_nodes.clear();
    path_nodes.push_back(PathNode{-1, -1});
    lists[graph.slot_begin[0]].push_back(Entry{0.0, 0});
    double hops[64];
    for (int t = 0; t < h; ++t) {
      const Column &col = graph.columns[t];
      const int width = col.width;
      for (uint32_t s = graph.slot_begin[t]; s < graph.slot_begin[t + 1]; ++s) {
        std::vector<Entry> &list = lists[s];
        if (list.empty() || list[0].g + completion[s] < threshold) continue;
        const uint32_t x = static_cast<uint32_t>(graph.slot_node[s]);
        for (int j = 0; j < width; ++j) {
          const uint32_t u = static_cast<uint32_t>(backward.cell_of[static_cast<size_t>(x) * k + j]);
          int n_hops = 0;
          for (uint32_t y = x; y != uses[u].node; y = static_cast<uint32_t>(nodes[y].parent))
            hops[n_hops++] = graph.al * nodes[y].log10_bo;
          const int32_t next = uses[u].next;
          if (next < 0) continue;  // no prefix reaches the cell
          const double add = uses[u].add;
          const double rest = completion[next];
          std::vector<Entry> &heap = lists[next];  // worst on top once full
          auto worse = [&](const Entry &a, const Entry &b) { return BetterEntry(a, b, t + 1); };
          for (const Entry &e : list) {
            double score = e.g;
            for (int i = 0; i < n_hops; ++i) score += hops[i];
            score += add;
            if (score + rest < threshold) break;  // entries are best first
            if (static_cast<int>(heap.size()) == p) {
              const Entry &worst = heap.front();
              if (!Better(score, e.node, j, worst.g, path_nodes[worst.node].parent, path_nodes[worst.node].arc, t + 1))
                break;
              std::pop_heap(heap.begin(), heap.end(), worse);
              heap.pop_back();
            }
            path_nodes.push_back(PathNode{e.node, j});
            heap.push_back(Entry{score, static_cast<int32_t>(path_nodes.size() - 1)});
            std::push_heap(heap.begin(), heap.end(), worse);
          }
        }
      }
      for (uint32_t s = graph.slot_begin[t + 1]; s < graph.slot_begin[t + 2]; ++s) {
        auto worse = [&](const Entry &a, const Entry &b) { return BetterEntry(a, b, t + 1); };
        std::sort_heap(lists[s].begin(), lists[s].end(), worse);
      }
    }
    graph.stats->pops += path_nodes.size() - 1;
  }

  // The up to p best complete paths, best first; returns how many.
  size_t Best(int p) {
    const int h = graph.h;
    final_entries.clear();
    for (uint32_t f = graph.slot_begin[h]; f < graph.slot_begin[h + 1]; ++f)
      final_entries.insert(final_entries.end(), lists[f].begin(), lists[f].end());
    const size_t found = std::min<size_t>(p, final_entries.size());
    std::partial_sort(final_entries.begin(), final_entries.begin() + found, final_entries.end(),
                      [&](const Entry &x, const Entry &y) { return BetterEntry(x, y, h); });
    return found;
  }
  // The arcs of Best's r-th path.
  void BestArcs(size_t r, std::vector<int32_t> *out) const { PathArcs(final_entries[r].node, graph.h, out); }

 private:
  void PathArcs(int32_t node, int depth, std::vector<int32_t> *out) const {
    out->resize(depth);
    for (int d = depth; d > 0; --d) {
      (*out)[d - 1] = path_nodes[node].arc;
      node = path_nodes[node].parent;
    }
  }
  // The strict order of partial paths of equal length: higher g first, then sequence.
  // A candidate not yet in path_nodes is (parent node, arc at column depth - 1).
  bool Better(double ga, int32_t parent_a, int32_t arc_a, double gb, int32_t parent_b,
              int32_t arc_b, int depth) {
    if (ga != gb) return ga > gb;
    PathArcs(parent_a, depth - 1, &seq_a);
    PathArcs(parent_b, depth - 1, &seq_b);
    seq_a.push_back(arc_a);
    seq_b.push_back(arc_b);
    return graph.ArcsLess(seq_a, seq_b);
  }
  bool BetterEntry(const Entry &a, const Entry &b, int depth) {
    if (a.g != b.g) return a.g > b.g;
    return Better(a.g, path_nodes[a.node].parent, path_nodes[a.node].arc, b.g,
                  path_nodes[b.node].parent, path_nodes[b.node].arc, depth);
  }

  const SearchGraph &graph;
  const BackwardPass &backward;
  std::vector<PathNode> path_nodes;
  std::vector<std::vector<Entry>> lists;  // per slot: its best prefixes
  std::vector<Entry> final_entries;
  std::vector<int32_t> seq_a, seq_b;
};

}  // namespace

struct PBestSearch::Impl {
  explicit Impl(const Model &model)
      : graph(model), forward(graph), backward(graph), pbest(graph, backward) {}

  SearchGraph graph;
  ForwardPass forward;
  BackwardPass backward;
  PBestPass pbest;
  std::vector<int32_t> arcs;  // the path being written
};

PBestSearch::PBestSearch(const Model &model) : impl_(new Impl(model)) {}
PBestSearch::~PBestSearch() = default;

int PBestSearch::Run(const LatticeView &lattice, StateId start, int p, double alpha,
                     const PathsOut &out) {
  SearchGraph &graph = impl_->graph;
  const Model &model = graph.model;
  const int h = lattice.h, k = lattice.k;
  if (p < 1) throw InvalidArgument("p must be at least 1");
  if (h < 1 || k < 1) throw InvalidArgument("a lattice needs at least one position and one arc");
  if (!(alpha >= 0) || std::isinf(alpha)) throw InvalidArgument("alpha must be finite and >= 0");
  if (model.order() > 64)  // pass 3 keeps the back-off hops of one arc in a fixed array
    throw InvalidArgument("models of order above 64 are not supported by the search");
  // A path of h tokens pays at most h log-probabilities and h + order - 1 back-off weights
  // (each weight shortens the history by one word, each token lengthens it by at most one);
  // partial scores of passes 1 and 2 add at most order - 1 weights more. Bounding alpha
  // keeps every one of them far from overflow, so no score is ever inf or NaN.
  const double per_term = model.MaxAbsLog10Prob() + model.MaxAbsLog10Backoff();
  const double max_alpha =
      per_term > 0 ? kScoreLimit / (kLn10 * per_term * (double(h) + 2.0 * model.order())) : kScoreLimit;
  if (alpha > max_alpha) {
    char message[256];
    std::snprintf(message, sizeof message,
                  "alpha=%.6g would overflow the path scores: with this model (|log10 p| up to "
                  "%.6g, |log10 back-off| up to %.6g) and h=%d positions, alpha must be at most %.6g",
                  alpha, model.MaxAbsLog10Prob(), model.MaxAbsLog10Backoff(), h, max_alpha);
    throw InvalidArgument(message);
  }
  graph.lattice = &lattice;
  graph.h = h;
  graph.k = k;
  graph.al = alpha * kLn10;
  graph.stats = &stats_;
  stats_ = SearchStats();
  graph.words.resize(static_cast<size_t>(h) * k);
  graph.draft.resize(static_cast<size_t>(h) * k);
  graph.widths.resize(h);
  double max_draft = 0.0;
  for (int i = 0; i < h; ++i) {
    const int width = lattice.widths ? lattice.widths[i] : k;
    if (width < 1 || width > k) throw InvalidArgument("lattice width out of range");
    graph.widths[i] = width;
    for (int j = 0; j < width; ++j) {
      const size_t at = static_cast<size_t>(i) * k + j;
      graph.words[at] = model.TokenToWord(lattice.tokens[at]);
      graph.draft[at] = lattice.scores[at];
      if (!std::isfinite(graph.draft[at])) throw InvalidArgument("lattice scores must be finite");
      max_draft = std::max(max_draft, std::fabs(graph.draft[at]));
    }
  }
  // The largest magnitude a partial score's terms may add up to: the rounding of sums in
  // different orders (pass 2 against pass 3) is a tiny fraction of it, which pass 3's margin
  // covers even when large terms of opposite signs cancel.
  const double magnitude = alpha * kLn10 * per_term * (double(h) + 2.0 * model.order()) + h * max_draft;

  impl_->forward.Run(start);

  // The answer: the p = 1 path from pass 1, or pass 3'graph.
  std::vector<int32_t> &arcs = impl_->arcs;
  auto write = [&](int r) {
    int32_t *tokens = out.tokens + static_cast<size_t>(r) * h;
    double draft = 0.0;  // in position order, so that a reader recomputes it exactly
    for (int d = 0; d < h; ++d) {
      tokens[d] = lattice.tokens[static_cast<size_t>(d) * k + arcs[d]];
      draft += lattice.scores[static_cast<size_t>(d) * k + arcs[d]];
    }
    const double lm = model.Score(start, tokens, h, nullptr, nullptr) * kLn10;
    out.score[r] = alpha == 0 ? draft : draft + alpha * lm;
    out.draft_score[r] = draft;
    out.lm_score[r] = lm;
  };
  if (p == 1) {
    int32_t winner = -1;
    for (uint32_t f = graph.slot_begin[h]; f < graph.slot_begin[h + 1]; ++f) {
      if (graph.best[f] == kNegInf) continue;
      if (winner < 0 || graph.best[f] > graph.best[winner] ||
          (graph.best[f] == graph.best[winner] && graph.PrefixLess(h, f, -1, winner, -1)))
        winner = static_cast<int32_t>(f);
    }
    if (winner < 0) throw std::logic_error("the search reached no final state");
    graph.PrefixArcs(h, winner, &arcs);
    write(0);
    return 1;
  }

  const double tau = impl_->backward.Run(p);
  const double rounding = 4.0 * (double(h) + 2.0 * model.order()) * DBL_EPSILON * magnitude;
  impl_->pbest.Run(p, tau - 1e-9 * (1.0 + std::fabs(tau)) - rounding);
  const size_t found = impl_->pbest.Best(p);
  for (size_t r = 0; r < found; ++r) {
    impl_->pbest.BestArcs(r, &arcs);
    write(static_cast<int>(r));
  }
  return static_cast<int>(found);
}

namespace {

// A searcher's buffers grow to fit; a thread keeps its last one for the next call on the
// same model, so single-lattice calls do not start cold.
PBestSearch &ThreadSearcher(const Model &model) {
  thread_local std::unique_ptr<PBestSearch> kept;
  thread_local uint64_t kept_serial = 0;
  if (!kept || kept_serial != model.serial()) {
    kept.reset(new PBestSearch(model));
    kept_serial = model.serial();
  }
  return *kept;
}

}  // namespace

int PBestOne(const Model &model, const LatticeView &lattice, const int32_t *context,
             size_t context_size, bool bos, int p, double alpha, const PathsOut &out) {
  const StateId start = context != nullptr ? model.ContextState(context, context_size, bos)
                                           : model.StartState(bos);
  return ThreadSearcher(model).Run(lattice, start, p, alpha, out);
}

void PBestBatch(const Model &model, const LatticeBatchView &lattices, const int32_t *context,
                const int64_t *context_offsets, bool bos, int p, double alpha, int threads,
                const BatchPathsOut &out) {
  const int64_t batch = lattices.batch;
  const int h = lattices.h, k = lattices.k;
  if (batch <= 0) return;
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, batch)));
  std::atomic<int64_t> next(0);
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&]() {
    try {
      PBestSearch &search = ThreadSearcher(model);
      while (true) {
        const int64_t b = next.fetch_add(1);
        if (b >= batch) break;
        LatticeView lattice;
        lattice.tokens = lattices.tokens + b * h * k;
        lattice.scores = lattices.scores + b * h * k;
        lattice.widths = lattices.widths ? lattices.widths + b * h : nullptr;
        lattice.h = h;
        lattice.k = k;
        PathsOut paths;
        paths.tokens = out.tokens + b * p * h;
        paths.score = out.score + b * p;
        paths.draft_score = out.draft_score + b * p;
        paths.lm_score = out.lm_score + b * p;
        const int32_t *own_context = context ? context + context_offsets[b] : nullptr;
        const size_t context_size =
            context ? static_cast<size_t>(context_offsets[b + 1] - context_offsets[b]) : 0;
        out.count[b] = PBestOne(model, lattice, own_context, context_size, bos, p, alpha, paths);
        if (out.pops != nullptr) out.pops[b] = static_cast<int64_t>(search.stats().pops);
        if (out.transitions != nullptr)
          out.transitions[b] = static_cast<int64_t>(search.stats().transitions);
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
    try {
      for (int t = 0; t < threads; ++t) pool.emplace_back(work);
    } catch (const std::system_error &e) {
      // The system refused a thread: the workers already started stop after their current
      // lattice and are joined (destroying a joinable thread would terminate the process).
      next.store(batch);
      for (std::thread &t : pool) t.join();
      throw ThreadStartError(e.code().value(),
                             "cannot start worker thread " + std::to_string(pool.size() + 1) +
                                 " of " + std::to_string(threads) + ": " + e.what() +
                                 "; use fewer threads");
    }
    for (std::thread &t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace latticekit
