#include "fc/io/input_view_env.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace fc {
namespace {

std::string StripSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// A file on another process's disk: its size is known, its bytes are not here.
class ElsewhereFile final : public EnvReadableFile {
 public:
  ElsewhereFile(std::string path, uint64_t size, std::string seen_by)
      : path_(std::move(path)), size_(size), seen_by_(std::move(seen_by)) {}
  uint64_t size() const override { return size_; }
  Result<size_t> Read(uint64_t, std::span<std::byte>) const override { return Error(); }
  Result<Mapping> Map() const override { return Error(); }
  bool readable_here() const override { return false; }

 private:
  Status Error() const {
    return NotFoundError(path_ + ": not on this process's disk (only " + seen_by_ +
                         " can read it)");
  }
  std::string path_;
  uint64_t size_;
  std::string seen_by_;
};

}  // namespace

InputViewEnv::InputViewEnv(Env* base, std::string logical_root, std::string local_root,
                           std::map<std::string, Entry> entries)
    : base_(base),
      logical_root_(StripSlashes(std::move(logical_root))),
      local_root_(StripSlashes(std::move(local_root))),
      entries_(std::move(entries)) {}

bool InputViewEnv::IsRoot(const std::string& path) const {
  return StripSlashes(path) == logical_root_;
}

std::string InputViewEnv::EntryName(const std::string& path) const {
  const std::string p = StripSlashes(path);
  if (p.size() <= logical_root_.size() + 1 || p.compare(0, logical_root_.size(), logical_root_) != 0 ||
      p[logical_root_.size()] != '/') {
    return "";
  }
  std::string name = p.substr(logical_root_.size() + 1);
  return name.find('/') == std::string::npos ? name : "";
}

std::string InputViewEnv::Local(const std::string& path) const {
  const std::string p = StripSlashes(path);
  if (p == logical_root_) return local_root_;
  if (p.size() > logical_root_.size() && p.compare(0, logical_root_.size(), logical_root_) == 0 &&
      p[logical_root_.size()] == '/') {
    return local_root_ + p.substr(logical_root_.size());
  }
  return path;
}

bool InputViewEnv::LocalFile(const std::string& path) {
  const std::string name = EntryName(path);
  auto it = name.empty() ? entries_.end() : entries_.find(name);
  if (it != entries_.end()) return it->second.local;
  const EnvFileType type = base_->Type(Local(path), /*follow=*/true);
  return type == EnvFileType::kRegular;
}

Result<std::unique_ptr<EnvReadableFile>> InputViewEnv::OpenForRead(const std::string& path) {
  const std::string name = EntryName(path);
  auto it = name.empty() ? entries_.end() : entries_.find(name);
  if (it == entries_.end()) return base_->OpenForRead(Local(path));
  const Entry& e = it->second;
  if (e.bytes) {
    return NewMemoryReadableFile(std::as_bytes(std::span(e.bytes->data(), e.bytes->size())),
                                 e.bytes);
  }
  if (e.local) return base_->OpenForRead(Local(path));
  return std::unique_ptr<EnvReadableFile>(new ElsewhereFile(path, e.size, e.seen_by));
}

Result<std::unique_ptr<EnvWritableFile>> InputViewEnv::CreateForWrite(const std::string& path) {
  return base_->CreateForWrite(path);
}

EnvFileType InputViewEnv::Type(const std::string& path, bool follow) {
  if (IsRoot(path)) {
    // A directory when some process has files there or this one has the directory (its
    // subdirectories are its own); missing otherwise, so that opening says "not found".
    if (!entries_.empty()) return EnvFileType::kDirectory;
    return base_->Type(local_root_, follow);
  }
  const std::string name = EntryName(path);
  if (!name.empty() && entries_.count(name)) return EnvFileType::kRegular;
  return base_->Type(Local(path), follow);
}

Result<std::vector<std::string>> InputViewEnv::ListDirectory(const std::string& dir) {
  if (!IsRoot(dir)) return base_->ListDirectory(Local(dir));
  std::set<std::string> names;
  for (const auto& [name, e] : entries_) names.insert(name);
  // This process's subdirectories (and anything else the union does not describe).
  if (Result<std::vector<std::string>> local = base_->ListDirectory(local_root_); local.ok()) {
    names.insert(local->begin(), local->end());
  }
  return std::vector<std::string>(names.begin(), names.end());
}

Status InputViewEnv::CreateDirectory(const std::string& dir) { return base_->CreateDirectory(dir); }
Status InputViewEnv::Rename(const std::string& from, const std::string& to) {
  return base_->Rename(from, to);
}
Status InputViewEnv::SyncDirectory(const std::string& dir) { return base_->SyncDirectory(dir); }
Status InputViewEnv::RemoveAll(const std::string& path) { return base_->RemoveAll(path); }
Result<std::unique_ptr<EnvFileLock>> InputViewEnv::LockFile(const std::string& path,
                                                            std::string* holder) {
  return base_->LockFile(path, holder);
}

}  // namespace fc
