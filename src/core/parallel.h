// parallel_for: a minimal fork-join loop over std::thread for the host golden model and input
// generation. No pool: the callers do milliseconds to seconds of work per call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

namespace fp4attn {

// Threads to use: FP4ATTN_NUM_THREADS when it is a positive integer, else the hardware count.
// Read on every call so that tests can change it with setenv between runs.
inline int num_threads() {
  if (const char* env = std::getenv("FP4ATTN_NUM_THREADS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0) return static_cast<int>(std::min(v, 1024L));
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

// Calls f(i) once for every i in [0, n). Chunks of indices are handed out through an atomic
// counter, so uneven items (causal rows) still balance. As long as f(i) writes only memory that
// no other index writes, the results do not depend on the thread count.
template <typename F>
void parallel_for(int64_t n, F&& f) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(num_threads(), n);
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  // About 8 chunks per thread: enough to balance, few enough that the counter is not contended.
  const int64_t chunk = std::max<int64_t>(1, n / (threads * 8));
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (;;) {
      const int64_t begin = next.fetch_add(chunk, std::memory_order_relaxed);
      if (begin >= n) return;
      const int64_t end = std::min(n, begin + chunk);
      for (int64_t i = begin; i < end; ++i) f(i);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

}  // namespace fp4attn
