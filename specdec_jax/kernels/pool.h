// Work split over XLA's intra-op thread pool, shared by the kernels of this directory.
//
// parallel_chunks(pool, nthreads, nchunks, fn) runs fn(c) once for every c in [0, nchunks)
// (chunk_count: how many chunks to cut n units of work into):
// the calling thread works too, and nthreads - 1 helpers of the pool (ffi::ThreadPool) take
// chunks from an atomic counter. The caller waits only for chunks that were taken, never for
// a helper that has not started (a late helper finds no chunk left and returns), so a busy
// pool costs time, not a deadlock. Results must not depend on which thread ran a chunk.

#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace specdec {

// Threads for n units of work: the caller's wish, capped by the pool and by n.
inline int64_t thread_count(xla::ffi::ThreadPool& pool, int64_t nthreads, int64_t n) {
  const int64_t avail = std::max<int64_t>(1, pool.num_threads());
  return std::max<int64_t>(1, std::min({nthreads, avail, n}));
}

// Chunks for n units of work: chunks_per_thread per thread (a late or slow helper leaves
// its chunks to the others), at most n.
inline int64_t chunk_count(xla::ffi::ThreadPool& pool, int64_t nthreads,
                           int64_t chunks_per_thread, int64_t n) {
  return std::min<int64_t>(n, thread_count(pool, nthreads, n) *
                                  std::max<int64_t>(1, chunks_per_thread));
}

inline void parallel_chunks(xla::ffi::ThreadPool& pool, int64_t nthreads, int64_t nchunks,
                            std::function<void(int64_t)> fn) {
  const int64_t nt = thread_count(pool, nthreads, nchunks);
  if (nt <= 1) {
    for (int64_t c = 0; c < nchunks; ++c) fn(c);
    return;
  }
  struct State {
    std::function<void(int64_t)> fn;
    int64_t nchunks;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    void work() {
      int64_t c;
      while ((c = next.fetch_add(1, std::memory_order_relaxed)) < nchunks) {
        fn(c);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto st = std::make_shared<State>();
  st->fn = std::move(fn);
  st->nchunks = nchunks;
  for (int64_t t = 1; t < nt; ++t) pool.Schedule([st] { st->work(); });
  st->work();
  // Spin briefly (a helper's chunk takes microseconds), then yield: on an oversubscribed
  // host a preempted helper may need this core to finish its chunk.
  for (int spins = 0; st->done.load(std::memory_order_acquire) < nchunks; ++spins) {
    if (spins < 1 << 14) _mm_pause();
    else std::this_thread::yield();
  }
}

}  // namespace specdec
