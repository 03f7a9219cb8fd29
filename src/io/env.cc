// PosixEnv, InMemoryEnv, FaultInjectingEnv and the process-wide default, policy and
// cancellation flag.
//
// Why open with O_NONBLOCK: open(2) of a FIFO for reading blocks until a writer appears,
// so a FIFO planted in place of a data or metadata file would hang the tool before fstat
// could refuse it. With O_NONBLOCK the open returns at once; fstat then shows the type.
// Regular files ignore O_NONBLOCK.
//
// Why PosixWritable starts write-back early and drops written pages: fc's output is durable,
// so every file ends with fdatasync. Left alone, the kernel holds the written pages dirty
// until memory pressure or its timers, and the final fdatasync then writes the whole file
// while fc waits. Every kWriteBackStride bytes written to a file through the page cache,
// sync_file_range(SYNC_FILE_RANGE_WRITE) asks the kernel to start writing the file's dirty
// pages without waiting for them: the disk works while fc reads and assembles, and the
// fdatasync at the end finds little left to do. When the device's queue is full the call
// waits, which holds back a writer that runs ahead of the disk. Then
// posix_fadvise(POSIX_FADV_DONTNEED) drops the file's pages already on disk (dirty pages and
// pages under write-back stay): the output does not fill the page cache, which would evict
// the input being read and cost the kernel reclaim work per page. Measured on the 2-core VM
// (10 GB export, warm source): keeping the pages took 7.8-16.2 s with 11-28 s of system
// CPU, dropping them 5.2-5.7 s with 3.7-4.1 s; at 1 GB 0.60-0.83 s against 0.52-0.67 s.
// The output is therefore not in the page cache after a run. fc reads its own output back
// only where the fc distcp writer re-hashes a chunk whose slabs came too far out of order
// (FcDistcpWriterOptions::reorder_limit); those bytes then come from the disk.
//
// Why large writes, and large reads of an input fc brings in from the disk, use O_DIRECT: on
// the paths above the page cache costs more than the disk. The kernel copies every byte into
// and out of pages it must first find (reclaiming others once memory is full), write back,
// and then drop; a direct read or write moves the bytes between the device and fc's buffer
// in one step. Measured on the 2-core development VM (2026-12-07, virtio disk): 4 GiB of
// zeros written took 8.9-9.1 s through the page cache with a final fsync and 2.7-3.3 s with
// O_DIRECT (dd bs=4M); a cold 4.28 GB file read in 4.4-9.2 s by cat and 3.5-3.6 s by
// dd iflag=direct bs=16M; the cold 10 GB ZeRO-2 -> UCP convert ran 16.4-17.8 s through the
// page cache (12.7-18.2 s of system CPU) and 12.3-12.6 s direct with 4-8 workers (2.5 s);
// in interleaved runs later that day (4 workers, small reads kept from read-ahead as below),
// direct reads and writes 8.4-9.3 s, direct writes alone 14.2-14.7 s, direct reads alone
// 17.7-18.0 s, neither 18.4-18.5 s; warm 7.0-7.7 s against 16.3 s; the cold export of the
// fp32 weights 2.3-2.5 s against 2.9-3.2 s. Only whole aligned blocks of writes of at least
// kDirectMinBytes, and of reads of at least kDirectReadMinBytes, go direct, copied through a
// per-thread bounce buffer unless already aligned in memory (writes); everything else, and a
// warm input (whose cached pages a direct read would bypass), takes the page cache paths
// below. A direct write waits for the device, hence the IO floor on the worker count
// (fc/exec/parallel.h DefaultWorkerThreads).
//
// Why a file reserved at IoPolicy::page_cache_write_min_file_bytes (1 GiB) or more is written
// through the page cache all the same: the page cache's write-back, started every 16 MiB as
// above, wrote one large file faster than the workers' direct writes on the development VM
// (more workers did not close the gap: a warm 10 GB reshard took 8.5-9.4 s with 8 or 16
// threads, 8.6-9.3 s with 4), while direct writes win where the output is many smaller
// files, whose pages the page cache costs more per byte. On the
// development VM (2026-12-07, bench/write_paths: 4 threads writing 4 GiB in 2 MiB pieces,
// interleaved rounds): one file 1.77-2.42 s through the page cache against 2.38-3.00 s
// direct, four files of 1 GiB 1.62-2.63 s against 2.44-3.32 s, sixteen of 256 MiB even
// (2.53-2.84 against 2.41-2.67 s), 64 of 64 MiB 3.57-4.42 s against 2.42-3.27 s, 256 of
// 16 MiB 2.1-8.8 s against 2.1-2.6 s. In fc, interleaved with the build before: a warm
// 10 GB torch DCP reshard to one file 4.22-5.37 s against 6.71-7.90 s, a warm 10 GB export
// 4.97-7.67 s against 5.42-8.30 s, cold exports no different (2.85 GB of fp32 weights
// 2.73-3.49 s against 2.66-3.96 s; the 10 GB one 13.4-16.2 s against 12.4-16.4 s), and the
// ZeRO-2 -> UCP convert, whose 1362 files stay direct, unchanged (bench/README.md, "Large
// output files through the page cache"). But from a cold input the page cache path was the
// slower: the cold reshard took 14.61-15.18 s against 12.69-13.39 s direct, the cold DCP
// export 12.25-13.70 s against 11.86-12.84 s (3 interleaved rounds each); so once a process
// has read kColdInputBytes from cold files (ReadColdInput()), its large files are written
// direct as well (then the cold reshard 12.67-12.84 s against 12.31-14.09 s for the direct
// build, in 3 rounds; two runs right after a build took 44.2 and 16.1 s, unexplained).
//
// Why PosixReadable drops the input pages it read off the disk: a convert reads each byte
// once, so an input left in the page cache only grows it, and the kernel must find free
// pages for every later read and write, reclaiming others once memory is full. On the
// 2-core development VM, whose hypervisor backs guest memory lazily, pages not used for a
// while are also slow to touch (0.3-1.1 GiB/s past the memory used lately, bench/touch_memory):
// a cold 10 GB ZeRO-2 -> UCP convert ran 22.2 and 22.9 s keeping what it read, 14.0 and
// 16.6 s dropping it behind each stream, with fc/io/read_ahead.h (interleaved runs,
// 2026-12-07; bench/README.md, "At 10 GB"). The decision is per open file, at its first
// read, by mincore(2): fewer than half of its pages cached means fc brought them in;
// otherwise they are the user's (a warm input) and stay.
#include "fc/io/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>  // renameat2, RENAME_EXCHANGE
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <system_error>
#include <vector>

#include "fc/core/human_bytes.h"
#include "fc/io/read_ahead.h"

namespace fc {
namespace {

std::atomic<Env*> g_default_env{nullptr};
std::atomic<bool> g_follow_symlinks{false};
std::atomic<bool> g_direct_io{true};
std::atomic<uint64_t> g_page_cache_write_min_file_bytes{IoPolicy{}.page_cache_write_min_file_bytes};
// ReadColdInput(): true once kColdInputBytes have been read from files that were mostly out
// of the page cache at their first read. A threshold rather than the first such read: a
// small file the user's warm-up missed (torch DCP's .metadata, a config) says nothing of
// where the tensor bytes come from. Counting stops there (no atomic add per read after).
constexpr uint64_t kColdInputBytes = uint64_t{64} << 20;
std::atomic<uint64_t> g_cold_input_bytes{0};
bool ColdInputRead() {
  return g_cold_input_bytes.load(std::memory_order_relaxed) >= kColdInputBytes;
}
void CountColdRead(uint64_t length) {
  if (!ColdInputRead()) g_cold_input_bytes.fetch_add(length);
}
// ScopedThreadDirectIo: false while the calling thread must not use direct IO.
thread_local bool t_direct_io_allowed = true;
volatile sig_atomic_t g_cancel_signal = 0;

std::string ParentOf(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string TypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

bool IsWithin(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

// A symlink as the file's own name must resolve inside the directory that holds it.
Status CheckSymlink(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return Status::Ok();
  if (g_follow_symlinks.load()) return Status::Ok();
  char target[PATH_MAX];
  char dir[PATH_MAX];
  const std::string parent = ParentOf(path);
  if (::realpath(path.c_str(), target) == nullptr) {
    const int e = errno;
    if (e == ENOENT) return NotFoundError(path + ": dangling symlink");
    return ErrnoError("resolving symlink " + path, e);
  }
  if (::realpath(parent.c_str(), dir) == nullptr) return ErrnoError("resolving " + parent, errno);
  if (IsWithin(target, dir)) return Status::Ok();
  return InvalidArgumentError(path + ": symlink to " + target + ", outside the checkpoint directory " +
                              dir + "; refused (--follow-symlinks allows it)");
}

// How far ahead of each sequential stream of reads the kernel is asked to read (four of
// the executor's 2 MiB slabs, and more than the 8 MiB device read-ahead of the VM measured).
constexpr uint64_t kReadAheadBytes = uint64_t{32} << 20;

// Direct IO (the header comment says why). Offsets, lengths and memory are aligned to
// 4096 bytes, which covers every logical block size Linux file systems use for O_DIRECT
// (512 and 4096); a file system that wants more, or has no O_DIRECT, answers EINVAL and the
// file goes back to the page cache for good.
constexpr uint64_t kDirectAlign = 4096;
// Writes smaller than this go through the page cache: headers, metadata, small tensors, where
// waiting for the device would cost more than the page cache's write-back.
constexpr uint64_t kDirectMinBytes = uint64_t{1} << 20;
// Reads of a file read direct that are smaller than this go through the page cache, without
// read-ahead (which would fetch from the disk bytes that the direct reads then fetch again:
// with it, the cold 10 GB ZeRO-2 -> UCP convert read 14.24 GB off the disk for 10.0 GB).
constexpr uint64_t kDirectReadMinBytes = uint64_t{64} << 10;
// Per thread; a multiple of kDirectAlign.
constexpr size_t kBounceBytes = size_t{4} << 20;

constexpr uint64_t AlignDown(uint64_t v) { return v & ~(kDirectAlign - 1); }
constexpr uint64_t AlignUp(uint64_t v) { return AlignDown(v + kDirectAlign - 1); }
bool IsAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0; }

// The calling thread's bounce buffer for direct IO, allocated at its first use and freed
// when the thread ends; null when it cannot be allocated (the IO then uses the page cache).
std::byte* BounceBuffer() {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<std::byte, Free> buffer(
      static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, kBounceBytes)));
  return buffer.get();
}

// A second descriptor of the file open as `fd`, with O_DIRECT, or -1 where that cannot be
// had (the file system refuses O_DIRECT, no /proc). Through /proc/self/fd rather than the
// path: the same inode, whatever the path names by now.
int OpenDirect(int fd, int flags) {
#ifdef O_DIRECT
  if (!g_direct_io.load()) return -1;
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  return ::open(self.c_str(), flags | O_DIRECT | O_CLOEXEC);
#else
  (void)fd;
  (void)flags;
  return -1;
#endif
}

class PosixReadable : public EnvReadableFile {
 public:
  PosixReadable(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size), streams_(size, kReadAheadBytes) {}
  ~PosixReadable() override {
    ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }
  uint64_t size() const override { return size_; }
  Result<size_t> Read(uint64_t offset, std::span<std::byte> dst) const override {
    const std::span<std::byte> one[1] = {dst};
    if (BeforeRead(offset, dst.size())) {
      std::optional<size_t> n;
      FC_ASSIGN_OR_RETURN(n, DirectRead(offset, one, dst.size()));
      if (n) return *n;
    }
    for (;;) {
      const ssize_t n = ::pread(fd_, dst.data(), dst.size(), static_cast<off_t>(offset));
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      return ErrnoError("reading " + path_ + " at " + std::to_string(offset), errno);
    }
  }
  Result<size_t> ReadScattered(uint64_t offset,
                               std::span<const std::span<std::byte>> buffers) const override {
    struct iovec iov[64];
    int count = 0;
    uint64_t total = 0;
    for (const auto& b : buffers) {
      if (count == 64 || count == IOV_MAX) break;
      iov[count++] = {b.data(), b.size()};
      total += b.size();
    }
    if (BeforeRead(offset, total)) {
      std::optional<size_t> n;
      FC_ASSIGN_OR_RETURN(n, DirectRead(offset, buffers.first(static_cast<size_t>(count)), total));
      if (n) return *n;
    }
    for (;;) {
      const ssize_t n = ::preadv(fd_, iov, count, static_cast<off_t>(offset));
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      return ErrnoError("reading " + path_ + " at " + std::to_string(offset), errno);
    }
  }
  Result<Mapping> Map() const override {
    Mapping m;
    if (size_ == 0) return m;
    if (size_ > SIZE_MAX) return ResourceExhaustedError(path_ + ": too large to map");
    const size_t size = static_cast<size_t>(size_);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) return ErrnoError("mapping " + path_, errno);
    // Mappings serve parsers that touch a small part of a file (a pickle's opcodes around
    // arrays they only locate): without this the kernel's read-ahead on each fault reads
    // megabytes around it, which on a cold cache is the whole file. Advice only: a failure
    // costs speed, not correctness.
    (void)::madvise(p, size, MADV_RANDOM);
    m.data = static_cast<const std::byte*>(p);
    m.size = size;
    m.holder = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
    return m;
  }

 private:
  // Before each read (the header comment says why): whether to read it with O_DIRECT (a
  // large read of a file fc brings in from the disk); otherwise, page-cache advice: start
  // reading what the read's stream needs next and, in a file fc brought in from the disk,
  // drop what the stream has read. Advice only: a failure costs speed, not correctness.
  bool BeforeRead(uint64_t offset, uint64_t length) const {
    ReadAheadStreams::Advice advice;
    bool drop = false;
    {
      std::lock_guard<std::mutex> lock(streams_mu_);
      if (!cache_checked_) {
        drop_read_pages_ = MostlyUncached();
        cache_checked_ = true;
        if (drop_read_pages_) direct_fd_ = OpenDirect(fd_, O_RDONLY);
        if (direct_fd_ >= 0) (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
      }
      if (drop_read_pages_) CountColdRead(length);
      if (direct_fd_ >= 0 && direct_ok_.load() && t_direct_io_allowed) {
        return length >= kDirectReadMinBytes;
      }
      drop = drop_read_pages_;
      advice = streams_.OnRead(offset, length);
    }
    if (advice.will_need) {
      (void)::posix_fadvise(fd_, static_cast<off_t>(advice.will_need->offset),
                            static_cast<off_t>(advice.will_need->length), POSIX_FADV_WILLNEED);
    }
    // In steps of ahead / 2 per stream rather than per read: each DONTNEED also drains the
    // page LRU lists. Measured cost (bench/README.md, "At 10 GB"): a cold export of 2.85 GB
    // of fp32 weights out of 9.99 GB of ZeRO files ran 0.3-0.5 s slower with the advice,
    // per read or in steps alike; the cold 10 GB UCP convert 6-8 s faster.
    if (drop && advice.done) {
      (void)::posix_fadvise(fd_, static_cast<off_t>(advice.done->offset),
                            static_cast<off_t>(advice.done->length), POSIX_FADV_DONTNEED);
    }
    return false;
  }

  // Reads [offset, offset + total) into `buffers`, in order, with O_DIRECT through the
  // thread's bounce buffer: whole aligned blocks in, the asked bytes copied out. Returns the
  // bytes delivered (fewer at the end of the file), or nullopt where the direct path cannot
  // serve (no bounce buffer; EINVAL: the file system's alignment is stricter), and the
  // caller reads through the page cache.
  Result<std::optional<size_t>> DirectRead(uint64_t offset,
                                           std::span<const std::span<std::byte>> buffers,
                                           uint64_t total) const {
    std::byte* bounce = BounceBuffer();
    if (bounce == nullptr) return std::optional<size_t>();
    const uint64_t end = offset + total;
    uint64_t at = offset;
    size_t buffer_index = 0;
    size_t buffer_offset = 0;
    while (at < end) {
      const uint64_t block_start = AlignDown(at);
      const uint64_t want_end = std::min(end, block_start + kBounceBytes);
      const uint64_t block_end = AlignUp(want_end);
      ssize_t n;
      do {
        n = ::pread(direct_fd_, bounce, static_cast<size_t>(block_end - block_start),
                    static_cast<off_t>(block_start));
      } while (n < 0 && errno == EINTR);
      if (n < 0) {
        const int e = errno;
        if (e == EINVAL && at == offset) {
          if (direct_ok_.exchange(false)) (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_NORMAL);
          return std::optional<size_t>();
        }
        if (at > offset) break;  // what was read stands; the next read reports the error
        return ErrnoError("reading " + path_ + " at " + std::to_string(at), e);
      }
      const uint64_t got_end = block_start + static_cast<uint64_t>(n);
      if (got_end <= at) break;  // end of file
      const uint64_t copy_end = std::min(got_end, want_end);
      const std::byte* from = bounce + (at - block_start);
      uint64_t left = copy_end - at;
      while (left > 0 && buffer_index < buffers.size()) {
        const std::span<std::byte> b = buffers[buffer_index];
        const size_t k = static_cast<size_t>(std::min<uint64_t>(left, b.size() - buffer_offset));
        std::memcpy(b.data() + buffer_offset, from, k);
        from += k;
        left -= k;
        buffer_offset += k;
        if (buffer_offset == b.size()) {
          ++buffer_index;
          buffer_offset = 0;
        }
      }
      at = copy_end;
      if (got_end < block_end) break;  // short: the end of the file
    }
    return std::optional<size_t>(static_cast<size_t>(at - offset));
  }
  // Whether fewer than half of the file's pages are in the page cache: mincore(2) on a
  // mapping made for this and unmapped at once, never touched (it faults nothing in).
  // Where that cannot be told, no: nothing is dropped.
  bool MostlyUncached() const {
    if (size_ == 0 || size_ > SIZE_MAX) return false;
    const size_t bytes = static_cast<size_t>(size_);
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) return false;
    static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    // In windows of 16384 pages: a fixed 16 KiB vector, whatever the file's size.
    std::vector<unsigned char> resident(16384);
    const size_t window = resident.size() * page;
    size_t cached = 0;
    bool known = true;
    for (size_t at = 0; at < bytes && known; at += window) {
      const size_t len = std::min(window, bytes - at);
      known = ::mincore(static_cast<char*>(p) + at, len, resident.data()) == 0;
      const size_t pages = (len + page - 1) / page;
      const auto last = resident.begin() + static_cast<std::ptrdiff_t>(pages);
      cached += static_cast<size_t>(
          std::count_if(resident.begin(), last, [](unsigned char r) { return (r & 1) != 0; }));
    }
    ::munmap(p, bytes);
    return known && cached * 2 < (bytes + page - 1) / page;
  }

  std::string path_;
  int fd_;
  uint64_t size_;
  mutable std::mutex streams_mu_;
  mutable ReadAheadStreams streams_;
  mutable bool cache_checked_ = false;    // MostlyUncached() asked, at the first read
  mutable bool drop_read_pages_ = false;  // its answer
  mutable int direct_fd_ = -1;            // O_DIRECT descriptor, opened with that answer
  mutable std::atomic<bool> direct_ok_{true};
};

constexpr uint64_t kWriteBackStride = uint64_t{16} << 20;

class PosixWritable : public EnvWritableFile {
 public:
  PosixWritable(std::string path, int fd)
      : path_(std::move(path)), fd_(fd), direct_fd_(OpenDirect(fd, O_WRONLY)) {}
  ~PosixWritable() override {
    if (fd_ >= 0) ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }
  // A large write goes to the disk with O_DIRECT for its whole aligned blocks, through the
  // page cache for the partial blocks at either end (the header comment says why). The two
  // never share a block: a block is written whole by one write or in part by others, and
  // the kernel keeps a direct write and the page cache coherent for the same block.
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    if (fd_ < 0) return InternalError(path_ + ": write after close");
    if (direct_fd_ >= 0 && data.size() >= kDirectMinBytes && direct_ok_.load() &&
        t_direct_io_allowed &&
        !(large_file_.load(std::memory_order_relaxed) && !ColdInputRead())) {
      const uint64_t direct_start = AlignUp(offset);
      const uint64_t direct_end = AlignDown(offset + data.size());
      if (direct_start < direct_end) {
        const size_t head = static_cast<size_t>(direct_start - offset);
        const size_t body = static_cast<size_t>(direct_end - direct_start);
        FC_ASSIGN_OR_RETURN(const size_t written,
                            DirectWrite(direct_start, data.subspan(head, body)));
        FC_RETURN_IF_ERROR(BufferedWrite(offset, data.first(head)));
        return BufferedWrite(direct_start + written, data.subspan(head + written));
      }
    }
    return BufferedWrite(offset, data);
  }
  Status Sync() override {
    if (fd_ < 0) return InternalError(path_ + ": sync after close");
    if (::fdatasync(fd_) != 0) return ErrnoError("syncing " + path_, errno);
    return Status::Ok();
  }
  Status Reserve(uint64_t bytes) override {
    if (fd_ < 0) return InternalError(path_ + ": reserve after close");
    if (bytes == 0) return Status::Ok();
    // The header comment says why a large file is written through the page cache.
    if (bytes >= g_page_cache_write_min_file_bytes.load()) large_file_.store(true);
#ifdef __linux__
    if (bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
      return InvalidArgumentError(path_ + ": cannot reserve " + std::to_string(bytes) + " bytes");
    }
    int rc;
    do {
      rc = ::fallocate(fd_, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes));
    } while (rc != 0 && errno == EINTR);
    if (rc == 0) return Status::Ok();
    const int e = errno;
    if (e == EOPNOTSUPP || e == ENOSYS) return Status::Ok();
    return ErrnoError("reserving " + std::to_string(bytes) + " bytes (" + HumanBytes(bytes) +
                          ") for " + path_,
                      e);
#else
    return Status::Ok();
#endif
  }
  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    const int fd = fd_;
    fd_ = -1;
    if (direct_fd_ >= 0) {
      ::close(direct_fd_);
      direct_fd_ = -1;
    }
    if (::close(fd) != 0) return ErrnoError("closing " + path_, errno);
    return Status::Ok();
  }

  // Best effort: a write-back failure shows again, with its errno, at the fdatasync in Sync();
  // dropping pages is advice.
  void StartWriteBack() override {
#ifdef __linux__
    // Nothing written since the last start (or another writer just started it).
    if (fd_ < 0 || unstarted_bytes_.exchange(0) == 0) return;
    (void)::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
    (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
#endif
  }

 private:
  Status BufferedWrite(uint64_t offset, std::span<const std::byte> data) {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done,
                                 static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("writing " + path_, errno);
      }
      if (n == 0) return IoError("writing " + path_ + ": no progress (disk full?)");
      done += static_cast<size_t>(n);
    }
    if (!data.empty() &&
        unstarted_bytes_.fetch_add(data.size()) + data.size() >= kWriteBackStride) {
      StartWriteBack();
    }
    return Status::Ok();
  }

  // Writes whole blocks at an aligned `offset` with O_DIRECT: straight from `data` where it
  // is aligned in memory, else through the thread's bounce buffer. Returns how many bytes it
  // wrote, a multiple of the alignment; the caller writes the rest through the page cache
  // (all of it where the direct path cannot serve: no bounce buffer, EINVAL, a short write).
  Result<size_t> DirectWrite(uint64_t offset, std::span<const std::byte> data) {
    const bool aligned = IsAligned(data.data());
    std::byte* bounce = aligned ? nullptr : BounceBuffer();
    if (!aligned && bounce == nullptr) return size_t{0};
    size_t done = 0;
    while (done < data.size()) {
      // Aligned: in pieces of 1 GiB, under what one write(2) moves (0x7ffff000 bytes).
      const size_t k = std::min(aligned ? size_t{1} << 30 : kBounceBytes, data.size() - done);
      const std::byte* from = data.data() + done;
      if (!aligned) {
        std::memcpy(bounce, from, k);
        from = bounce;
      }
      ssize_t n;
      do {
        n = ::pwrite(direct_fd_, from, k, static_cast<off_t>(offset + done));
      } while (n < 0 && errno == EINTR);
      if (n < 0) {
        const int e = errno;
        if (e == EINVAL) {
          direct_ok_.store(false);
          return done;
        }
        return ErrnoError("writing " + path_, e);
      }
      done += AlignDown(static_cast<uint64_t>(n));
      if (static_cast<size_t>(n) < k) break;  // short (disk full?): the page cache path says
    }
    return done;
  }

  std::string path_;
  int fd_;
  int direct_fd_;  // O_DIRECT descriptor of the same file, or -1
  std::atomic<bool> direct_ok_{true};
  // Reserved at IoPolicy::page_cache_write_min_file_bytes or more: written through the page
  // cache while the process has read no cold input (ReadColdInput()).
  std::atomic<bool> large_file_{false};
  std::atomic<uint64_t> unstarted_bytes_{0};  // written since write-back was last started
};

class Posix : public Env {
 public:
  Result<std::unique_ptr<EnvReadableFile>> OpenForRead(const std::string& path) override {
    FC_RETURN_IF_ERROR(CheckSymlink(path));
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      const int e = errno;
      if (e == ENOENT) return NotFoundError(path + ": no such file");
      return ErrnoError("opening " + path, e);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return ErrnoError("stat " + path, e);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return InvalidArgumentError(path + ": is " + TypeName(st.st_mode) +
                                  ", expected a regular file");
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return std::unique_ptr<EnvReadableFile>(
        new PosixReadable(path, fd, static_cast<uint64_t>(st.st_size)));
  }
  Result<std::unique_ptr<EnvWritableFile>> CreateForWrite(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("creating " + path, errno);
    return std::unique_ptr<EnvWritableFile>(new PosixWritable(path, fd));
  }
  EnvFileType Type(const std::string& path, bool follow) override {
    struct stat st;
    if ((follow ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) != 0) {
      return EnvFileType::kMissing;
    }
    if (S_ISREG(st.st_mode)) return EnvFileType::kRegular;
    if (S_ISDIR(st.st_mode)) return EnvFileType::kDirectory;
    if (S_ISLNK(st.st_mode)) return EnvFileType::kSymlink;
    return EnvFileType::kOther;
  }
  Result<std::vector<std::string>> ListDirectory(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      const int e = errno;
      if (e == ENOENT) return NotFoundError(dir + ": no such directory");
      return ErrnoError("listing " + dir, e);
    }
    std::vector<std::string> names;
    while (struct dirent* ent = ::readdir(d)) {
      std::string name = ent->d_name;
      if (name == "." || name == "..") continue;
      names.push_back(std::move(name));
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }
  Status CreateDirectory(const std::string& dir) override {
    if (::mkdir(dir.c_str(), 0777) == 0) return Status::Ok();
    const int e = errno;
    if (e == EEXIST) return FailedPreconditionError(dir + ": exists");
    return ErrnoError("creating directory " + dir, e);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoError("renaming " + from + " to " + to, errno);
    }
    return Status::Ok();
  }
  Status Exchange(const std::string& a, const std::string& b) override {
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
      const int e = errno;
      // EINVAL: the file system has no RENAME_EXCHANGE (e.g. NFS); ENOSYS: the kernel.
      if (e == EINVAL || e == ENOSYS) {
        return UnimplementedError("exchanging " + a + " and " + b + ": " + std::strerror(e));
      }
      return ErrnoError("exchanging " + a + " and " + b, e);
    }
    return Status::Ok();
  }
  Status SyncDirectory(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("opening directory " + dir, errno);
    const int rc = ::fsync(fd);
    const int e = errno;
    ::close(fd);
    if (rc != 0) return ErrnoError("syncing directory " + dir, e);
    return Status::Ok();
  }
  Result<std::unique_ptr<EnvFileLock>> LockFile(const std::string& path,
                                                std::string* holder) override;
  Status RemoveAll(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return IoError("removing " + path + ": " + ec.message());
    return Status::Ok();
  }
};

// Why the inode check after flock: a second process may open the lock file just before
// its holder unlinks it and then lock the unlinked inode; comparing fstat(fd) with
// stat(path) catches that, and it retries on the new file.
class PosixLock : public EnvFileLock {
 public:
  PosixLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixLock() override {
    ::unlink(path_.c_str());  // while still holding it
    ::close(fd_);
  }

 private:
  std::string path_;
  int fd_;
};

Result<std::unique_ptr<EnvFileLock>> Posix::LockFile(const std::string& path,
                                                     std::string* holder) {
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("creating lock file " + path, errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      char buf[32] = {};
      const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
      ::close(fd);
      if (e != EWOULDBLOCK) return ErrnoError("locking " + path, e);
      std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      if (holder) *holder = pid;
      return FailedPreconditionError(path + ": locked by PID " + pid);
    }
    struct stat held, now;
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &now) == 0 &&
        held.st_ino == now.st_ino && held.st_dev == now.st_dev) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd, 0) != 0 ||
          ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
        const int e = errno;
        ::close(fd);
        return ErrnoError("writing " + path, e);
      }
      return std::unique_ptr<EnvFileLock>(new PosixLock(path, fd));
    }
    ::close(fd);
    if (attempt > 100) return IoError(path + ": lock file keeps changing");
  }
}

}  // namespace

Env* PosixEnv() {
  static Posix env;
  return &env;
}

Env* DefaultEnv() {
  Env* e = g_default_env.load();
  return e ? e : PosixEnv();
}

ScopedEnvOverride::ScopedEnvOverride(Env* env) : previous_(g_default_env.exchange(env)) {}
ScopedEnvOverride::~ScopedEnvOverride() { g_default_env.store(previous_); }

void SetIoPolicy(const IoPolicy& policy) {
  g_follow_symlinks.store(policy.follow_symlinks);
  g_direct_io.store(policy.direct_io);
  g_page_cache_write_min_file_bytes.store(policy.page_cache_write_min_file_bytes);
}
IoPolicy GetIoPolicy() {
  return IoPolicy{g_follow_symlinks.load(), g_direct_io.load(),
                  g_page_cache_write_min_file_bytes.load()};
}
bool ReadColdInput() { return ColdInputRead(); }
void ForgetColdInput() { g_cold_input_bytes.store(0); }
uint64_t DirectIoBufferBytes() { return g_direct_io.load() ? kBounceBytes : 0; }

ScopedThreadDirectIo::ScopedThreadDirectIo(bool allowed) : previous_(t_direct_io_allowed) {
  t_direct_io_allowed = previous_ && allowed;
}
ScopedThreadDirectIo::~ScopedThreadDirectIo() { t_direct_io_allowed = previous_; }

void RequestCancel(int signal_number) { g_cancel_signal = signal_number; }
int CancelSignal() { return g_cancel_signal; }
void ResetCancel() { g_cancel_signal = 0; }

// ---------------------------------------------------------------------------------------
// InMemoryEnv

namespace {

std::string Norm(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

class MemWritable : public EnvWritableFile {
 public:
  MemWritable(std::mutex* mu, std::shared_ptr<std::vector<std::byte>> bytes)
      : mu_(mu), bytes_(std::move(bytes)) {}
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    std::lock_guard<std::mutex> lock(*mu_);
    if (closed_) return InternalError("write after close");
    if (bytes_->size() < offset + data.size()) bytes_->resize(offset + data.size());
    if (!data.empty()) std::memcpy(bytes_->data() + offset, data.data(), data.size());
    return Status::Ok();
  }
  Status Sync() override { return Status::Ok(); }
  Status Close() override {
    closed_ = true;
    return Status::Ok();
  }
  Status Reserve(uint64_t) override {
    std::lock_guard<std::mutex> lock(*mu_);
    if (closed_) return InternalError("reserve after close");
    return Status::Ok();
  }

 private:
  std::mutex* mu_;
  std::shared_ptr<std::vector<std::byte>> bytes_;
  bool closed_ = false;
};

}  // namespace

InMemoryEnv::InMemoryEnv() {
  dirs_.insert("/");
  dirs_.insert(".");
}

Result<std::unique_ptr<EnvReadableFile>> InMemoryEnv::OpenForRead(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string p = Norm(path);
  if (dirs_.count(p)) return InvalidArgumentError(path + ": is a directory, expected a regular file");
  auto it = files_.find(p);
  if (it == files_.end()) return NotFoundError(path + ": no such file");
  // Readers see the bytes as of now.
  auto snapshot = std::make_shared<const std::vector<std::byte>>(*it->second);
  return NewMemoryReadableFile(*snapshot, snapshot);
}

Result<std::unique_ptr<EnvWritableFile>> InMemoryEnv::CreateForWrite(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string p = Norm(path);
  if (!dirs_.count(ParentOf(p))) return NotFoundError("creating " + path + ": no such directory");
  if (dirs_.count(p)) return IoError("creating " + path + ": is a directory");
  auto bytes = std::make_shared<std::vector<std::byte>>();
  files_[p] = bytes;
  return std::unique_ptr<EnvWritableFile>(new MemWritable(&mu_, bytes));
}

EnvFileType InMemoryEnv::Type(const std::string& path, bool) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string p = Norm(path);
  if (dirs_.count(p)) return EnvFileType::kDirectory;
  if (files_.count(p)) return EnvFileType::kRegular;
  return EnvFileType::kMissing;
}

Result<std::vector<std::string>> InMemoryEnv::ListDirectory(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string d = Norm(dir);
  if (!dirs_.count(d)) return NotFoundError(dir + ": no such directory");
  std::set<std::string> names;
  auto add = [&](const std::string& p) {
    if (p != d && ParentOf(p) == d) names.insert(p.substr(p.rfind('/') + 1));
  };
  for (const auto& [p, _] : files_) add(p);
  for (const std::string& p : dirs_) add(p);
  return std::vector<std::string>(names.begin(), names.end());
}

Status InMemoryEnv::CreateDirectory(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string d = Norm(dir);
  if (dirs_.count(d) || files_.count(d)) return FailedPreconditionError(dir + ": exists");
  if (!dirs_.count(ParentOf(d))) return NotFoundError("creating directory " + dir + ": no parent");
  dirs_.insert(d);
  return Status::Ok();
}

Status InMemoryEnv::Rename(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string f = Norm(from), t = Norm(to);
  if (!dirs_.count(ParentOf(t))) return NotFoundError("renaming " + from + " to " + to + ": no parent");
  if (auto it = files_.find(f); it != files_.end()) {
    if (dirs_.count(t)) return IoError("renaming " + from + " to " + to + ": is a directory");
    files_[t] = it->second;
    files_.erase(f);
    return Status::Ok();
  }
  if (!dirs_.count(f)) return NotFoundError("renaming " + from + ": no such file");
  if (files_.count(t)) return IoError("renaming " + from + " to " + to + ": not a directory");
  const std::string tp = t + "/";
  for (const auto& [p, _] : files_) {
    if (p.compare(0, tp.size(), tp) == 0) {
      return IoError("renaming " + from + " to " + to + ": Directory not empty");
    }
  }
  for (const std::string& p : dirs_) {
    if (p.compare(0, tp.size(), tp) == 0) {
      return IoError("renaming " + from + " to " + to + ": Directory not empty");
    }
  }
  const std::string fp = f + "/";
  std::map<std::string, Contents> files;
  for (auto& [p, c] : files_) {
    files[p.compare(0, fp.size(), fp) == 0 ? tp + p.substr(fp.size()) : p] = c;
  }
  std::set<std::string> dirs;
  for (const std::string& p : dirs_) {
    if (p == f) {
      dirs.insert(t);
    } else {
      dirs.insert(p.compare(0, fp.size(), fp) == 0 ? tp + p.substr(fp.size()) : p);
    }
  }
  files_ = std::move(files);
  dirs_ = std::move(dirs);
  return Status::Ok();
}

Status InMemoryEnv::Exchange(const std::string& a, const std::string& b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (exchange_disabled_) {
    return UnimplementedError("exchanging " + a + " and " + b + ": disabled for the test");
  }
  const std::string x = Norm(a), y = Norm(b);
  auto exists = [this](const std::string& p) { return files_.count(p) || dirs_.count(p); };
  if (!exists(x) || !exists(y)) return NotFoundError("exchanging " + a + " and " + b + ": missing");
  if (x == y) return Status::Ok();
  const std::string xp = x + "/", yp = y + "/";
  if (y.compare(0, xp.size(), xp) == 0 || x.compare(0, yp.size(), yp) == 0) {
    return IoError("exchanging " + a + " and " + b + ": one holds the other");
  }
  // Every path at or under x moves under y and the other way round.
  auto swap = [&](const std::string& p) {
    if (p == x) return y;
    if (p == y) return x;
    if (p.compare(0, xp.size(), xp) == 0) return yp + p.substr(xp.size());
    if (p.compare(0, yp.size(), yp) == 0) return xp + p.substr(yp.size());
    return p;
  };
  std::map<std::string, Contents> files;
  for (auto& [p, c] : files_) files[swap(p)] = c;
  std::set<std::string> dirs;
  for (const std::string& p : dirs_) dirs.insert(swap(p));
  files_ = std::move(files);
  dirs_ = std::move(dirs);
  return Status::Ok();
}

Status InMemoryEnv::SyncDirectory(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!dirs_.count(Norm(dir))) return NotFoundError("syncing directory " + dir + ": missing");
  return Status::Ok();
}

Status InMemoryEnv::RemoveAll(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string p = Norm(path), pp = p + "/";
  files_.erase(p);
  dirs_.erase(p);
  std::erase_if(files_, [&](const auto& kv) { return kv.first.compare(0, pp.size(), pp) == 0; });
  std::erase_if(dirs_, [&](const std::string& d) { return d.compare(0, pp.size(), pp) == 0; });
  return Status::Ok();
}

namespace {

class MemLock : public EnvFileLock {
 public:
  MemLock(InMemoryEnv* env, std::mutex* mu, std::set<std::string>* locked, std::string path)
      : env_(env), mu_(mu), locked_(locked), path_(std::move(path)) {}
  ~MemLock() override {
    (void)env_->RemoveAll(path_);
    std::lock_guard<std::mutex> lock(*mu_);
    locked_->erase(path_);
  }

 private:
  InMemoryEnv* env_;
  std::mutex* mu_;
  std::set<std::string>* locked_;
  std::string path_;
};

}  // namespace

Result<std::unique_ptr<EnvFileLock>> InMemoryEnv::LockFile(const std::string& path,
                                                           std::string* holder) {
  const std::string p = Norm(path);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!dirs_.count(ParentOf(p))) return NotFoundError("creating lock file " + path + ": no parent");
    if (locked_.count(p)) {
      if (holder) *holder = std::to_string(::getpid());
      return FailedPreconditionError(path + ": locked by PID " + std::to_string(::getpid()));
    }
    locked_.insert(p);
  }
  FC_RETURN_IF_ERROR(WriteFileForTest(p, std::to_string(::getpid()) + "\n"));
  return std::unique_ptr<EnvFileLock>(new MemLock(this, &mu_, &locked_, p));
}

Status InMemoryEnv::WriteFileForTest(const std::string& path, std::string_view bytes) {
  FC_ASSIGN_OR_RETURN(auto f, CreateForWrite(path));
  FC_RETURN_IF_ERROR(f->WriteAt(0, std::as_bytes(std::span<const char>(bytes.data(), bytes.size()))));
  return f->Close();
}

Result<std::string> InMemoryEnv::ReadFileForTest(const std::string& path) {
  FC_ASSIGN_OR_RETURN(auto f, OpenForRead(path));
  std::string s(f->size(), '\0');
  FC_ASSIGN_OR_RETURN(size_t n, f->Read(0, std::as_writable_bytes(std::span<char>(s.data(), s.size()))));
  s.resize(n);
  return s;
}

// ---------------------------------------------------------------------------------------
// FaultInjectingEnv

std::string_view FaultOpName(FaultOp op) {
  switch (op) {
    case FaultOp::kOpenRead: return "open";
    case FaultOp::kRead: return "read";
    case FaultOp::kCreate: return "create";
    case FaultOp::kWrite: return "write";
    case FaultOp::kSync: return "fsync";
    case FaultOp::kRename: return "rename";
    case FaultOp::kList: return "list";
    case FaultOp::kMkdir: return "mkdir";
    case FaultOp::kRemove: return "remove";
    case FaultOp::kReserve: return "reserve";
  }
  return "?";
}

void FaultInjectingEnv::FailNth(FaultOp op, uint64_t n) {
  armed_n_.store(n);
  armed_op_.store(n == 0 ? -1 : static_cast<int>(op));
  if (n != 0) fired_.store(false);
}

void FaultInjectingEnv::ResetCounts() {
  for (auto& c : counts_) c.store(0);
  fired_.store(false);
}

Status FaultInjectingEnv::Tick(FaultOp op, const std::string& path) {
  const uint64_t n = counts_[static_cast<int>(op)].fetch_add(1) + 1;
  if (armed_op_.load() == static_cast<int>(op) && armed_n_.load() == n) {
    fired_.store(true);
    return IoError("injected fault: " + std::string(FaultOpName(op)) + " #" + std::to_string(n) +
                   " on " + path);
  }
  return Status::Ok();
}

namespace {

class FaultReadable : public EnvReadableFile {
 public:
  FaultReadable(FaultInjectingEnv* env, std::string path, std::unique_ptr<EnvReadableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  uint64_t size() const override { return base_->size(); }
  Result<size_t> Read(uint64_t offset, std::span<std::byte> dst) const override {
    FC_RETURN_IF_ERROR(env_->Tick(FaultOp::kRead, path_));
    if (env_->short_reads() > 0 && dst.size() > env_->short_reads()) {
      dst = dst.first(env_->short_reads());
    }
    return base_->Read(offset, dst);
  }
  Result<size_t> ReadScattered(uint64_t offset,
                               std::span<const std::span<std::byte>> buffers) const override {
    FC_RETURN_IF_ERROR(env_->Tick(FaultOp::kRead, path_));
    if (env_->short_reads() > 0 && !buffers.empty()) {
      std::span<std::byte> first = buffers.front();
      return base_->Read(offset, first.first(std::min(first.size(), env_->short_reads())));
    }
    return base_->ReadScattered(offset, buffers);
  }
  Result<Mapping> Map() const override {
    FC_RETURN_IF_ERROR(env_->Tick(FaultOp::kRead, path_));
    return base_->Map();
  }

 private:
  FaultInjectingEnv* env_;
  std::string path_;
  std::unique_ptr<EnvReadableFile> base_;
};

class FaultWritable : public EnvWritableFile {
 public:
  FaultWritable(FaultInjectingEnv* env, std::string path, std::unique_ptr<EnvWritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    FC_RETURN_IF_ERROR(env_->Tick(FaultOp::kWrite, path_));
    return base_->WriteAt(offset, data);
  }
  Status Sync() override {
    FC_RETURN_IF_ERROR(env_->Tick(FaultOp::kSync, path_));
    return base_->Sync();
  }
  Status Close() override { return base_->Close(); }
  void StartWriteBack() override { base_->StartWriteBack(); }
  Status Reserve(uint64_t bytes) override {
    FC_RETURN_IF_ERROR(env_->Tick(FaultOp::kReserve, path_));
    return base_->Reserve(bytes);
  }

 private:
  FaultInjectingEnv* env_;
  std::string path_;
  std::unique_ptr<EnvWritableFile> base_;
};

}  // namespace

Result<std::unique_ptr<EnvReadableFile>> FaultInjectingEnv::OpenForRead(const std::string& path) {
  FC_RETURN_IF_ERROR(Tick(FaultOp::kOpenRead, path));
  FC_ASSIGN_OR_RETURN(auto f, base_->OpenForRead(path));
  return std::unique_ptr<EnvReadableFile>(new FaultReadable(this, path, std::move(f)));
}

Result<std::unique_ptr<EnvWritableFile>> FaultInjectingEnv::CreateForWrite(const std::string& path) {
  FC_RETURN_IF_ERROR(Tick(FaultOp::kCreate, path));
  FC_ASSIGN_OR_RETURN(auto f, base_->CreateForWrite(path));
  return std::unique_ptr<EnvWritableFile>(new FaultWritable(this, path, std::move(f)));
}

EnvFileType FaultInjectingEnv::Type(const std::string& path, bool follow) {
  return base_->Type(path, follow);
}

Result<std::vector<std::string>> FaultInjectingEnv::ListDirectory(const std::string& dir) {
  FC_RETURN_IF_ERROR(Tick(FaultOp::kList, dir));
  return base_->ListDirectory(dir);
}

Status FaultInjectingEnv::CreateDirectory(const std::string& dir) {
  FC_RETURN_IF_ERROR(Tick(FaultOp::kMkdir, dir));
  return base_->CreateDirectory(dir);
}

Status FaultInjectingEnv::Rename(const std::string& from, const std::string& to) {
  FC_RETURN_IF_ERROR(Tick(FaultOp::kRename, from));
  return base_->Rename(from, to);
}

Status FaultInjectingEnv::Exchange(const std::string& a, const std::string& b) {
  FC_RETURN_IF_ERROR(Tick(FaultOp::kRename, a));
  return base_->Exchange(a, b);
}

Status FaultInjectingEnv::SyncDirectory(const std::string& dir) {
  FC_RETURN_IF_ERROR(Tick(FaultOp::kSync, dir));
  return base_->SyncDirectory(dir);
}

Result<std::unique_ptr<EnvFileLock>> FaultInjectingEnv::LockFile(const std::string& path,
                                                                 std::string* holder) {
  return base_->LockFile(path, holder);
}

Status FaultInjectingEnv::RemoveAll(const std::string& path) {
  // Cleanup is counted but never failed by default: a failed removal is only untidy, and
  // the tests check that staging goes away. (Arm kRemove to test that path.)
  FC_RETURN_IF_ERROR(Tick(FaultOp::kRemove, path));
  return base_->RemoveAll(path);
}


namespace {

class MemoryReadableFile final : public EnvReadableFile {
 public:
  MemoryReadableFile(std::span<const std::byte> bytes, std::shared_ptr<const void> holder)
      : bytes_(bytes), holder_(std::move(holder)) {}
  uint64_t size() const override { return bytes_.size(); }
  Result<size_t> Read(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset >= bytes_.size()) return size_t{0};
    const size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), bytes_.size() - offset));
    if (n > 0) std::memcpy(dst.data(), bytes_.data() + offset, n);
    return n;
  }
  Result<Mapping> Map() const override {
    Mapping m;
    m.data = bytes_.data();
    m.size = bytes_.size();
    m.holder = std::const_pointer_cast<void>(holder_);
    return m;
  }

 private:
  std::span<const std::byte> bytes_;
  std::shared_ptr<const void> holder_;
};

}  // namespace

std::unique_ptr<EnvReadableFile> NewMemoryReadableFile(std::span<const std::byte> bytes,
                                                       std::shared_ptr<const void> holder) {
  return std::make_unique<MemoryReadableFile>(bytes, std::move(holder));
}

}  // namespace fc
