// Execute: the one streaming loop of every job. For this process's write items of a Plan
// (fc/plan/plan.h), in plan order on a pool of worker threads: assemble the item's region
// from its source pieces (fc/exec/assemble.h: read, permute, reshape, convert), then hand the
// bytes to the job's sink, which writes them into the target file at the item's place.
// Buffers: one per worker, reused, at most the plan's slab size; whole blocks of reshaping
// pieces are kept in a PieceBlockCache bounded by the plan's block reservation, so each is
// read once. The first failing item stops the run (no new items start).
//
// With transfers (Plan::rounds > 0, several processes) the run goes round by round, on every
// process in step: read the round's transfers this process sends (into one message per
// receiver), agree that every process read its share, exchange all messages at once
// (Communicator::Exchange), write this process's items of the round with the received
// elements standing in for the files it does not read, agree that every process wrote. A
// failure anywhere ends every process's run with that error at the next agreement, so no
// process waits for one that has given up. Callers agree before calling (every process must
// enter Execute, or none).
//
// Progress: with several processes (a communicator of size > 1) process 0's display counts
// the whole job's bytes written: while the workers run, Execute's calling thread posts this
// process's count to process 0 every quarter second (Communicator::PostCounter, not
// blocking) and process 0 polls them; the counters are ended collectively before Execute
// returns, so its last line shows every process's bytes.
//
// Thread-safety: Execute is called from one thread, the only one that calls the
// communicator; the sink is called from the workers concurrently (distinct items never
// overlap).
#ifndef FC_EXEC_EXECUTE_H_
#define FC_EXEC_EXECUTE_H_

#include <cstdint>
#include <span>
#include <string>

#include "fc/comm/communicator.h"
#include "fc/core/status.h"
#include "fc/exec/progress.h"
#include "fc/format/chunk_reader.h"
#include "fc/plan/plan.h"

namespace fc {

// Where write items go: the job's writers.
class PlanSink {
 public:
  virtual ~PlanSink() = default;
  // Writes `bytes` at `byte_offset` of slot `slot` of plan file `file`.
  virtual Status Write(uint32_t file, uint32_t slot, uint64_t byte_offset,
                       std::span<const std::byte> bytes) = 0;
};

struct ExecuteOptions {
  int process = 0;             // which ProcessPlan to run
  std::string what = "writing";  // progress label
  Progress::Mode progress = Progress::Mode::kAuto;
  // Required when the plan has transfers: rank == process, size == the plan's processes.
  Communicator* comm = nullptr;
};

struct ExecuteStats {
  uint64_t bytes_written = 0;      // tensor bytes handed to the sink
  uint64_t peak_buffer_bytes = 0;  // most bytes held in worker buffers and blocks at once
                                   // (upper bound: each worker's largest buffer + blocks +
                                   // exchange buffers + chunk parts waiting for their
                                   // checksum, ChunkReader::reorder_peak_bytes)
  double seconds = 0;
  uint64_t bytes_sent = 0;      // tensor bytes this process sent to others
  uint64_t bytes_received = 0;  // and received from them
  // Bytes the progress display counted at the end: on process 0 of several, every
  // process's bytes written (the whole job); elsewhere this process's own.
  uint64_t progress_bytes = 0;
};

Result<ExecuteStats> Execute(const Plan& plan, ChunkReader& reader, PlanSink& sink,
                             const ExecuteOptions& options);

}  // namespace fc

#endif  // FC_EXEC_EXECUTE_H_
