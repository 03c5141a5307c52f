// The acceptance model's online update (acceptance.h).
#include "latticekit/acceptance.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "latticekit/errors.h"

namespace latticekit {

void LogisticSgd(const double *x, const double *y, size_t rows, size_t cols, double rate, double *w) {
  for (size_t i = 0; i < rows; ++i) {
    const double *xi = x + i * cols;
    double dot = 0.0;
    for (size_t j = 0; j < cols; ++j) dot += xi[j] * w[j];
    const double p = 1.0 / (1.0 + std::exp(-dot));
    const double step = rate * (y[i] - p);
    for (size_t j = 0; j < cols; ++j) w[j] += step * xi[j];
  }
}

namespace {

// Whether model m's estimate counts for a node of these source bits: they share a bit with the
// model's, or the node names no source (SourceAcceptance._members).
bool Counts(int64_t sources, int64_t model_bits) { return sources == 0 || (sources & model_bits) != 0; }

}  // namespace

void SourceSgd(const double *x, const double *y, const int64_t *sources, size_t rows, size_t cols, size_t models,
               const int64_t *bits, const double *rates, double *const *weights, int64_t *counts) {
  for (size_t m = 0; m < models; ++m) {
    counts[m] = 0;
    for (size_t i = 0; i < rows; ++i) {
      if (!Counts(sources[i], bits[m])) continue;
      ++counts[m];
      if (rates[m] != 0) LogisticSgd(x + i * cols, y + i, 1, cols, rates[m], weights[m]);
    }
  }
}

namespace {

constexpr double kClip = 8.0;   // calibration.py's _CLIP
constexpr double kScale = 4.0;  // calibration.py's _SCALE

// calibration.logit of one log-probability, scaled; 0 where NaN (no such source).
double Feature(double logprob) {
  if (std::isnan(logprob)) return 0.0;
  const double lp = std::min(logprob, -1e-12);
  const double v = lp - std::log(-std::expm1(lp));
  return std::max(std::min(v, kClip), -kClip) / kScale;
}

}  // namespace

void TreeChain(size_t n, const int64_t *parents, const int64_t *depths, const double *head, const double *ngram,
               const double *cache, const int64_t *sources, size_t models, const double *weights,
               const int64_t *bits, size_t max_depth, double *features, double *probability,
               std::vector<int64_t> *chain) {
  if (max_depth < 1 || models < 1) throw InvalidArgument("TreeChain: max_depth and models must be >= 1");
  const size_t width = max_depth + 3, stride = max_depth + 4;
  // best[parent + 1]: the parent's most probable child so far (-1: none)
  std::vector<int64_t> best(n + 1, -1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t parent = parents[i];
    if (parent < -1 || parent >= static_cast<int64_t>(i))
      throw InvalidArgument("TreeChain: node " + std::to_string(i) + " has parent " + std::to_string(parent) +
                            ", not an earlier node or -1");
    if (depths[i] < 1) throw InvalidArgument("TreeChain: node " + std::to_string(i) + " has depth below 1");
    double *x = features + i * stride;
    std::fill(x, x + max_depth, 0.0);
    x[std::min(static_cast<size_t>(depths[i]), max_depth) - 1] = 1.0;
    x[max_depth] = Feature(head[i]);
    x[max_depth + 1] = Feature(ngram[i]);
    x[max_depth + 2] = Feature(cache[i]);
    x[max_depth + 3] = static_cast<double>(sources[i]);
    double conditional = 0.0;
    for (size_t m = 0; m < models; ++m) {
      if (!Counts(sources[i], bits[m])) continue;
      const double *w = weights + m * width;
      double dot = 0.0;
      for (size_t j = 0; j < width; ++j) dot += x[j] * w[j];
      conditional = std::max(conditional, 1.0 / (1.0 + std::exp(-dot)));
    }
    probability[i] = parent >= 0 ? conditional * probability[parent] : conditional;
    int64_t &slot = best[parent + 1];
    if (slot < 0 || probability[i] > probability[slot]) slot = static_cast<int64_t>(i);
  }
  chain->clear();
  for (int64_t node = best[0]; node >= 0; node = best[node + 1]) chain->push_back(node);
}

void PendingLabels::Add(int64_t root, const int64_t *tokens, const int64_t *parents, size_t n,
                        const double *features, size_t width) {
  if (n == 0) return;
  if (root < 0) throw InvalidArgument("PendingLabels: a tree's root must be a text position >= 0");
  if (!trees_.empty() && width != width_)
    throw InvalidArgument("PendingLabels: features of width " + std::to_string(width) + " beside trees of width " +
                          std::to_string(width_));
  Tree tree;
  tree.root = root;
  tree.tokens.assign(tokens, tokens + n);
  tree.parents.assign(parents, parents + n);
  // children by parent (parent + 1: 0 for the root's), each in node order
  tree.child_start.assign(n + 2, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t parent = parents[i];
    if (parent < -1 || parent >= static_cast<int64_t>(i))
      throw InvalidArgument("PendingLabels: node " + std::to_string(i) + " has parent " + std::to_string(parent) +
                            ", not an earlier node or -1");
    ++tree.child_start[static_cast<size_t>(parent + 2)];
  }
  for (size_t i = 1; i < n + 2; ++i) tree.child_start[i] += tree.child_start[i - 1];
  tree.children.resize(n);
  std::vector<uint32_t> next(tree.child_start.begin(), tree.child_start.end() - 1);
  for (size_t i = 0; i < n; ++i) tree.children[next[static_cast<size_t>(parents[i] + 1)]++] = static_cast<uint32_t>(i);
  tree.features.assign(features, features + n * width);
  tree.done.assign(n, 0);
  width_ = width;
  trees_.push_back(std::move(tree));
}

int64_t PendingLabels::Earliest() const {
  int64_t earliest = -1;
  for (const Tree &tree : trees_)
    if (earliest < 0 || tree.root + 1 < earliest) earliest = tree.root + 1;
  return earliest;
}

bool PendingLabels::Label(Tree *tree, const int64_t *text, int64_t first, size_t size, std::vector<double> *features,
                          std::vector<double> *labels, std::vector<std::pair<uint32_t, double>> *labelled,
                          std::vector<char> *below) const {
  // walk the text's path down the tree, labelling the children of every node on it
  const int64_t known = first + static_cast<int64_t>(size) - 1 - tree->root;  // text positions after the root
  const size_t n = tree->tokens.size();
  labelled->clear();
  int64_t node = -1;
  bool open = true;
  for (int64_t depth = 1; depth <= known; ++depth) {
    const int64_t token = text[tree->root + depth - first];
    int64_t on_path = -1;
    const size_t slot = static_cast<size_t>(node + 1);
    for (uint32_t c = tree->child_start[slot]; c < tree->child_start[slot + 1]; ++c) {
      const uint32_t child = tree->children[c];
      const bool hit = tree->tokens[child] == token;
      if (!tree->done[child]) {
        tree->done[child] = 1;
        labelled->emplace_back(child, hit ? 1.0 : 0.0);
      }
      if (hit) on_path = child;
    }
    if (on_path < 0) {  // the text left the tree (or reached a leaf): nothing left to learn
      open = false;
      break;
    }
    node = on_path;
  }
  if (open) {  // the text ends inside the tree: open while a node below its path's end waits
    open = false;
    below->assign(n + 1, 0);  // by node + 1
    (*below)[static_cast<size_t>(node + 1)] = 1;
    for (size_t i = static_cast<size_t>(node + 1); i < n; ++i) {
      if (!(*below)[static_cast<size_t>(tree->parents[i] + 1)]) continue;
      if (!tree->done[i]) {
        open = true;
        break;
      }
      (*below)[i + 1] = 1;
    }
  }
  std::sort(labelled->begin(), labelled->end());
  for (const auto &[child, label] : *labelled) {
    const double *row = tree->features.data() + static_cast<size_t>(child) * width_;
    features->insert(features->end(), row, row + width_);
    labels->push_back(label);
  }
  return open;
}

void PendingLabels::Resolve(const int64_t *text, int64_t first, size_t size, std::vector<double> *features,
                            std::vector<double> *labels) {
  const int64_t earliest = Earliest();
  if (earliest >= 0 && first > earliest)
    throw InvalidArgument("PendingLabels: the text handed over starts at position " + std::to_string(first) +
                          ", after a tree's first position " + std::to_string(earliest));
  std::vector<std::pair<uint32_t, double>> labelled;
  std::vector<char> below;
  size_t kept = 0;
  for (size_t t = 0; t < trees_.size(); ++t) {
    if (Label(&trees_[t], text, first, size, features, labels, &labelled, &below)) {
      if (kept != t) trees_[kept] = std::move(trees_[t]);
      ++kept;
    }
  }
  trees_.resize(kept);
}

}  // namespace latticekit
