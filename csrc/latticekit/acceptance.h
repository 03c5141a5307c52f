// The acceptance model's online update (latticekit/drafting/calibration.py, AcceptanceModel):
// P(node accepted | parent accepted) = sigmoid(w . x), one step of stochastic gradient descent
// on the logistic loss per labelled node, in order.
#ifndef LATTICEKIT_ACCEPTANCE_H_
#define LATTICEKIT_ACCEPTANCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace latticekit {

// For each row i of x ([rows, cols], row-major) in turn: w += rate * (y[i] - sigmoid(x_i . w)) * x_i.
void LogisticSgd(const double *x, const double *y, size_t rows, size_t cols, double rate, double *w);

// One estimate per candidate source (calibration.py, SourceAcceptance.update): for each model m,
// LogisticSgd over the rows of x whose sources share a bit with bits[m] or name none, in order,
// at rates[m] on weights[m] (a model at rate 0 is left as it is). Each model's count of such
// rows goes to counts[m].
void SourceSgd(const double *x, const double *y, const int64_t *sources, size_t rows, size_t cols, size_t models,
               const int64_t *bits, const double *rates, double *const *weights, int64_t *counts);

// A candidate tree's acceptance estimates and its best chain, in one pass: what
// calibration.py's node_features, SourceAcceptance.conditional, CandidateTree.path_probability
// and CandidateTree.best_chain compute one after the other (they are its reference).
//
// The tree: n nodes, parents before children (parents[i] in [-1, i)), depths >= 1; head,
// ngram, cache: each node's log-probabilities under the heads, the n-gram model and the cache
// model, NaN where the source has none; sources: each node's source bits. The estimates:
// models rows of weights (row-major, models x (max_depth + 3)), model m counting for a node
// whose sources share a bit with bits[m] or that names none; a node's conditional is the
// largest of its models' sigmoid(w . x), 0 if none counts.
//
// Writes features (n x (max_depth + 4), row-major: the depth one-hot, the head, n-gram and
// cache logits clipped to [-8, 8] and divided by 4 (0 where NaN), then the node's sources as a
// number), probability (n: the product of the conditionals from the root down), and chain (the
// nodes from the root that follow, at every node, its most probable child, the first of
// equals). Throws InvalidArgument for a parent out of order, a depth below 1, or max_depth or
// models 0.
void TreeChain(size_t n, const int64_t *parents, const int64_t *depths, const double *head, const double *ngram,
               const double *cache, const int64_t *sources, size_t models, const double *weights,
               const int64_t *bits, size_t max_depth, double *features, double *probability,
               std::vector<int64_t> *chain);

}  // namespace latticekit

#endif  // LATTICEKIT_ACCEPTANCE_H_
