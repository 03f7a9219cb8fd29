#include "fc/io/file.h"
#include "fc/io/counters.h"

#include <algorithm>
#include <climits>
#include <cstring>

namespace fc {
namespace {

std::string RangeText(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// After a signal asked the run to stop, no new file operation starts: the run unwinds
// through its error paths (which remove staging) instead of finishing.
Status CheckCancel(const std::string& what) {
  if (const int sig = CancelSignal(); sig != 0) {
    return IoError(what + ": interrupted (signal " + std::to_string(sig) + ")");
  }
  return Status::Ok();
}

}  // namespace

RandomAccessFile::RandomAccessFile(std::string path, std::unique_ptr<EnvReadableFile> file)
    : path_(std::move(path)),
      file_(std::move(file)),
      size_(file_->size()),
      counts_as_read_(file_->counts_as_read()) {}

bool RandomAccessFile::readable_here() const { return file_->readable_here(); }

Result<std::unique_ptr<RandomAccessFile>> RandomAccessFile::Open(const std::string& path) {
  FC_RETURN_IF_ERROR(CheckCancel("opening " + path));
  FC_ASSIGN_OR_RETURN(auto f, DefaultEnv()->OpenForRead(path));
  return std::unique_ptr<RandomAccessFile>(new RandomAccessFile(path, std::move(f)));
}

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  FC_RETURN_IF_ERROR(CheckCancel("opening " + path));
  // One open file for the size and the mapping, so they describe the same file.
  FC_ASSIGN_OR_RETURN(auto f, DefaultEnv()->OpenForRead(path));
  FC_ASSIGN_OR_RETURN(EnvReadableFile::Mapping m, f->Map());
  return std::unique_ptr<MappedFile>(new MappedFile(path, std::move(m)));
}

Status RandomAccessFile::ReadAt(uint64_t offset, std::span<std::byte> dst) const {
  uint64_t end;
  if (__builtin_add_overflow(offset, dst.size(), &end) || end > size_) {
    return DataLossError(path_ + ": wanted bytes " + RangeText(offset, offset + dst.size()) +
                         ", file has " + std::to_string(size_));
  }
  size_t done = 0;
  while (done < dst.size()) {
    FC_RETURN_IF_ERROR(CheckCancel("reading " + path_));
    FC_ASSIGN_OR_RETURN(size_t n, file_->Read(offset + done, dst.subspan(done)));
    if (n == 0) {
      return DataLossError(path_ + ": file shrank while reading at " +
                           std::to_string(offset + done));
    }
    if (counts_as_read_) CountRead(n);
    done += n;
  }
  return Status::Ok();
}

Status RandomAccessFile::ReadScatteredAt(uint64_t offset,
                                         std::span<const std::span<std::byte>> buffers) const {
  uint64_t total = 0;
  for (const auto& b : buffers) total += b.size();
  uint64_t end;
  if (__builtin_add_overflow(offset, total, &end) || end > size_) {
    return DataLossError(path_ + ": wanted bytes " + RangeText(offset, offset + total) +
                         ", file has " + std::to_string(size_));
  }
  std::vector<std::span<std::byte>> rest;  // what is still to read, in order
  for (const auto& b : buffers) {
    if (!b.empty()) rest.push_back(b);
  }
  size_t next = 0;
  uint64_t position = offset;
  while (next < rest.size()) {
    FC_RETURN_IF_ERROR(CheckCancel("reading " + path_));
    FC_ASSIGN_OR_RETURN(size_t n, file_->ReadScattered(
                                      position, std::span<const std::span<std::byte>>(rest).subspan(next)));
    if (n == 0) {
      return DataLossError(path_ + ": file shrank while reading at " + std::to_string(position));
    }
    if (counts_as_read_) CountRead(n);
    position += n;
    while (n > 0) {  // n never exceeds what was asked
      if (n >= rest[next].size()) {
        n -= rest[next].size();
        ++next;
      } else {
        rest[next] = rest[next].subspan(n);
        n = 0;
      }
    }
  }
  return Status::Ok();
}

Result<std::vector<std::byte>> RandomAccessFile::ReadAt(uint64_t offset, uint64_t length) const {
  uint64_t end;
  if (__builtin_add_overflow(offset, length, &end) || end > size_) {
    return DataLossError(path_ + ": wanted bytes " + RangeText(offset, offset + length) +
                         ", file has " + std::to_string(size_));
  }
  std::vector<std::byte> out(length);
  FC_RETURN_IF_ERROR(ReadAt(offset, std::span<std::byte>(out)));
  return out;
}

Result<std::vector<std::byte>> ReadWholeFile(const std::string& path, uint64_t max_bytes) {
  FC_ASSIGN_OR_RETURN(auto file, RandomAccessFile::Open(path));
  if (file->size() > max_bytes) {
    return DataLossError(path + ": " + std::to_string(file->size()) +
                         " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  return file->ReadAt(0, file->size());
}

Status CopyWholeFile(const std::string& from, const std::string& to, uint64_t max_bytes) {
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(from, max_bytes));
  FC_ASSIGN_OR_RETURN(auto out, WritableFile::Create(to));
  FC_RETURN_IF_ERROR(out->Append(std::span<const std::byte>(bytes)));
  FC_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

Result<std::unique_ptr<WritableFile>> WritableFile::Create(const std::string& path) {
  FC_RETURN_IF_ERROR(CheckCancel("creating " + path));
  FC_ASSIGN_OR_RETURN(auto f, DefaultEnv()->CreateForWrite(path));
  return std::unique_ptr<WritableFile>(new WritableFile(path, std::move(f)));
}

WritableFile::~WritableFile() {
  if (file_) (void)file_->Close();
}

Status WritableFile::Append(std::span<const std::byte> data) {
  FC_RETURN_IF_ERROR(WriteAt(written_, data));
  written_ += data.size();
  return Status::Ok();
}

Status WritableFile::Append(std::string_view data) {
  return Append(std::as_bytes(std::span<const char>(data.data(), data.size())));
}

Status WritableFile::WriteAt(uint64_t offset, std::span<const std::byte> data) {
  if (!file_) return InternalError(path_ + ": write after close");
  FC_RETURN_IF_ERROR(CheckCancel("writing " + path_));
  FC_RETURN_IF_ERROR(file_->WriteAt(offset, data));
  CountWrite(data.size());
  return Status::Ok();
}

Status WritableFile::Reserve(uint64_t bytes) {
  if (!file_) return InternalError(path_ + ": reserve after close");
  FC_RETURN_IF_ERROR(CheckCancel("reserving space for " + path_));
  return file_->Reserve(bytes);
}

Status WritableFile::Sync() {
  if (!file_) return InternalError(path_ + ": sync after close");
  FC_RETURN_IF_ERROR(CheckCancel("syncing " + path_));
  return file_->Sync();
}

Status WritableFile::Close() {
  if (!file_) return Status::Ok();
  Status s = file_->Close();
  file_.reset();
  return s;
}

bool PathExists(const std::string& path) {
  return DefaultEnv()->Type(path, /*follow=*/true) != EnvFileType::kMissing;
}

bool IsDirectory(const std::string& path) {
  return DefaultEnv()->Type(path, /*follow=*/true) == EnvFileType::kDirectory;
}

Result<std::vector<std::string>> ListDirectory(const std::string& dir) {
  FC_RETURN_IF_ERROR(CheckCancel("listing " + dir));
  return DefaultEnv()->ListDirectory(dir);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty() || (!b.empty() && b[0] == '/')) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

std::string Basename(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string Dirname(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string StripTrailingSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

Status CheckOutputFree(const std::string& dir) {
  if (!PathExists(dir)) return Status::Ok();
  if (!IsDirectory(dir)) {
    return FailedPreconditionError(dir + ": output exists and is not a directory");
  }
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  if (!names.empty()) {
    return FailedPreconditionError(dir + ": output directory exists and is not empty");
  }
  return Status::Ok();
}

Status CreateDirectories(const std::string& dir) {
  FC_RETURN_IF_ERROR(CheckCancel("creating directory " + dir));
  const std::string d = StripTrailingSlashes(dir);
  if (d.empty() || IsDirectory(d)) return Status::Ok();
  const std::string parent = Dirname(d);
  if (parent != d) FC_RETURN_IF_ERROR(CreateDirectories(parent));
  Status s = DefaultEnv()->CreateDirectory(d);
  if (!s.ok() && IsDirectory(d)) return Status::Ok();  // made concurrently
  if (!s.ok() && s.code() == StatusCode::kFailedPrecondition) {
    return IoError("creating directory " + dir + ": a file is in the way");
  }
  return s;
}

Status RemoveAll(const std::string& path) { return DefaultEnv()->RemoveAll(path); }

Status SyncDirectory(const std::string& dir) {
  FC_RETURN_IF_ERROR(CheckCancel("syncing directory " + dir));
  return DefaultEnv()->SyncDirectory(dir);
}

Status RenameDurably(const std::string& from, const std::string& to) {
  FC_RETURN_IF_ERROR(CheckCancel("renaming " + from));
  FC_RETURN_IF_ERROR(DefaultEnv()->Rename(from, to));
  return SyncDirectory(Dirname(to));
}

}  // namespace fc
