// The searchers kept per thread, and the threaded batch (search.h: PBestOne, PBestBatch).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "latticekit/errors.h"
#include "latticekit/search.h"

namespace latticekit {
namespace {

// A searcher's buffers grow to fit; a thread keeps its last one for the next call on the
// same model, so single-lattice calls do not start cold.
PBestSearch &ThreadSearcher(const Model &model) {
  thread_local std::unique_ptr<PBestSearch> kept;
  thread_local uint64_t kept_serial = 0;
  if (!kept || kept_serial != model.serial()) {
    kept.reset(new PBestSearch(model));
    kept_serial = model.serial();
  }
  return *kept;
}

}  // namespace

int PBestOne(const Model &model, const LatticeView &lattice, const int32_t *context,
             size_t context_size, bool bos, int p, double alpha, const PathsOut &out) {
  const StateId start = context != nullptr ? model.ContextState(context, context_size, bos)
                                           : model.StartState(bos);
  return ThreadSearcher(model).Run(lattice, start, p, alpha, out);
}

void PBestBatch(const Model &model, const LatticeBatchView &lattices, const int32_t *context,
                const int64_t *context_offsets, bool bos, int p, double alpha, int threads,
                const BatchPathsOut &out) {
  const int64_t batch = lattices.batch;
  const int h = lattices.h, k = lattices.k;
  if (batch <= 0) return;
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, batch)));
  std::atomic<int64_t> next(0);
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&]() {
    try {
      PBestSearch &search = ThreadSearcher(model);
      while (true) {
        const int64_t b = next.fetch_add(1);
        if (b >= batch) break;
        LatticeView lattice;
        lattice.tokens = lattices.tokens + b * h * k;
        lattice.scores = lattices.scores + b * h * k;
        lattice.widths = lattices.widths ? lattices.widths + b * h : nullptr;
        lattice.h = h;
        lattice.k = k;
        PathsOut paths;
        paths.tokens = out.tokens + b * p * h;
        paths.score = out.score + b * p;
        paths.draft_score = out.draft_score + b * p;
        paths.lm_score = out.lm_score + b * p;
        const int32_t *own_context = context ? context + context_offsets[b] : nullptr;
        const size_t context_size =
            context ? static_cast<size_t>(context_offsets[b + 1] - context_offsets[b]) : 0;
        out.count[b] = PBestOne(model, lattice, own_context, context_size, bos, p, alpha, paths);
        if (out.pops != nullptr) out.pops[b] = static_cast<int64_t>(search.stats().pops);
        if (out.transitions != nullptr)
          out.transitions[b] = static_cast<int64_t>(search.stats().transitions);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(batch);
    }
  };
  if (threads == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(threads);
    try {
      for (int t = 0; t < threads; ++t) pool.emplace_back(work);
    } catch (const std::system_error &e) {
      // The system refused a thread: the workers already started stop after their current
      // lattice and are joined (destroying a joinable thread would terminate the process).
      next.store(batch);
      for (std::thread &t : pool) t.join();
      throw ThreadStartError(e.code().value(),
                             "cannot start worker thread " + std::to_string(pool.size() + 1) +
                                 " of " + std::to_string(threads) + ": " + e.what() +
                                 "; use fewer threads");
    }
    for (std::thread &t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace latticekit
