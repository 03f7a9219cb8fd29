#include "fc/io/counters.h"

#include <atomic>

namespace fc {
namespace {

// Relaxed: the counters order nothing; a snapshot taken after the threads that counted have
// been joined sees every count.
std::atomic<uint64_t> bytes_read{0};
std::atomic<uint64_t> read_calls{0};
std::atomic<uint64_t> bytes_written{0};
std::atomic<uint64_t> write_calls{0};

}  // namespace

void CountRead(uint64_t bytes) {
  bytes_read.fetch_add(bytes, std::memory_order_relaxed);
  read_calls.fetch_add(1, std::memory_order_relaxed);
}

void CountWrite(uint64_t bytes) {
  bytes_written.fetch_add(bytes, std::memory_order_relaxed);
  write_calls.fetch_add(1, std::memory_order_relaxed);
}

IoCounts ProcessIoCounts() {
  return {bytes_read.load(std::memory_order_relaxed), read_calls.load(std::memory_order_relaxed),
          bytes_written.load(std::memory_order_relaxed),
          write_calls.load(std::memory_order_relaxed)};
}

}  // namespace fc
