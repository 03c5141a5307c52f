// Pass 1 of the search (search_graph.h says how the passes divide the work): ForwardPass,
// which builds the columns' back-off trees and consuming cells and finds the best prefix per
// slot. Internal to the search: included by search.cc only.
#ifndef LATTICEKIT_FORWARD_PASS_H_
#define LATTICEKIT_FORWARD_PASS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "latticekit/arc_lookup.h"
#include "latticekit/model.h"
#include "latticekit/search_graph.h"
#include "latticekit/open_map.h"

namespace latticekit {
namespace internal {

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
    const uint32_t s = *slot_of_state.FindOrInsert(state, static_cast<uint32_t>(graph.slot_state.size()), &inserted);
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
      const uint32_t first = *column_word.FindOrInsert(row[j], static_cast<uint32_t>(j), &inserted);
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
  OpenMap<uint32_t> node_of_state, slot_of_state;
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
  OpenMap<uint32_t> column_word;                    // word -> first arc j with it
  std::vector<int32_t> same_word_next;  // next arc j with the same word, or -1
  std::vector<int32_t> chain_tail;      // last arc j of the chain a first arc starts
  std::vector<WordId> column_words;     // the column's distinct words, ascending
};

}  // namespace internal
}  // namespace latticekit

#endif  // LATTICEKIT_FORWARD_PASS_H_
