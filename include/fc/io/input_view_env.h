// InputViewEnv: one process's view of a checkpoint directory whose files are spread over
// several processes' disks (a multi-process run, fc/ops/shared_input.h builds it).
//
// Under `logical_root` (the input path as the user gave it, e.g. "ckpt_{rank}") the view
// lists the union of every process's files, with their sizes, in the root and in its
// subdirectories (entries are named by their path relative to the root, "tag/x.pt"). A file
// is served
//   - from memory when its bytes were shared (metadata, read by one process and broadcast);
//   - from `local_root` (this process's expansion of the path) when this process sees it;
//   - otherwise as a file of the right size whose reads are answered from the ranges
//     fetched for it (AddFetched), and fail for any other range, naming the file and the
//     processes that can read it (the planner never has this process read data there).
// While a fetch function is set (SetFetch: the process that opens the checkpoint first),
// every read of a file that not every process sees goes through it, local or not, so that
// what opening reads is fetched once and handed to every process (shared_input.cc).
// Paths outside the root go to `base`; writes are not redirected.
//
// Thread-safety: as `base`. The entries are immutable after construction; fetched ranges
// and the fetch function are guarded (the fetch function itself is called from the thread
// that reads, which must be the one allowed to talk to other processes).
#ifndef FC_IO_INPUT_VIEW_ENV_H_
#define FC_IO_INPUT_VIEW_ENV_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "fc/io/env.h"

namespace fc {

class InputViewEnv final : public Env {
 public:
  struct Entry {
    uint64_t size = 0;
    bool local = false;                          // in this process's local_root
    bool on_every_process = false;               // every process sees it
    int reader = 0;                              // the lowest process that sees it
    std::shared_ptr<const std::string> bytes;    // shared contents, or null
    std::string seen_by;                         // "processes 0, 2" for messages
  };
  // `entries`: the regular files under the root by relative path ("a.pt", "tag/b.pt").
  InputViewEnv(Env* base, std::string logical_root, std::string local_root,
               std::map<std::string, Entry> entries);

  // Whether this process can read `path` itself (from its own disk).
  bool LocalFile(const std::string& path);

  // Brings `length` bytes at `offset` of entry `name` into this view (AddFetched), or fails.
  using Fetch = std::function<Status(const std::string& name, uint64_t offset, uint64_t length)>;
  // Sets (or, with an empty function, clears) the fetch function.
  void SetFetch(Fetch fetch);
  // Bytes of entry `name` from `offset`, served to every later read inside them.
  void AddFetched(const std::string& name, uint64_t offset, std::shared_ptr<const std::string> bytes);
  // Entry `name` opened from this process's own disk (for serving fetches).
  Result<std::unique_ptr<EnvReadableFile>> OpenLocal(const std::string& name);
  // The entry named `name` (relative path), or null.
  const Entry* Find(const std::string& name) const;
  // Whether some file is not on every process's disk (and not shared as bytes): then
  // opening on one process may read what another process lacks.
  bool HasUnsharedFiles() const;
  // Reads so far of bytes this process could not serve (not on its disk, not fetched, no
  // fetch function set): they failed with kNotFound. A reader that opened by reading such
  // bytes may have seen the checkpoint otherwise than a process that has them.
  uint64_t missed_reads() const { return missed_reads_.load(); }

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

  // For the files it serves (input_view_env.cc): copies the fetched bytes covering
  // [offset, offset + dst.size()) into `dst`, fetching them first when a fetch function is
  // set; false when they are not here.
  Result<bool> ReadFetched(const std::string& name, uint64_t offset, std::span<std::byte> dst);

 private:
  // The path relative to the root when `path` is below it ("" otherwise).
  std::string RelativeName(const std::string& path) const;
  bool IsRoot(const std::string& path) const;
  // `path` under the root mapped onto local_root; other paths unchanged.
  std::string Local(const std::string& path) const;
  // Whether reads of `name` go through the fetch function now.
  bool Fetching() const;
  // Copies from a fetched range that covers the request; false when none does.
  bool CopyFetched(const std::string& name, uint64_t offset, std::span<std::byte> dst) const;

  Env* base_;
  std::string logical_root_;
  std::string local_root_;
  std::map<std::string, Entry> entries_;
  std::set<std::string> directories_;  // relative paths of the entries' parent directories

  mutable std::mutex mu_;
  Fetch fetch_;
  std::atomic<uint64_t> missed_reads_{0};
  // Per entry: fetched ranges by offset.
  std::map<std::string, std::map<uint64_t, std::shared_ptr<const std::string>>> fetched_;
};

}  // namespace fc

#endif  // FC_IO_INPUT_VIEW_ENV_H_
