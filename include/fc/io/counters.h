// Process-wide io counters: what the data path really read and wrote, measured where the
// system calls are made (RandomAccessFile reads, WritableFile writes), for --stats and
// benchmarks. Memory-mapped reads (parsers of metadata files) are not counted.
//
// Thread-safety: the counters are atomics; any thread may count and snapshot.
#ifndef FC_IO_COUNTERS_H_
#define FC_IO_COUNTERS_H_

#include <cstdint>

namespace fc {

struct IoCounts {
  uint64_t bytes_read = 0;
  uint64_t read_calls = 0;  // Env reads (a pread or preadv each on POSIX)
  uint64_t bytes_written = 0;
  uint64_t write_calls = 0;
};

void CountRead(uint64_t bytes);
void CountWrite(uint64_t bytes);
// The counts so far in this process.
IoCounts ProcessIoCounts();

}  // namespace fc

#endif  // FC_IO_COUNTERS_H_
