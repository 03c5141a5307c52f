// Pass 2 of the search (search_graph.h says how the passes divide the work): BackwardPass,
// the best completion per slot and the bound tau. Internal to the search: included by
// search.cc and pbest_pass.h only.
#ifndef LATTICEKIT_BACKWARD_PASS_H_
#define LATTICEKIT_BACKWARD_PASS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "latticekit/search_graph.h"

namespace latticekit {
namespace internal {

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

}  // namespace internal
}  // namespace latticekit

#endif  // LATTICEKIT_BACKWARD_PASS_H_
