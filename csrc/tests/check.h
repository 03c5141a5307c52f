// The checks of the C++ core's unit tests (test_core.cc, test_open_map.cc, test_drafting.cc): each counts
// itself, prints a line when it fails and never stops the run; main reports the counts.
#ifndef LATTICEKIT_TESTS_CHECK_H_
#define LATTICEKIT_TESTS_CHECK_H_

#include <cmath>
#include <cstdio>
#include <exception>

namespace latticekit {
namespace testing {

inline int failures = 0;  // over every test file
inline int checks = 0;

// The tests of the other files, which test_core.cc's main runs.
void TestOpenMap();   // test_open_map.cc
void TestDrafting();    // test_drafting.cc

}  // namespace testing
}  // namespace latticekit

#define CHECK(cond)                                                               \
  do {                                                                            \
    ++::latticekit::testing::checks;                                              \
    if (!(cond)) {                                                                \
      ++::latticekit::testing::failures;                                          \
      std::printf("%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);        \
    }                                                                             \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                     \
  do {                                                                            \
    ++::latticekit::testing::checks;                                              \
    const double a_ = (a), b_ = (b);                                              \
    if (!(std::fabs(a_ - b_) <= (tol))) {                                         \
      ++::latticekit::testing::failures;                                          \
      std::printf("%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g\n", __FILE__,   \
                  __LINE__, #a, a_, #b, b_);                                      \
    }                                                                             \
  } while (0)

// Runs statement and checks that it throws Error; on_error(e) may check more.
#define CHECK_THROWS(Error, statement, on_error)                                  \
  do {                                                                            \
    ++::latticekit::testing::checks;                                              \
    bool thrown_ = false;                                                         \
    try {                                                                         \
      statement;                                                                  \
    } catch (const Error &e) {                                                    \
      thrown_ = true;                                                             \
      on_error(e);                                                                \
    } catch (const std::exception &e) {                                           \
      thrown_ = true;                                                             \
      ++::latticekit::testing::failures;                                          \
      std::printf("%s:%d: %s threw another exception: %s\n", __FILE__, __LINE__,  \
                  #statement, e.what());                                          \
    }                                                                             \
    if (!thrown_) {                                                               \
      ++::latticekit::testing::failures;                                          \
      std::printf("%s:%d: %s did not throw %s\n", __FILE__, __LINE__, #statement, \
                  #Error);                                                        \
    }                                                                             \
  } while (0)

#endif  // LATTICEKIT_TESTS_CHECK_H_
