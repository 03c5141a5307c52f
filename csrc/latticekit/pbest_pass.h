// Pass 3 of the search (search_graph.h says how the passes divide the work): PBestPass,
// the p best prefixes per slot, kept to those that can still make the top p. Internal to the
// search: included by search.cc only.
#ifndef LATTICEKIT_PBEST_PASS_H_
#define LATTICEKIT_PBEST_PASS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "latticekit/backward_pass.h"
#include "latticekit/search_graph.h"

namespace latticekit {
namespace internal {

// Pass 3: a partial path, its token sequence being the chain of path nodes ending at node.
struct Entry {
  double g;
  int32_t node;
};

struct PathNode {
  int32_t parent;  // -1 for the empty path
  int32_t arc;     // arc index within its column
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

}  // namespace internal
}  // namespace latticekit

#endif  // LATTICEKIT_PBEST_PASS_H_
