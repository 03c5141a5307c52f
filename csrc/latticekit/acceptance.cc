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

}  // namespace latticekit
