#include "src/ops/job_memory.h"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "fc/core/human_bytes.h"
#include "fc/io/process_memory.h"

namespace fc {
namespace {

void PutU64(std::string& out, uint64_t v) {
  for (int b = 0; b < 8; ++b) out += static_cast<char>(v >> (8 * b));
}

uint64_t GetU64(const std::string& in, size_t at) {
  uint64_t v = 0;
  for (int b = 0; b < 8 && at + b < in.size(); ++b) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + b])) << (8 * b);
  }
  return v;
}

}  // namespace

JobMemory MeasureJobMemory(Communicator& comm, bool budget_given) {
  if (!budget_given) return JobMemory{};
  // The metadata parse's buffers are free now; what stays resident is the index.
  ReleaseFreeMemory();
  JobMemory job;
  if (const std::optional<ProcessMemory> m = ReadProcessMemory()) {
    job.resident = m->resident;
    job.peak = m->peak_resident;
  }
  if (comm.size() == 1) return job;
  std::string mine;
  PutU64(mine, job.resident);
  PutU64(mine, job.peak);
  std::string agreed;
  if (comm.rank() == 0) {
    JobMemory most;
    for (const std::string& m : comm.Gather(mine, 0)) {
      most.resident = std::max(most.resident, GetU64(m, 0));
      most.peak = std::max(most.peak, GetU64(m, 8));
    }
    PutU64(agreed, most.resident);
    PutU64(agreed, most.peak);
  } else {
    comm.Gather(mine, 0);
  }
  comm.Broadcast(agreed, 0);
  return JobMemory{GetU64(agreed, 0), GetU64(agreed, 8)};
}

void ChargeJobMemory(const JobMemory& job, uint64_t extra, bool budget_given,
                     PlanRequest& request) {
  if (!budget_given) return;
  uint64_t cache = 0;
  std::unordered_set<const TensorEntry*> sources;
  for (const PlanTensor& t : request.tensors) {
    for (const SourcePiece& p : t.pieces) {
      if (p.source == nullptr || !sources.insert(p.source).second) continue;
      for (const Chunk& c : p.source->chunks) {
        if (c.unlocated_item) cache += kLocatedChunkBytes;
      }
    }
  }
  request.charge_held = true;
  request.held_bytes = job.resident + cache + extra;
  request.free_bytes = kBookkeepingAllowance;
  request.peak_floor = job.peak > kBookkeepingAllowance ? job.peak - kBookkeepingAllowance : 0;
}

std::string BookkeepingNote(const PlanMemory& memory) {
  if (memory.held == 0) return std::string();
  return " (bookkeeping " + HumanBytes(memory.held) + " of it: the index and the plan, " +
         HumanBytes(memory.plan_bytes) + " the plan)";
}

}  // namespace fc
