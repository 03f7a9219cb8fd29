// The one way fc writes an output directory (fc-export, fc-convert, the fc distcp and
// torch DCP writers): claim OUT with a lock, build everything in a staging directory next
// to it, and make it appear with one rename(2). man/fc-distcp.5 ("OUTPUT PROTOCOL") and
// the README's output section describe the same protocol for users.
//
//   <parent>/<name>                        OUT: absent, or an empty directory, until the
//                                          commit renames the staging directory onto it
//   <parent>/<name>.fc-lock                lock file: flock(2) LOCK_EX held for the whole
//                                          run; holds the owner's PID (text); removed at
//                                          the end (a stale one after a crash is harmless)
//   <parent>/<name>.fc-tmp-<pid>-XXXXXX    staging: <pid> the creating process, XXXXXX six
//                                          random [A-Za-z0-9]; mode 0777 & ~umask
//
// Commit: fsync every file (the writers do), fsync every directory of the staging tree
// (its subdirectories first, then the staging directory itself), check OUT is
// still absent or empty, rename(2) staging onto OUT, fsync <parent>. So OUT holds nothing
// or a complete result at every instant, whatever kills the process. A run that fails or
// is interrupted (SIGINT/SIGTERM: see RequestCancel in fc/io/env.h) removes its staging;
// after SIGKILL or a power loss the staging stays, and the next run on the same OUT
// removes every "<name>.fc-tmp-<pid>-*" whose process is no longer alive (kill(pid, 0)
// fails with ESRCH) once it holds the lock.
//
// Replacing an existing OUT (fc-export/fc-convert --overwrite; OutputDir::Open with
// ExistingOutput::kReplace): OUT may then be a non-empty directory (not a symlink), and the
// commit swaps the staging directory and OUT in one renameat2(RENAME_EXCHANGE), fsyncs
// <parent>, and removes the old output (now at the staging path). OUT holds the old output
// or the complete new one at every instant; a run that fails before the commit leaves the
// old output untouched. Where the file system cannot exchange (kUnimplemented from
// Env::Exchange, e.g. NFS) the commit renames OUT to "<name>.fc-old-<pid>", renames the
// staging onto OUT and removes the old: between those two renames OUT is absent, and a
// crash there leaves the old output at "<name>.fc-old-<pid>" (never swept: it is the
// user's). Which checks decide that a directory may be replaced (a checkpoint, not any
// directory) belong to the caller (src/ops/claim_output.h).
//
// Everything goes through DefaultEnv() (the lock: Env::LockFile) except the nesting check,
// which resolves symlinks with realpath(3) on the real file system (a path that does not
// exist there is compared as written).
#ifndef FC_IO_OUTPUT_DIR_H_
#define FC_IO_OUTPUT_DIR_H_

#include <memory>
#include <string>

#include "fc/core/status.h"
#include "fc/io/env.h"

namespace fc {

// Creates "<out>.fc-tmp-<pid>-XXXXXX" next to `out` and returns its path. Errors:
// kFailedPrecondition when `out` exists and is not an empty directory; kIoError when the
// parent is missing or not writable.
Result<std::string> CreateStagingDir(const std::string& out);

// Commits a fully written staging directory: fsync its directories (subdirectories, then
// it), re-check that `out` is absent or
// an empty directory (kFailedPrecondition otherwise), rename it onto `out`, fsync the
// parent (when that fails, the directory is renamed back). On error the staging directory
// is left for the caller to remove. While an OutputDir of this process claims `out` with
// ExistingOutput::kReplace, a non-empty `out` is replaced instead (above).
Status CommitStagingDir(const std::string& staging, const std::string& out);

// What OutputDir::Open does with an OUT that exists and is not empty.
enum class ExistingOutput {
  kRefuse,   // kFailedPrecondition: "output directory exists and is not empty"
  kReplace,  // the commit replaces it (a directory, not a symlink or a file)
};

// Removes "<out>.fc-tmp-<pid>-*" directories whose process is dead; returns how many.
// Call only while holding OUT's lock.
Result<int> SweepDeadStaging(const std::string& out);

// kInvalidArgument when `out` is `input`, lies inside the input directory, or contains
// `input` (after resolving symlinks; a missing `out` is resolved through its nearest
// existing ancestor). A file `input` counts as itself, not its directory.
Status CheckOutputNotNested(const std::string& out, const std::string& input);

// One run's claim on an output directory.
class OutputDir {
 public:
  // In order: CheckOutputNotNested (when input is not empty), take the lock
  // (kFailedPrecondition "<out>: output in use by PID N (lock <out>.fc-lock)" when another
  // live run holds it), check that OUT is absent or an empty directory
  // (kFailedPrecondition; with kReplace: absent or a directory), sweep dead staging, create
  // the staging directory.
  static Result<std::unique_ptr<OutputDir>> Open(const std::string& out, const std::string& input,
                                                 ExistingOutput existing = ExistingOutput::kRefuse);
  // Removes the staging directory unless committed, then releases and removes the lock.
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& path() const { return out_; }
  const std::string& staging() const { return staging_; }

  // CommitStagingDir(staging(), path()).
  Status Commit();
  // The staging directory was committed by someone else (a writer that renames it itself,
  // e.g. CommitFcDistcpMetadata): do not remove it.
  void MarkCommitted() { committed_ = true; }

 private:
  OutputDir() = default;
  std::string out_;
  std::string staging_;
  std::unique_ptr<EnvFileLock> lock_;
  bool committed_ = false;
  bool replace_ = false;  // registered as replaceable until destroyed
};

}  // namespace fc

#endif  // FC_IO_OUTPUT_DIR_H_
