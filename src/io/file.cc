#include "fc/io/file.h"
#include "fc/io/counters.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace fc {
namespace {

std::string RangeText(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// A descriptor open for reading on a regular file (not a directory), and its size then.
struct OpenedFile {
  int fd;
  uint64_t size;
};

Result<OpenedFile> OpenRegularFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return NotFoundError(path + ": no such file");
    return ErrnoError("opening " + path, e);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return ErrnoError("stat " + path, e);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + ": is a directory, expected a file");
  }
  return OpenedFile{fd, static_cast<uint64_t>(st.st_size)};
}

}  // namespace

Result<std::unique_ptr<RandomAccessFile>> RandomAccessFile::Open(const std::string& path) {
  FC_ASSIGN_OR_RETURN(OpenedFile f, OpenRegularFile(path));
  return std::unique_ptr<RandomAccessFile>(new RandomAccessFile(path, f.fd, f.size));
}

RandomAccessFile::~RandomAccessFile() { ::close(fd_); }

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  // One descriptor for the size and the mapping, so they describe the same file.
  FC_ASSIGN_OR_RETURN(OpenedFile f, OpenRegularFile(path));
  const int fd = f.fd;
  const uint64_t size = f.size;
  if (size == 0) {
    ::close(fd);
    return std::unique_ptr<MappedFile>(new MappedFile(path, nullptr, 0));
  }
  if (size > SIZE_MAX) {
    ::close(fd);
    return ResourceExhaustedError(path + ": too large to map");
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) return ErrnoError("mapping " + path, e);
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const std::byte*>(p), static_cast<size_t>(size)));
}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(const_cast<std::byte*>(data_), size_);
}

Status RandomAccessFile::ReadAt(uint64_t offset, std::span<std::byte> dst) const {
  uint64_t end;
  if (__builtin_add_overflow(offset, dst.size(), &end) || end > size_) {
    return DataLossError(path_ + ": wanted bytes " + RangeText(offset, offset + dst.size()) +
                         ", file has " + std::to_string(size_));
  }
  size_t done = 0;
  while (done < dst.size()) {
    ssize_t n = ::pread(fd_, dst.data() + done, dst.size() - done,
                        static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("reading " + path_ + " at " + std::to_string(offset + done), errno);
    }
    if (n == 0) {
      return DataLossError(path_ + ": file shrank while reading at " +
                           std::to_string(offset + done));
    }
    CountRead(static_cast<uint64_t>(n));
    done += static_cast<size_t>(n);
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
  std::vector<struct iovec> iov;
  size_t next = 0;         // first buffer not yet fully read
  size_t done_in_next = 0; // bytes of buffers[next] already read
  uint64_t position = offset;
  while (next < buffers.size()) {
    iov.clear();
    for (size_t i = next; i < buffers.size() && iov.size() < static_cast<size_t>(IOV_MAX); ++i) {
      const size_t skip = i == next ? done_in_next : 0;
      iov.push_back({buffers[i].data() + skip, buffers[i].size() - skip});
    }
    ssize_t n = ::preadv(fd_, iov.data(), static_cast<int>(iov.size()), static_cast<off_t>(position));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("reading " + path_ + " at " + std::to_string(position), errno);
    }
    if (n == 0) return DataLossError(path_ + ": file shrank while reading at " + std::to_string(position));
    CountRead(static_cast<uint64_t>(n));
    position += static_cast<uint64_t>(n);
    size_t left = static_cast<size_t>(n);
    while (left > 0 && next < buffers.size()) {
      const size_t room = buffers[next].size() - done_in_next;
      if (left >= room) {
        left -= room;
        ++next;
        done_in_next = 0;
      } else {
        done_in_next += left;
        left = 0;
      }
    }
    while (next < buffers.size() && buffers[next].size() == 0) ++next;
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

Result<std::unique_ptr<WritableFile>> WritableFile::Create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("creating " + path, errno);
  return std::unique_ptr<WritableFile>(new WritableFile(path, fd));
}

WritableFile::~WritableFile() {
  if (fd_ >= 0) ::close(fd_);
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
  if (fd_ < 0) return InternalError(path_ + ": write after close");
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done,
                         static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("writing " + path_, errno);
    }
    if (n == 0) return IoError("writing " + path_ + ": no progress (disk full?)");
    CountWrite(static_cast<uint64_t>(n));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status WritableFile::Sync() {
  if (fd_ < 0) return InternalError(path_ + ": sync after close");
  if (::fdatasync(fd_) != 0) return ErrnoError("syncing " + path_, errno);
  return Status::Ok();
}

Status WritableFile::Close() {
  if (fd_ < 0) return Status::Ok();
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return ErrnoError("closing " + path_, errno);
  return Status::Ok();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Result<std::vector<std::string>> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    int e = errno;
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
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("creating directory " + dir + ": " + ec.message());
  return Status::Ok();
}

Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return IoError("removing " + path + ": " + ec.message());
  return Status::Ok();
}

Status SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening directory " + dir, errno);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("syncing directory " + dir, e);
  return Status::Ok();
}

Status RenameDurably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoError("renaming " + from + " to " + to, errno);
  }
  return SyncDirectory(Dirname(to));
}

}  // namespace fc
