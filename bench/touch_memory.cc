// How fast this machine lets a process touch fresh memory, 1 GiB at a time: on a VM whose
// hypervisor backs guest memory lazily (or takes back what the guest frees, as virtio-balloon
// free page reporting does), the first touch of a page costs the host a fault, and a
// benchmark that fills the page cache pays it. bench/README.md, "Against the frameworks'
// own converters", 10 GB.
//
// usage: touch_memory GIB   (drop the page cache first for the worst case:
//                            sync; echo 3 > /proc/sys/vm/drop_caches)
// Prints the seconds each GiB took on the first pass, then both passes' totals.
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (argc != 2 || std::atol(argv[1]) <= 0) {
    std::fprintf(stderr, "usage: touch_memory GIB\n");
    return 2;
  }
  const size_t gib = static_cast<size_t>(std::atol(argv[1]));
  const size_t bytes = gib << 30;
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  volatile char* p = static_cast<volatile char*>(map);
  using Clock = std::chrono::steady_clock;
  for (int pass = 0; pass < 2; ++pass) {
    const auto start = Clock::now();
    for (size_t g = 0; g < gib; ++g) {
      const auto g_start = Clock::now();
      for (size_t at = g << 30; at < (g + 1) << 30; at += 4096) p[at] = 1;
      if (pass == 0) {
        std::printf("%.2f ", std::chrono::duration<double>(Clock::now() - g_start).count());
      }
    }
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("%spass %d: %.2f s, %.2f GiB/s\n", pass == 0 ? "\n" : "", pass, s,
                static_cast<double>(gib) / s);
  }
  return 0;
}
