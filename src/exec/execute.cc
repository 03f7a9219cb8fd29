#include "fc/exec/execute.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "fc/exec/assemble.h"
#include "fc/exec/parallel.h"

namespace fc {

Result<ExecuteStats> Execute(const Plan& plan, ChunkReader& reader, PlanSink& sink,
                             const ExecuteOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.process < 0 || static_cast<size_t>(options.process) >= plan.per_process.size()) {
    return InternalError("process " + std::to_string(options.process) + " is not in the plan");
  }
  const ProcessPlan& mine = plan.per_process[static_cast<size_t>(options.process)];
  const int threads = std::max(1, plan.threads);
  // Room for one block per worker: a worker holds at most one while it copies from it.
  PieceBlockCache blocks(plan.memory.block_bytes * static_cast<uint64_t>(threads));
  for (const auto& [t, k] : plan.whole_blocks) blocks.Allow(&plan.tensors[t].pieces[k]);
  std::vector<std::vector<std::byte>> buffers(static_cast<size_t>(threads));
  Progress progress(options.what, mine.bytes_written, options.progress);
  Status status = ParallelFor(mine.writes.size(), threads, [&](size_t i, int worker) -> Status {
    const WriteItem& item = plan.writes[mine.writes[i]];
    const PlanTensor& tensor = plan.tensors[item.tensor];
    std::vector<std::byte>& buffer = buffers[static_cast<size_t>(worker)];
    buffer.resize(item.bytes);
    FC_RETURN_IF_ERROR(AssembleRegion(reader, tensor.name, tensor.pieces, item.region,
                                      tensor.dtype, buffer.data(), &blocks));
    FC_RETURN_IF_ERROR(sink.Write(item.file, item.slot, item.byte_offset, buffer));
    progress.Add(buffer.size());
    return Status::Ok();
  });
  // Chunks read only in part have their checksums completed here, before anything commits.
  if (status.ok()) status = reader.FinishVerification();
  progress.Finish(status.ok());
  FC_RETURN_IF_ERROR(status);
  ExecuteStats stats;
  stats.bytes_written = mine.bytes_written;
  uint64_t buffer_bytes = 0;
  for (const std::vector<std::byte>& b : buffers) buffer_bytes += b.capacity();
  stats.peak_buffer_bytes = buffer_bytes + blocks.peak_bytes();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace fc
