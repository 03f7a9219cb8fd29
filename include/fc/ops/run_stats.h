// --stats FILE: what a run measured, per process, written as JSON by process 0 after the
// run. The figures come from counters in the io layer (fc/io/counters.h) and the executor,
// not from the plan; "bytes_needed" is the plan's figure to compare them with.
//
//   {"tool": "fc-export", "bytes_needed": N,
//    "processes": [{"rank": r, "bytes_read": N, "read_calls": N, "bytes_written": N,
//                   "write_calls": N, "bytes_sent": N, "bytes_received": N,
//                   "peak_buffer_bytes": N, "seconds": x}, ...]}
//
// bytes_read counts every byte this process read through RandomAccessFile from the start of
// the run to the end of its data path (metadata and tensor data; memory-mapped metadata
// parsing is not counted, nor are the writer's later rereads of its own output);
// bytes_written every byte written (data, headers, metadata). bytes_sent/bytes_received are
// tensor bytes moved between processes, as handed to and taken from the transport
// (Communicator::Exchange); over a run the sums over processes are equal.
#ifndef FC_OPS_RUN_STATS_H_
#define FC_OPS_RUN_STATS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "fc/comm/communicator.h"
#include "fc/core/status.h"
#include "fc/io/counters.h"

namespace fc {

struct ProcessRunStats {
  uint64_t bytes_read = 0;
  uint64_t read_calls = 0;
  uint64_t bytes_written = 0;
  uint64_t write_calls = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t peak_buffer_bytes = 0;
  double seconds = 0;
};

// Measures one process's run: construct at the start, Finish() at the end.
class RunStatsMeter {
 public:
  RunStatsMeter();
  // The inputs have been read: reads after this are not counted.
  void InputsDone();
  // `bytes_sent`/`bytes_received`: what the executor handed to and got from the transport.
  ProcessRunStats Finish(uint64_t peak_buffer_bytes, uint64_t bytes_sent = 0,
                         uint64_t bytes_received = 0) const;

 private:
  IoCounts start_counts_;
  std::optional<IoCounts> inputs_done_;
  double start_seconds_;
};

// Collective: gathers every process's stats to process 0, which writes `path` (written
// whole, then renamed into place). Errors: kIoError naming the path (on every process).
Status WriteRunStats(const std::string& path, const std::string& tool, uint64_t bytes_needed,
                     const ProcessRunStats& mine, Communicator& comm);

}  // namespace fc

#endif  // FC_OPS_RUN_STATS_H_
