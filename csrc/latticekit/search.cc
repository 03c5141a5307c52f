#include "latticekit/search.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <vector>

#include "latticekit/backward_pass.h"
#include "latticekit/errors.h"
#include "latticekit/forward_pass.h"
#include "latticekit/pbest_pass.h"
#include "latticekit/search_graph.h"

// PBestSearch: its passes run in order (search_graph.h, forward_pass.h, backward_pass.h,
// pbest_pass.h); the per-thread searchers and the batch are in search_batch.cc.
namespace latticekit {
namespace {

constexpr double kLn10 = 2.302585092994045684;
// No partial score may exceed this in magnitude (PBestSearch::Run bounds alpha by it): a sum of two such
// scores (pass 2's V + W) and the rounding margin stay far from double's 1.8e308.
constexpr double kScoreLimit = 1e300;

}  // namespace

using internal::BackwardPass;
using internal::ForwardPass;
using internal::kNegInf;
using internal::PBestPass;
using internal::SearchGraph;

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

}  // namespace latticekit
