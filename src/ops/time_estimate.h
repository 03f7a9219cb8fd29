// The time estimate of a dry run (export and convert). Private to ops/.
//
// Model: each process reads its bytes, writes its bytes and moves (sends + receives) its
// exchanged bytes one after the other, each at one rate; the slowest process decides:
//   seconds = max over processes p of  read_p / read_rate + written_p / write_rate
//                                      + (sent_p + received_p) / network_rate
// Reading and writing are added, not overlapped: on one disk they share its bandwidth.
// Not modelled: CPU work (casts, checksums, zstd), seeks of scattered reads, the page cache
// absorbing writes, contention between processes on a shared disk.
#ifndef FC_SRC_OPS_TIME_ESTIMATE_H_
#define FC_SRC_OPS_TIME_ESTIMATE_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "fc/model/checkpoint_index.h"
#include "fc/plan/plan.h"

namespace fc {

// Assumed rates where nothing is measured: a local NVMe/SSD's order of magnitude for
// sequential reads and writes, and 10 GbE-class networks (about 1.2 GB/s of payload).
inline constexpr double kAssumedReadBytesPerSecond = 1e9;
inline constexpr double kAssumedWriteBytesPerSecond = 5e8;
inline constexpr double kAssumedNetworkBytesPerSecond = 1e9;

// The read probe: at most this many bytes of one input file, in 4 MiB reads, stopping after
// kReadProbeSeconds; fewer than kReadProbeMinBytes read is no measurement.
inline constexpr uint64_t kReadProbeMaxBytes = uint64_t{64} << 20;
inline constexpr double kReadProbeSeconds = 0.2;
inline constexpr uint64_t kReadProbeMinBytes = uint64_t{8} << 20;

struct Throughputs {
  double read = kAssumedReadBytesPerSecond;  // bytes per second, > 0
  double write = kAssumedWriteBytesPerSecond;
  double network = kAssumedNetworkBytesPerSecond;
  // How `read` was obtained: empty = assumed; else what was measured, e.g.
  // "64 MiB of __0_0.distcp in 0.05 s".
  std::string read_measured;
};

struct TimeEstimate {
  double seconds = 0;         // the slowest process's
  size_t slowest_process = 0;
  uint64_t read = 0, written = 0, moved = 0;  // the slowest process's bytes
};

// Pure. Monotonic: more bytes read, written or moved by any process never lowers it.
TimeEstimate EstimateTime(const Plan& plan, const Throughputs& rates);

// The read rate measured on the file this process (process 0) reads most of in `plan`,
// sequentially from its start (through the page cache: a file read recently measures the
// cache). Assumed rates when that file is too small to measure (kReadProbeMinBytes), cannot
// be read here, or the plan reads nothing.
Throughputs MeasureThroughputs(const CheckpointIndex& index, const Plan& plan);

// "under 0.1 s", "1.5 s", "4 min 10 s", "2 h 05 min".
std::string HumanSeconds(double seconds);

// Two lines within 120 columns, e.g.
//   time estimate: 2.4 s (slowest: process 0, reads 1.2 GiB, writes 1.2 GiB)
//   rates: read 850 MB/s (measured: 64.0 MiB of __0_0.distcp in 0.08 s), write 500 MB/s assumed
// With several processes "moves" and the network rate appear.
void PrintTimeEstimate(const Plan& plan, const Throughputs& rates, std::ostream& out);

}  // namespace fc

#endif  // FC_SRC_OPS_TIME_ESTIMATE_H_
