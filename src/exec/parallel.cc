#include "fc/exec/parallel.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>


namespace fc {

Status ParallelFor(size_t count, int threads, const std::function<Status(size_t)>& task) {
  return ParallelFor(count, threads, [&](size_t i, int) { return task(i); });
}

Status ParallelFor(size_t count, int threads,
                   const std::function<Status(size_t index, int worker)>& task) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first_error;
  size_t first_index = count;
  auto worker = [&](int id) {
    while (!failed.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      Status s = task(i, id);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < first_index) {
          first_index = i;
          first_error = std::move(s);
        }
        failed = true;
        return;
      }
    }
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(std::max<size_t>(count, 1))));
  if (n == 1) {
    worker(0);
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < n; ++t) pool.emplace_back(worker, t);
    for (std::thread& t : pool) t.join();
  }
  return first_error;
}

int WorkerThreads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                               : (8ull << 30);
}

}  // namespace fc
