// What a job (fc-export, fc-convert) holds besides its tensor buffers, charged to
// --memory-budget so that the budget bounds the process: peak resident memory <= budget +
// 64 MiB for any budget at or above the minimum the plan reports (fc-plan(5), MEMORY).
// Private to ops.
#ifndef FC_OPS_JOB_MEMORY_H_
#define FC_OPS_JOB_MEMORY_H_

#include <cstdint>
#include <string>

#include "fc/comm/communicator.h"
#include "fc/model/checkpoint_index.h"
#include "fc/plan/plan.h"

namespace fc {

// The part of the 64 MiB allowance the job's bookkeeping may use uncharged (the program,
// its libraries and a small index take about 10 MiB; the rest is for thread stacks and the
// readers' buffers).
inline constexpr uint64_t kBookkeepingAllowance = uint64_t{32} << 20;

// Bytes the reader's cache of located torch DCP items takes per chunk (a hash node with
// the place found: fc/format/chunk_reader.h).
inline constexpr uint64_t kLocatedChunkBytes = 96;

struct JobMemory {
  uint64_t resident = 0;  // resident now (the open index and the program)
  uint64_t peak = 0;      // the peak so far (reading the metadata)
};

// Measures the process once the checkpoint is open (after handing freed memory back to the
// system), agreed between the processes of a run (the largest of each), so that every
// process plans with the same figures. Collective. Without an explicit budget
// (`budget_given` false, the same in every process) nothing is charged, so nothing is
// measured and the freed memory stays with the allocator: handing it back would make the
// planning that follows fault it in again (at 1M chunks 20k more page faults, 0.5-1 s of
// system time on a paravirtualised VM).
JobMemory MeasureJobMemory(Communicator& comm, bool budget_given);

// Sets request.held_bytes, free_bytes and peak_floor from `job`, the reader cache the
// request's sources may fill (kLocatedChunkBytes per unlocated chunk) and `extra` bytes the
// job keeps besides the index and the plan (counted). Without an explicit budget
// (`budget_given` false) nothing is charged: the default budget is for the buffers.
void ChargeJobMemory(const JobMemory& job, uint64_t extra, bool budget_given,
                     PlanRequest& request);

// For the dry-run "memory:" line: " (bookkeeping 650 MiB: the index and the plan)" when
// the plan charges any to the budget, else nothing (small jobs print as before).
std::string BookkeepingNote(const PlanMemory& memory);

}  // namespace fc

#endif  // FC_OPS_JOB_MEMORY_H_
