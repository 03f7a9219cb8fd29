// How fast this machine's disk takes the same bytes written the two ways fc writes output:
// O_DIRECT from the workers, or through the page cache with write-back started, and the
// written pages dropped, every 16 MiB per file (src/io/env.cc). THREADS threads write
// FILES files of TOTAL_GIB / FILES each in pieces of PIECE_MIB, every file reserved with
// fallocate(FALLOC_FL_KEEP_SIZE) first, then fdatasync'd; the time is to the last sync.
// bench/README.md, "Large output files", has what it measured and why fc writes files of
// 1 GiB or more through the page cache (IoPolicy::page_cache_write_min_file_bytes).
//
// usage: write_paths PATH_PREFIX THREADS PIECE_MIB TOTAL_GIB direct|cache FILES
//   writes PATH_PREFIX0 .. PATH_PREFIX{FILES-1} (left behind: remove them), e.g.
//   for m in direct cache; do write_paths /tmp/wp 4 2 4 $m 1; rm -f /tmp/wp*; done
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 7 || std::atoi(argv[2]) <= 0 || std::atof(argv[3]) <= 0 ||
      std::atof(argv[4]) <= 0 || std::atoi(argv[6]) <= 0 ||
      (std::strcmp(argv[5], "direct") != 0 && std::strcmp(argv[5], "cache") != 0)) {
    std::fprintf(stderr, "usage: write_paths PATH_PREFIX THREADS PIECE_MIB TOTAL_GIB "
                         "direct|cache FILES\n");
    return 2;
  }
  const std::string prefix = argv[1];
  const int threads = std::atoi(argv[2]);
  // Pieces a multiple of 4 KiB (O_DIRECT), files a whole number of pieces.
  const size_t piece = static_cast<size_t>(std::atof(argv[3]) * (1 << 20)) / 4096 * 4096;
  const bool direct = std::strcmp(argv[5], "direct") == 0;
  const size_t files = static_cast<size_t>(std::atoi(argv[6]));
  const size_t total = static_cast<size_t>(std::atof(argv[4]) * (1u << 30));
  const size_t pieces_per_file = total / files / piece;
  if (piece == 0 || pieces_per_file == 0) {
    std::fprintf(stderr, "write_paths: each file must hold at least one piece of 4 KiB or more\n");
    return 2;
  }
  constexpr size_t kStride = size_t{16} << 20;  // as src/io/env.cc kWriteBackStride
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::vector<int> fds;
  for (size_t f = 0; f < files; ++f) {
    const std::string path = prefix + std::to_string(f);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC |
                                            (direct ? O_DIRECT : 0), 0644);
    if (fd < 0) {
      std::perror(path.c_str());
      return 1;
    }
    (void)::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(pieces_per_file * piece));
    fds.push_back(fd);
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::unique_ptr<std::atomic<size_t>[]> unstarted(new std::atomic<size_t>[files]);
  for (size_t f = 0; f < files; ++f) unstarted[f] = 0;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::unique_ptr<char, decltype(&std::free)> buf(
          static_cast<char*>(std::aligned_alloc(4096, piece)), &std::free);
      std::memset(buf.get(), 7, piece);
      for (;;) {
        const size_t i = next.fetch_add(1);
        const size_t f = i / pieces_per_file;
        if (f >= files || failed.load()) break;
        const off_t offset = static_cast<off_t>((i % pieces_per_file) * piece);
        if (::pwrite(fds[f], buf.get(), piece, offset) != static_cast<ssize_t>(piece)) {
          std::perror("pwrite");
          failed.store(true);
          break;
        }
        if (!direct && unstarted[f].fetch_add(piece) + piece >= kStride) {
          unstarted[f].store(0);
          (void)::sync_file_range(fds[f], 0, 0, SYNC_FILE_RANGE_WRITE);
          (void)::posix_fadvise(fds[f], 0, 0, POSIX_FADV_DONTNEED);
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  const double written_s = std::chrono::duration<double>(Clock::now() - start).count();
  for (int fd : fds) {
    if (::fdatasync(fd) != 0) std::perror("fdatasync"), failed.store(true);
    ::close(fd);
  }
  if (failed.load()) return 1;
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  const double bytes = static_cast<double>(files * pieces_per_file * piece);
  std::printf("%s: %d threads, %zu file(s), pieces of %.1f MiB: %.2f s (writes %.2f s), "
              "%.2f GB/s\n",
              direct ? "direct" : "cache", threads, files, piece / 1048576.0, s, written_s,
              bytes / s / 1e9);
  return 0;
}
