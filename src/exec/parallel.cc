#include "fc/exec/parallel.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
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

int DefaultWorkerThreads(int affinity_cpus, int online_cpus, const char* local_processes) {
  int cpus = affinity_cpus > 0 ? affinity_cpus : std::max(online_cpus, 1);
  // Unbound processes of one job on this node share the CPUs.
  int local = 0;
  if (local_processes != nullptr) {
    const char* end = local_processes + std::strlen(local_processes);
    if (std::from_chars(local_processes, end, local).ptr != end) local = 0;
  }
  if (local > 1 && cpus >= online_cpus) cpus = std::max(1, cpus / local);
  // Workers also wait on the disk: with direct IO (fc/io/env.h IoPolicy) a worker's read or
  // write returns when the device is done, so a node needs several in flight whatever its
  // cores. Measured on the 2-core VM (cold 10 GB ZeRO-2 -> UCP, 2026-12-07): 2 workers
  // 14.7-20.7 s, 4 workers 12.6 s, 8 workers 12.3 s.
  const int node_processes = std::max(local, 1);
  const int io_floor = (kMinNodeIoWorkers + node_processes - 1) / node_processes;
  return std::clamp(std::max(cpus, io_floor), 1, 8);
}

int WorkerThreads(int requested) {
  if (requested > 0) return requested;
  // The CPUs this process may run on, not the machine's: taskset, cgroup cpusets, and
  // mpirun, which binds each of up to 2 processes per node to one core (hardware_concurrency
  // counts every CPU: two processes of two threads each then shared two cores, and the
  // np 2 bench convert ran 1.23 s against np 1's 0.93 s).
  cpu_set_t set;
  CPU_ZERO(&set);
  const int affinity = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  // Open MPI's count of the job's processes on this node.
  return DefaultWorkerThreads(affinity, online > 0 ? static_cast<int>(online) : 1,
                              std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"));
}

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                               : (8ull << 30);
}

}  // namespace fc
