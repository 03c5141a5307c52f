// How long a random cache line takes to read on this machine, by working-set size: the
// figure that bounds the rescoring search, which reads a few thousand scattered lines of a
// 57 MB model per lattice (see docs/design.md, "Where the time goes").
//
//   cc -O2 -o /tmp/memory_latency benchmarks/memory_latency.c && /tmp/memory_latency
//
// dependent:   each load's address comes from the previous load (a random cycle over the
//              lines), so nothing overlaps: the latency of one line.
// independent: the addresses are known in advance, so the core keeps as many misses in
//              flight as it can: the best throughput of random lines.
// Medians over 5 repeats of 2M loads each.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t Random(void) {  // xorshift64
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static int CompareDouble(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

enum { kWordsPerLine = 8, kLoads = 2000000, kRepeats = 5 };

int main(void) {
  const size_t sizes_mb[] = {1, 2, 4, 8, 16, 32, 64};
  printf("%8s %16s %18s\n", "MB", "dependent ns", "independent ns");
  for (size_t s = 0; s < sizeof(sizes_mb) / sizeof(sizes_mb[0]); ++s) {
    const size_t lines = sizes_mb[s] * 1024 * 1024 / 64;
    uint64_t *a = aligned_alloc(64, lines * 64);
    size_t *order = malloc(lines * sizeof(size_t));
    uint32_t *index = malloc(kLoads * sizeof(uint32_t));
    if (a == NULL || order == NULL || index == NULL) {
      fprintf(stderr, "out of memory\n");
      return 1;
    }
    for (size_t i = 0; i < lines; ++i) order[i] = i;
    for (size_t i = lines - 1; i > 0; --i) {  // a random cycle through every line
      const size_t j = Random() % (i + 1), t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    for (size_t i = 0; i < lines; ++i)
      a[order[i] * kWordsPerLine] = order[(i + 1) % lines] * kWordsPerLine;
    for (size_t i = 0; i < kLoads; ++i) index[i] = (uint32_t)(Random() % lines);
    double dependent[kRepeats], independent[kRepeats];
    uint64_t sink = 0;
    for (int r = 0; r < kRepeats; ++r) {
      uint64_t p = order[0] * kWordsPerLine;
      double t = Now();
      for (size_t i = 0; i < kLoads; ++i) p = a[p];
      dependent[r] = (Now() - t) / kLoads * 1e9;
      sink += p;
      uint64_t sum = 0;
      t = Now();
      for (size_t i = 0; i < kLoads; ++i) sum += a[(size_t)index[i] * kWordsPerLine];
      independent[r] = (Now() - t) / kLoads * 1e9;
      sink += sum;
    }
    qsort(dependent, kRepeats, sizeof(double), CompareDouble);
    qsort(independent, kRepeats, sizeof(double), CompareDouble);
    printf("%8zu %16.1f %18.1f\n", sizes_mb[s], dependent[kRepeats / 2],
           independent[kRepeats / 2]);
    if (sink == 42) printf(" ");  // keeps the loads
    free(a);
    free(order);
    free(index);
  }
  return 0;
}
