// The file-system operations fc performs, behind one interface (after leveldb's Env), so
// that tests can run the real readers and writers on an in-memory file system or with
// injected faults. Everything in fc/io/file.h (RandomAccessFile, MappedFile, WritableFile,
// ListDirectory, RenameDurably, ...) goes through the process-wide default Env; callers of
// those functions never see an Env.
//
// Implementations:
//   PosixEnv()            the real file system (the default)
//   InMemoryEnv           a private file tree in memory (tests)
//   FaultInjectingEnv     wraps another Env and fails its Nth operation of a kind, or
//                         makes reads short (tests)
// Replace the default for a scope with ScopedEnvOverride (tests only; not thread-safe
// against concurrent file operations while the override is installed or removed).
//
// Thread-safety: every Env and every file object it returns must allow concurrent calls
// (readers call ReadAt from worker threads; writers write disjoint ranges of one file from
// several threads).
#ifndef FC_IO_ENV_H_
#define FC_IO_ENV_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "fc/core/status.h"

namespace fc {

// An open file for reading. Read may return fewer bytes than asked (a short read is not an
// error; 0 at a position below size() means the file shrank).
class EnvReadableFile {
 public:
  virtual ~EnvReadableFile() = default;
  virtual uint64_t size() const = 0;
  virtual Result<size_t> Read(uint64_t offset, std::span<std::byte> dst) const = 0;
  // Reads the file range at `offset` into `buffers` in order (at most the first few);
  // returns the bytes read, possibly fewer than asked. Default: one Read into the first
  // buffer. POSIX: preadv, so the kernel copies straight into place.
  virtual Result<size_t> ReadScattered(uint64_t offset,
                                       std::span<const std::span<std::byte>> buffers) const {
    return buffers.empty() ? Result<size_t>(size_t{0}) : Read(offset, buffers.front());
  }
  // A read-only view of the whole file that stays valid as long as the returned holder
  // lives (mmap for POSIX). `data` may be null for an empty file.
  struct Mapping {
    const std::byte* data = nullptr;
    size_t size = 0;
    std::shared_ptr<void> holder;  // releases the view
  };
  virtual Result<Mapping> Map() const = 0;
  // False for a file this process knows only by name and size (it lies on another
  // process's disk, fc/io/input_view_env.h): every read fails. Readers that check a file's
  // contents when they open a checkpoint skip such files; whoever reads them checks then.
  virtual bool readable_here() const { return true; }
  // Whether reads of this file count in the process's bytes read (fc/io/counters.h, what
  // --stats reports): false for bytes that another process read from its disk and sent here
  // (metadata shared among processes, ranges fetched for this process,
  // fc/io/input_view_env.h), which the process that read them counted.
  virtual bool counts_as_read() const { return true; }
};

// A readable file over `bytes` in memory, which `holder` keeps alive (and unchanged) for as
// long as the file or a Map() of it lives: in-memory files (InMemoryEnv) and metadata bytes
// shared among processes (fc/io/input_view_env.h).
std::unique_ptr<EnvReadableFile> NewMemoryReadableFile(std::span<const std::byte> bytes,
                                                       std::shared_ptr<const void> holder);

// An open file for writing (created or truncated). WriteAt may be called concurrently for
// disjoint ranges. Written bytes are durable only after Sync(); the POSIX file starts the
// kernel's write-back of what it has been given every 16 MiB, without waiting for it, and
// drops from the page cache the pages already written back.
class EnvWritableFile {
 public:
  virtual ~EnvWritableFile() = default;
  virtual Status WriteAt(uint64_t offset, std::span<const std::byte> data) = 0;
  virtual Status Sync() = 0;
  virtual Status Close() = 0;
  // Advice, for a writer done with a file well before its Sync: start writing what was
  // written so far to the device without waiting for it, and let the cache drop those pages
  // once they are on disk. The POSIX file does this by itself every 16 MiB written; a file
  // smaller than that would otherwise stay dirty until the Sync at the end. Errors surface
  // at Sync. Default: nothing (in-memory files).
  virtual void StartWriteBack() {}
  // Allocates disk space for the file's first `bytes`, for a writer that will write all of
  // them, so that a disk without room for the file says so before any of it is written (a
  // 10 GB export to a full disk fails in its first second, not after writing what fits),
  // and the file is laid out in few extents. The file's size does not change: it still
  // grows as bytes are written, so a file's size still tells whether its last bytes were
  // written (torch DCP's commit checks the data files' sizes).
  // Errors: kIoError naming the path and the bytes (ENOSPC: "No space left on device").
  // POSIX: fallocate(2) with FALLOC_FL_KEEP_SIZE (never glibc's posix_fallocate emulation,
  // which writes zeros); a file system that cannot (EOPNOTSUPP) allocates as it writes.
  // POSIX, direct IO on: a file reserved at IoPolicy::page_cache_write_min_file_bytes or
  // more is written through the page cache from then on, while the process reads no cold
  // input (ReadColdInput()). In memory: nothing.
  virtual Status Reserve(uint64_t bytes) = 0;
};

// A held advisory lock; destroying it removes the lock file and releases the lock.
class EnvFileLock {
 public:
  virtual ~EnvFileLock() = default;
};

enum class EnvFileType { kMissing, kRegular, kDirectory, kSymlink, kOther };

class Env {
 public:
  virtual ~Env() = default;
  // Opens a regular file for reading. Errors: kNotFound for a missing file;
  // kInvalidArgument for a directory, a FIFO, a device or a socket (never blocks on one),
  // and for a symlink that resolves outside the directory holding it unless
  // IoPolicy::follow_symlinks; kIoError otherwise. Messages name the path.
  virtual Result<std::unique_ptr<EnvReadableFile>> OpenForRead(const std::string& path) = 0;
  // Creates (or truncates) a file for writing, mode 0644 & ~umask.
  virtual Result<std::unique_ptr<EnvWritableFile>> CreateForWrite(const std::string& path) = 0;
  // The type of `path` itself (lstat: a symlink is kSymlink) when `follow` is false.
  virtual EnvFileType Type(const std::string& path, bool follow) = 0;
  // Sorted entry names (no "." or ".."). Errors: kNotFound / kIoError.
  virtual Result<std::vector<std::string>> ListDirectory(const std::string& dir) = 0;
  // mkdir(2) of one directory; kFailedPrecondition ("exists") when it exists.
  virtual Status CreateDirectory(const std::string& dir) = 0;
  // rename(2): replaces a file, or an empty directory by a directory.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Swaps two existing paths in one step (renameat2(2) RENAME_EXCHANGE): each then names
  // what the other named. Errors: kUnimplemented when the file system cannot (the caller
  // falls back to renames); kNotFound / kIoError.
  virtual Status Exchange(const std::string& a, const std::string& b) {
    return UnimplementedError("exchanging " + a + " and " + b + ": not supported here");
  }
  virtual Status SyncDirectory(const std::string& dir) = 0;
  // Removes a file or a whole tree; a missing path is fine.
  virtual Status RemoveAll(const std::string& path) = 0;
  // Takes an exclusive lock on the file `path` (created if missing) and writes this
  // process's PID into it. Errors: kFailedPrecondition when someone else holds it, with
  // the PID text found in the file in *holder; kIoError. POSIX: flock(2), dropped by the
  // kernel when the holder dies, so a stale lock file never blocks.
  virtual Result<std::unique_ptr<EnvFileLock>> LockFile(const std::string& path,
                                                        std::string* holder) = 0;
};

// The real file system. A file that was mostly out of the page cache when first read is read
// with O_DIRECT in reads of at least 64 KiB (smaller ones through the page cache, without
// read-ahead); a cached input is read through the page cache and stays cached, each
// sequential stream of its reads read ahead (fc/io/read_ahead.h). Writes of at least 1 MiB
// write their whole 4 KiB blocks with O_DIRECT, except to a file reserved at
// IoPolicy::page_cache_write_min_file_bytes or more (1 GiB: an export's shards, a resharded
// DCP file) while the process has read only cached input (ReadColdInput()): the page cache
// writes those faster when the input is warm. Where the file system refuses O_DIRECT, or
// IoPolicy::direct_io is off, everything goes through the page cache, and a file fc brings
// in from the disk has its pages dropped behind the reads. What Read returns and what a file
// holds after Sync are the same either way.
Env* PosixEnv();

// The Env that fc/io/file.h uses now: PosixEnv() unless overridden.
Env* DefaultEnv();

// Installs `env` as DefaultEnv() until destroyed (restores the previous one).
class ScopedEnvOverride {
 public:
  explicit ScopedEnvOverride(Env* env);
  ~ScopedEnvOverride();
  ScopedEnvOverride(const ScopedEnvOverride&) = delete;
  ScopedEnvOverride& operator=(const ScopedEnvOverride&) = delete;

 private:
  Env* previous_;
};

// Process-wide read policy (set once by the tools from their flags, before any IO).
struct IoPolicy {
  // Allow a file that is a symlink resolving outside the directory that holds it (e.g. a
  // HuggingFace cache snapshot whose files point into ../../blobs). Default: refused.
  bool follow_symlinks = false;
  // Read and write large ranges with O_DIRECT where the file system allows it: reads of an
  // input that was mostly out of the page cache (64 KiB or more), and writes of output
  // (1 MiB or more) to a file not reserved as large (below; see PosixEnv()).
  // Default: on.
  bool direct_io = true;
  // With direct_io: a file whose EnvWritableFile::Reserve asked for at least this many bytes
  // is written through the page cache all the same while the process has read no cold input
  // (ReadColdInput(); PosixEnv() says why). Default: 1 GiB.
  uint64_t page_cache_write_min_file_bytes = uint64_t{1} << 30;
};
void SetIoPolicy(const IoPolicy& policy);
IoPolicy GetIoPolicy();

// Bytes each thread that reads or writes through PosixEnv() may hold for direct IO under
// the current policy: its bounce buffer (allocated at the thread's first direct read or
// unaligned direct write, kept until the thread ends), or 0 with IoPolicy::direct_io off.
// Planners charge it per worker thread to the memory budget (PlanRequest::io_buffer_bytes).
uint64_t DirectIoBufferBytes();

// Whether this process has read, through PosixEnv(), 64 MiB or more from files that were
// mostly out of the page cache at their first read (a cold input, which direct IO reads with
// O_DIRECT), since it started or since the last ForgetColdInput() (tests). From then on its
// large output files are written with O_DIRECT too (IoPolicy::page_cache_write_min_file_bytes).
bool ReadColdInput();
void ForgetColdInput();

// While one lives with `allowed` false, the calling thread reads and writes through the page
// cache only (no bounce buffer is allocated for it): the executor's workers under a budget
// that leaves no room for their bounce buffers (fc/plan/plan.h, PlanMemory::io_buffers).
// `allowed` true changes nothing (it cannot turn on what the policy or an outer one turned
// off). Restores the thread's previous setting when destroyed.
class ScopedThreadDirectIo {
 public:
  explicit ScopedThreadDirectIo(bool allowed);
  ~ScopedThreadDirectIo();
  ScopedThreadDirectIo(const ScopedThreadDirectIo&) = delete;
  ScopedThreadDirectIo& operator=(const ScopedThreadDirectIo&) = delete;

 private:
  bool previous_;
};

// Cancellation: once RequestCancel() was called (e.g. from a SIGINT/SIGTERM handler; it
// is async-signal-safe), every later Env operation through DefaultEnv() fails with
// kIoError "interrupted (signal N)", so a run unwinds through its normal error paths and
// removes its staging. CancelSignal() is 0 while not cancelled.
void RequestCancel(int signal_number);
int CancelSignal();
void ResetCancel();  // tests

// A private in-memory file tree. Directories are explicit ("/" and "." always exist);
// paths are used as given (no normalisation beyond trailing slashes). Symlinks, FIFOs
// and permissions do not exist here.
class InMemoryEnv : public Env {
 public:
  InMemoryEnv();
  Result<std::unique_ptr<EnvReadableFile>> OpenForRead(const std::string& path) override;
  Result<std::unique_ptr<EnvWritableFile>> CreateForWrite(const std::string& path) override;
  EnvFileType Type(const std::string& path, bool follow) override;
  Result<std::vector<std::string>> ListDirectory(const std::string& dir) override;
  Status CreateDirectory(const std::string& dir) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Exchange(const std::string& a, const std::string& b) override;
  Status SyncDirectory(const std::string& dir) override;
  Status RemoveAll(const std::string& path) override;
  Result<std::unique_ptr<EnvFileLock>> LockFile(const std::string& path,
                                                std::string* holder) override;
  // Exchange answers kUnimplemented, as on a file system without RENAME_EXCHANGE (tests of
  // the fallback).
  void DisableExchangeForTest() { exchange_disabled_ = true; }

  // Test helpers.
  Status WriteFileForTest(const std::string& path, std::string_view bytes);
  Result<std::string> ReadFileForTest(const std::string& path);

 private:
  using Contents = std::shared_ptr<std::vector<std::byte>>;
  std::mutex mu_;
  std::map<std::string, Contents> files_;
  std::set<std::string> dirs_;
  std::set<std::string> locked_;
  bool exchange_disabled_ = false;
};

// The operations FaultInjectingEnv counts, each kind on its own counter.
enum class FaultOp {
  kOpenRead, kRead, kCreate, kWrite, kSync, kRename, kList, kMkdir, kRemove, kReserve
};
inline constexpr int kFaultOpCount = 10;
std::string_view FaultOpName(FaultOp op);

// Wraps `base`: counts operations of each kind (1-based, across all files and threads) and
// fails the one armed with FailNth, once, with kIoError "injected fault: <op> #N on
// <path>". ShortReads makes every read return at most `max_bytes` (callers must loop).
class FaultInjectingEnv : public Env {
 public:
  explicit FaultInjectingEnv(Env* base) : base_(base) {}
  // Fails operation number n (1-based) of kind `op`; 0 disarms (Fired() keeps its value).
  void FailNth(FaultOp op, uint64_t n);
  // ResetCounts, then fail the next `op` (its number 1).
  void FailNext(FaultOp op) {
    ResetCounts();
    FailNth(op, 1);
  }
  void Disarm() { FailNth(FaultOp::kOpenRead, 0); }
  void ShortReads(size_t max_bytes) { short_reads_ = max_bytes; }
  uint64_t Count(FaultOp op) const { return counts_[static_cast<int>(op)].load(); }
  bool Fired() const { return fired_.load(); }
  void ResetCounts();

  Result<std::unique_ptr<EnvReadableFile>> OpenForRead(const std::string& path) override;
  Result<std::unique_ptr<EnvWritableFile>> CreateForWrite(const std::string& path) override;
  EnvFileType Type(const std::string& path, bool follow) override;
  Result<std::vector<std::string>> ListDirectory(const std::string& dir) override;
  Status CreateDirectory(const std::string& dir) override;
  Status Rename(const std::string& from, const std::string& to) override;
  // Counted as a kRename.
  Status Exchange(const std::string& a, const std::string& b) override;
  Status SyncDirectory(const std::string& dir) override;
  Status RemoveAll(const std::string& path) override;
  Result<std::unique_ptr<EnvFileLock>> LockFile(const std::string& path,
                                                std::string* holder) override;

  // Counts one `op` on `path`; the armed one returns the injected error. (Public for the
  // file wrappers.)
  Status Tick(FaultOp op, const std::string& path);
  size_t short_reads() const { return short_reads_; }

 private:
  Env* base_;
  std::atomic<uint64_t> counts_[kFaultOpCount] = {};
  std::atomic<int> armed_op_{-1};
  std::atomic<uint64_t> armed_n_{0};
  std::atomic<bool> fired_{false};
  size_t short_reads_ = 0;
};

}  // namespace fc

#endif  // FC_IO_ENV_H_
