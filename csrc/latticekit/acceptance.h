// The acceptance model's online update (latticekit/drafting/calibration.py, AcceptanceModel):
// P(node accepted | parent accepted) = sigmoid(w . x), one step of stochastic gradient descent
// on the logistic loss per labelled node, in order.
#ifndef LATTICEKIT_ACCEPTANCE_H_
#define LATTICEKIT_ACCEPTANCE_H_

#include <cstddef>
#include <cstdint>
#include <utility>
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

// Candidate trees waiting for the decoded text to reach their nodes, labelled as it does
// (calibration.py's PendingLabels documents the rule; tests check it against a reference that
// labels every node afresh): a node at depth j below a root at text position r is labelled
// once the text holds position r + j and its ancestors match the text, 1 if its token is the
// token there, else 0; nodes below a mismatch are never labelled. A tree is forgotten once no
// node of it can still be labelled.
class PendingLabels {
 public:
  // A tree of n > 0 nodes below text position root: tokens, parents (parents before children,
  // -1 under the root), and each node's features (n rows of width values, row-major), kept
  // for its label. Throws InvalidArgument for a parent out of order or a width unlike the
  // trees' already held.
  void Add(int64_t root, const int64_t *tokens, const int64_t *parents, size_t n, const double *features,
           size_t width);
  // Labels every node the text now decides. The text: size tokens, its first at position
  // first, no later than any tree's root + 1 (positions before it are never read), and it ends
  // at position first + size - 1. Appends the labelled nodes' features (rows) and labels, tree
  // by tree in the order they were added, nodes in order; forgets trees with nothing left to
  // learn. Throws InvalidArgument for a text that starts after a tree's root + 1.
  void Resolve(const int64_t *text, int64_t first, size_t size, std::vector<double> *features,
               std::vector<double> *labels);
  size_t size() const { return trees_.size(); }
  size_t width() const { return width_; }
  // The earliest position any tree's labels read (its root + 1), or -1 with no tree held.
  int64_t Earliest() const;

 private:
  struct Tree {
    int64_t root;
    std::vector<int64_t> tokens, parents;
    std::vector<uint32_t> child_start, children;  // node i's children: children[child_start[i + 1] ..]
    std::vector<double> features;
    std::vector<char> done;
  };
  // Labels tree's nodes the text decides (as Resolve); whether any may still be labelled.
  // labelled and below: scratch space, reused from tree to tree.
  bool Label(Tree *tree, const int64_t *text, int64_t first, size_t size, std::vector<double> *features,
             std::vector<double> *labels, std::vector<std::pair<uint32_t, double>> *labelled,
             std::vector<char> *below) const;
  std::vector<Tree> trees_;
  size_t width_ = 0;
};

}  // namespace latticekit

#endif  // LATTICEKIT_ACCEPTANCE_H_
