// The process's own memory as the kernel counts it (Linux /proc/self/status): what is
// resident now and the most that was resident at once. The jobs (fc-export, fc-convert)
// charge what their index and plan hold to --memory-budget with it (fc/plan/plan.h,
// PlanRequest::held_bytes).
//
// Thread-safety: reads a procfs file; any thread may call it.
#ifndef FC_IO_PROCESS_MEMORY_H_
#define FC_IO_PROCESS_MEMORY_H_

#include <cstdint>
#include <optional>

namespace fc {

struct ProcessMemory {
  uint64_t resident = 0;       // VmRSS, bytes
  uint64_t peak_resident = 0;  // VmHWM, bytes: the peak so far (what wait4's ru_maxrss reports)
};

// nullopt where the kernel gives no such file (not Linux, procfs not mounted), and in a
// build with AddressSanitizer, whose shadow memory and quarantine make the kernel's figures
// several times what the program holds (the jobs then charge nothing for the index).
std::optional<ProcessMemory> ReadProcessMemory();

// Hands memory the allocator holds but does not use back to the system (jemalloc's purge
// where the tool links jemalloc, else glibc malloc_trim; nothing elsewhere), so that what is
// resident afterwards is what the process still uses.
void ReleaseFreeMemory();

}  // namespace fc

#endif  // FC_IO_PROCESS_MEMORY_H_
