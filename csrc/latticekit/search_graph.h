// What the search's passes share (search.cc; forward_pass.h, backward_pass.h, pbest_pass.h):
// the constants, the columns' back-off trees and consuming cells, and SearchGraph. Internal
// to the search: included by its pass headers and search.cc only.
#ifndef LATTICEKIT_SEARCH_GRAPH_H_
#define LATTICEKIT_SEARCH_GRAPH_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "latticekit/model.h"
#include "latticekit/search.h"

namespace latticekit {
namespace internal {

// (inline: one object in every translation unit, as std::vector's const T & binds to them)
inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();
inline constexpr int32_t kUnreached = -1;  // a consuming cell that no prefix reaches
inline constexpr StateId kNoState = 0xFFFFFFFFu;

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

struct Column {
  uint32_t node_begin = 0, node_end = 0;  // its tree nodes, parents before children
  int width = 0;
};

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

}  // namespace internal
}  // namespace latticekit

#endif  // LATTICEKIT_SEARCH_GRAPH_H_
