// File access for readers and writers: positional reads, sequential writes, directory
// listing, and the atomic-commit helpers writers use so that a failed run never leaves an
// output that looks complete. Everything here goes through DefaultEnv() (fc/io/env.h): the
// real file system unless a test installed another Env. Reads open regular files only
// (FIFOs, devices, sockets and directories are refused with kInvalidArgument, without
// blocking), and a symlink resolving outside its directory is refused unless
// IoPolicy::follow_symlinks. After RequestCancel (a signal), every operation fails.
//
// Thread-safety: RandomAccessFile::ReadAt is safe to call concurrently (pread). WritableFile
// is not thread-safe.
#ifndef FC_IO_FILE_H_
#define FC_IO_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fc/core/status.h"
#include "fc/io/env.h"

namespace fc {

class RandomAccessFile {
 public:
  // Errors: kNotFound when the file does not exist, kIoError otherwise (message names path).
  static Result<std::unique_ptr<RandomAccessFile>> Open(const std::string& path);
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // See EnvReadableFile::readable_here.
  bool readable_here() const;

  // Reads exactly dst.size() bytes at `offset`. Errors: kDataLoss when the range passes the
  // end of the file ("<path>: wanted bytes [a, b), file has N"), kIoError on read errors.
  Status ReadAt(uint64_t offset, std::span<std::byte> dst) const;
  Result<std::vector<std::byte>> ReadAt(uint64_t offset, uint64_t length) const;
  // Reads the contiguous file range starting at `offset` scattered into `buffers`, in order
  // (preadv: the kernel copies straight into place). Errors as ReadAt.
  Status ReadScatteredAt(uint64_t offset, std::span<const std::span<std::byte>> buffers) const;

 private:
  RandomAccessFile(std::string path, std::unique_ptr<EnvReadableFile> file);
  std::string path_;
  std::unique_ptr<EnvReadableFile> file_;
  uint64_t size_;
  bool counts_as_read_;  // file_->counts_as_read()
};

// A read-only memory map of a whole file, for parsers that need the bytes as one span but
// read only a small part of them (a pickle whose tensor payloads are located, not read):
// only the pages touched become resident. The file must not be truncated while mapped.
class MappedFile {
 public:
  // Errors: as RandomAccessFile::Open; kIoError when mmap fails. An empty file maps to an
  // empty span.
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {mapping_.data, mapping_.size}; }

 private:
  MappedFile(std::string path, EnvReadableFile::Mapping mapping)
      : path_(std::move(path)), mapping_(std::move(mapping)) {}
  std::string path_;
  EnvReadableFile::Mapping mapping_;
};

// Reads a whole file, refusing files larger than `max_bytes` (kDataLoss).
Result<std::vector<std::byte>> ReadWholeFile(const std::string& path, uint64_t max_bytes);

// Sequential writer. Create() truncates. Every error names the path.
class WritableFile {
 public:
  static Result<std::unique_ptr<WritableFile>> Create(const std::string& path);
  ~WritableFile();  // closes without sync if Close() was not called
  WritableFile(const WritableFile&) = delete;
  WritableFile& operator=(const WritableFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return written_; }
  Status Append(std::span<const std::byte> data);
  Status Append(std::string_view data);
  // Writes at an absolute position (for headers patched after the data); does not move the
  // append position.
  Status WriteAt(uint64_t offset, std::span<const std::byte> data);
  Status Sync();
  Status Close();
  // Advice for a file complete long before its Sync (EnvWritableFile::StartWriteBack).
  void StartWriteBack() {
    if (file_) file_->StartWriteBack();
  }
  // Allocates the disk space of the file's first `bytes` (its size unchanged), for a writer
  // that knows the file's final size and will write all of it (EnvWritableFile::Reserve):
  // call it right after Create. A disk without room fails here, before any data is written.
  Status Reserve(uint64_t bytes);

 private:
  WritableFile(std::string path, std::unique_ptr<EnvWritableFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  std::string path_;
  std::unique_ptr<EnvWritableFile> file_;
  uint64_t written_ = 0;
};

// Copies a small file whole (ReadWholeFile's limit and read policy), written to `to` and
// synced: the files staged beside an output (--copy-from, Megatron's common.pt).
// Errors: ReadWholeFile's (the source named), WritableFile's (the target named).
Status CopyWholeFile(const std::string& from, const std::string& to, uint64_t max_bytes);

bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
// Sorted names of the entries of `dir` (no "." or ".."). Errors: kNotFound / kIoError.
Result<std::vector<std::string>> ListDirectory(const std::string& dir);
// "a/b" joined the usual way ("a" + "/" + "b"; keeps absolute b as is).
std::string JoinPath(const std::string& a, const std::string& b);
std::string Basename(const std::string& path);
std::string Dirname(const std::string& path);

// `p` without trailing slashes ("/" stays "/").
std::string StripTrailingSlashes(std::string p);
// OK when `dir` does not exist or is an empty directory; kFailedPrecondition otherwise
// ("<dir>: output directory exists and is not empty").
Status CheckOutputFree(const std::string& dir);

// Creates `dir` and missing parents. Errors: kIoError.
Status CreateDirectories(const std::string& dir);
// Removes a file or a directory tree; missing paths are fine.
Status RemoveAll(const std::string& path);
// rename(2), then fsync of the destination's directory.
Status RenameDurably(const std::string& from, const std::string& to);
// fsync of a directory (after creating or renaming entries in it).
Status SyncDirectory(const std::string& dir);

}  // namespace fc

#endif  // FC_IO_FILE_H_
