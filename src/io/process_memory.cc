#include "fc/io/process_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define FC_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FC_ADDRESS_SANITIZER 1
#endif
#endif

// jemalloc's control interface, defined where a tool links jemalloc (meson -Djemalloc,
// tools/malloc_conf.cc). A weak reference: the library links and runs on any allocator,
// and the address is null where jemalloc is absent.
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp,
                       size_t newlen) __attribute__((weak));

namespace fc {
namespace {

// "VmRSS:\t  123456 kB" -> bytes; nullopt when the line is absent or malformed.
std::optional<uint64_t> KibField(std::string_view status, std::string_view name) {
  size_t at = 0;
  while (at < status.size()) {
    const size_t end = std::min(status.find('\n', at), status.size());
    const std::string_view line = status.substr(at, end - at);
    at = end + 1;
    if (line.size() <= name.size() || line.substr(0, name.size()) != name ||
        line[name.size()] != ':') {
      continue;
    }
    uint64_t kib = 0;
    bool digits = false;
    for (char c : line.substr(name.size() + 1)) {
      if (c >= '0' && c <= '9') {
        if (kib > (uint64_t{1} << 50)) return std::nullopt;
        kib = kib * 10 + static_cast<uint64_t>(c - '0');
        digits = true;
      } else if (digits) {
        break;
      }
    }
    if (!digits) return std::nullopt;
    return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ProcessMemory> ReadProcessMemory() {
#if defined(FC_ADDRESS_SANITIZER)
  // Shadow memory (an eighth of every mapping) and freed blocks held in quarantine are
  // resident too: charged to --memory-budget they would refuse budgets the program fits in
  // (the ASan test run plans with budgets of a few hundred bytes).
  return std::nullopt;
#endif
  // procfs, not the Env: this is the process itself, never a checkpoint file.
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[8192];
  size_t n = 0;
  while (n < sizeof(buf)) {
    const ssize_t got = ::read(fd, buf + n, sizeof(buf) - n);
    if (got <= 0) break;
    n += static_cast<size_t>(got);
  }
  ::close(fd);
  const std::string_view status(buf, n);
  const std::optional<uint64_t> rss = KibField(status, "VmRSS");
  const std::optional<uint64_t> hwm = KibField(status, "VmHWM");
  if (!rss || !hwm) return std::nullopt;
  return ProcessMemory{*rss, *hwm};
}

void ReleaseFreeMemory() {
  if (mallctl != nullptr) {
    // jemalloc keeps freed pages for seconds (they are what makes its next allocations
    // cheap); "arena.<MALLCTL_ARENAS_ALL>.purge" returns them now. 4096 is
    // MALLCTL_ARENAS_ALL, spelled out because jemalloc's header is not included.
    mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
    return;
  }
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace fc
