// The acceptance model's online update (acceptance.h).
#include "latticekit/acceptance.h"

#include <cmath>

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

}  // namespace latticekit
