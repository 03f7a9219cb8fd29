// The data path's threads: a small thread pool that runs numbered tasks and stops at the first
// error. (Slabs and byte balancing, pure, are in fc/plan/slabs.h, included here.)
#ifndef FC_EXEC_PARALLEL_H_
#define FC_EXEC_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/status.h"
#include "fc/plan/slabs.h"

namespace fc {

// Runs task(0) .. task(count - 1) on `threads` threads (tasks are taken in order). After the
// first failing task no new task starts; returns that task's error (the lowest-numbered
// failure seen first).
Status ParallelFor(size_t count, int threads, const std::function<Status(size_t)>& task);
// The same, also telling each task which worker (0 .. threads - 1) runs it, so callers can
// keep per-worker buffers.
Status ParallelFor(size_t count, int threads,
                   const std::function<Status(size_t index, int worker)>& task);

// Worker threads for a run: `requested` when > 0, else DefaultWorkerThreads of this process:
// the CPUs it may run on (sched_getaffinity), the online CPUs, and Open MPI's
// OMPI_COMM_WORLD_LOCAL_SIZE.
int WorkerThreads(int requested);

// The default, pure: the CPUs in the process's affinity mask (<= 0: unknown, use the online
// count), divided among the job's processes on this node (`local_processes`, a decimal
// string or null) when the mask spans every online CPU (processes not bound to their own
// cores); raised to the process's share of kMinNodeIoWorkers (workers wait on the disk as
// well as on the CPU); capped to 1..8.
inline constexpr int kMinNodeIoWorkers = 4;
int DefaultWorkerThreads(int affinity_cpus, int online_cpus, const char* local_processes);

// Bytes of physical memory (8 GiB when unknown).
uint64_t PhysicalMemoryBytes();

}  // namespace fc

#endif  // FC_EXEC_PARALLEL_H_
