// The acceptance model's online update (latticekit/drafting/calibration.py, AcceptanceModel):
// P(node accepted | parent accepted) = sigmoid(w . x), one step of stochastic gradient descent
// on the logistic loss per labelled node, in order.
#ifndef LATTICEKIT_ACCEPTANCE_H_
#define LATTICEKIT_ACCEPTANCE_H_

#include <cstddef>

namespace latticekit {

// For each row i of x ([rows, cols], row-major) in turn: w += rate * (y[i] - sigmoid(x_i . w)) * x_i.
void LogisticSgd(const double *x, const double *y, size_t rows, size_t cols, double rate, double *w);

}  // namespace latticekit

#endif  // LATTICEKIT_ACCEPTANCE_H_
