// InputViewEnv: one process's view of a checkpoint directory whose files are spread over
// several processes' disks (a multi-process run, fc/ops/shared_input.h builds it).
//
// Under `logical_root` (the input path as the user gave it, e.g. "ckpt_{rank}") the view
// lists the union of every process's files, with their sizes; a file is served
//   - from memory when its bytes were shared (metadata, read by one process and broadcast);
//   - from `local_root` (this process's expansion of the path) when this process sees it;
//   - otherwise as a file of the right size whose reads fail, naming the file and the
//     processes that can read it (the planner never has this process read it).
// Paths below a subdirectory of the root, and every path outside it, go to `base`
// (subdirectory paths mapped onto local_root). Writes are not redirected.
//
// Thread-safety: as `base`; the view itself is immutable after construction.
#ifndef FC_IO_INPUT_VIEW_ENV_H_
#define FC_IO_INPUT_VIEW_ENV_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fc/io/env.h"

namespace fc {

class InputViewEnv final : public Env {
 public:
  struct Entry {
    uint64_t size = 0;
    bool local = false;                          // in this process's local_root
    std::shared_ptr<const std::string> bytes;    // shared contents, or null
    std::string seen_by;                         // "processes 0, 2" for messages
  };
  // `entries`: the root's regular files by name (no '/').
  InputViewEnv(Env* base, std::string logical_root, std::string local_root,
               std::map<std::string, Entry> entries);

  // Whether this process can read `path` itself (from its own disk).
  bool LocalFile(const std::string& path);

  Result<std::unique_ptr<EnvReadableFile>> OpenForRead(const std::string& path) override;
  Result<std::unique_ptr<EnvWritableFile>> CreateForWrite(const std::string& path) override;
  EnvFileType Type(const std::string& path, bool follow) override;
  Result<std::vector<std::string>> ListDirectory(const std::string& dir) override;
  Status CreateDirectory(const std::string& dir) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDirectory(const std::string& dir) override;
  Status RemoveAll(const std::string& path) override;
  Result<std::unique_ptr<EnvFileLock>> LockFile(const std::string& path,
                                                std::string* holder) override;

 private:
  // The entry name when `path` is a file directly in the root ("" otherwise), and whether
  // `path` is the root itself.
  std::string EntryName(const std::string& path) const;
  bool IsRoot(const std::string& path) const;
  // `path` under the root mapped onto local_root; other paths unchanged.
  std::string Local(const std::string& path) const;

  Env* base_;
  std::string logical_root_;
  std::string local_root_;
  std::map<std::string, Entry> entries_;
};

}  // namespace fc

#endif  // FC_IO_INPUT_VIEW_ENV_H_
