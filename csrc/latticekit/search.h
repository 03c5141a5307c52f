// Exact p-best paths of a sausage lattice rescored by a back-off n-gram model.
//
// A path picks one arc per position; its score is the sum of its arc (draft) scores plus
// alpha times its natural-log n-gram probability given the decoding context. The search
// (search.cc; its passes in search_graph.h and the *_pass.h headers; docs/design.md) runs up
// to three passes over the columns: the best prefix per model state, computed as flows
// through each column's back-off tree; for p > 1, the best completion per state and a lower
// bound on the p-th best score; then the k-best dynamic programme over (position, state)
// restricted to prefixes that can still make the top p. Ties break by token sequence, then
// arc sequence, ascending. PBestOne and PBestBatch, with a searcher per thread, are in
// search_batch.cc.
#ifndef LATTICEKIT_SEARCH_H_
#define LATTICEKIT_SEARCH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "latticekit/model.h"

namespace latticekit {

// One lattice, borrowed: tokens and scores are [h, k] row-major; widths[i] arcs of row i
// are used (all k when widths is null).
struct LatticeView {
  const int32_t *tokens = nullptr;
  const float *scores = nullptr;
  const int32_t *widths = nullptr;
  int h = 0;
  int k = 0;
};

// Where a search writes its paths, best first: tokens [p, h]; the rest [p], natural log.
struct PathsOut {
  int32_t *tokens = nullptr;
  double *score = nullptr;
  double *draft_score = nullptr;
  double *lm_score = nullptr;
};

struct SearchStats {
  uint64_t pops = 0;        // partial paths created (pass 1 candidates, pass 3 prefixes)
  uint64_t expansions = 0;  // back-off tree nodes built, over all columns
  uint64_t transitions = 0; // explicit n-gram arcs found for (tree node, column arc) cells
};

// A reusable searcher; one per thread. Not thread-safe itself; the model is shared.
class PBestSearch {
 public:
  explicit PBestSearch(const Model &model);
  ~PBestSearch();
  PBestSearch(const PBestSearch &) = delete;
  PBestSearch &operator=(const PBestSearch &) = delete;

  // Writes the min(p, number of paths) best paths; returns how many.
  int Run(const LatticeView &lattice, StateId start, int p, double alpha, const PathsOut &out);
  const SearchStats &stats() const { return stats_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  SearchStats stats_;
};

// The p best paths of one lattice, from the state after context (null: no context), on
// the calling thread; returns how many were written.
int PBestOne(const Model &model, const LatticeView &lattice, const int32_t *context,
             size_t context_size, bool bos, int p, double alpha, const PathsOut &out);

// A batch of equally shaped lattices, borrowed: tokens and scores are [batch, h, k]
// row-major; widths [batch, h] (all k arcs when widths is null).
struct LatticeBatchView {
  const int32_t *tokens = nullptr;
  const float *scores = nullptr;
  const int32_t *widths = nullptr;
  int64_t batch = 0;
  int h = 0;
  int k = 0;
};

// Where a batch search writes: tokens [batch, p, h]; score, draft_score, lm_score [batch, p]
// (natural log); count [batch], the paths each lattice has; pops and transitions [batch]
// (SearchStats), unless null.
struct BatchPathsOut {
  int32_t *tokens = nullptr;
  double *score = nullptr;
  double *draft_score = nullptr;
  double *lm_score = nullptr;
  int32_t *count = nullptr;
  int64_t *pops = nullptr;
  int64_t *transitions = nullptr;
};

// The p best paths of each lattice of a batch, spread over threads. The context of lattice
// b is context[context_offsets[b] .. context_offsets[b + 1]) (context null: no context).
void PBestBatch(const Model &model, const LatticeBatchView &lattices, const int32_t *context,
                const int64_t *context_offsets, bool bos, int p, double alpha, int threads,
                const BatchPathsOut &out);

}  // namespace latticekit

#endif  // LATTICEKIT_SEARCH_H_
