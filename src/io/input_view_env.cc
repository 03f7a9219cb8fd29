#include "fc/io/input_view_env.h"

#include "fc/io/file.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace fc {
namespace {

std::string StripSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// `p` without repeated slashes, "." components and trailing slashes, so that the names
// readers build ("dir/" + "/" + name when the input ends in a slash, "dir/./name") match the
// entries ("" stays ""; ".." is kept: it is not resolved through symlinks here).
std::string Collapse(const std::string& p) {
  std::string out = !p.empty() && p[0] == '/' ? "/" : "";
  for (size_t at = 0; at <= p.size();) {
    size_t slash = p.find('/', at);
    if (slash == std::string::npos) slash = p.size();
    const std::string_view part(p.data() + at, slash - at);
    if (!part.empty() && part != ".") {
      if (!out.empty() && out.back() != '/') out += '/';
      out += part;
    }
    at = slash + 1;
  }
  if (out.empty() && !p.empty()) out = ".";
  return out;
}

// A file that this process does not read from a disk of its own (it lies on another
// process's disk, or reads go through the fetch function): its size is known, its bytes are
// those fetched for it.
class ViewFile final : public EnvReadableFile {
 public:
  ViewFile(InputViewEnv* view, std::string name, std::string path, uint64_t size,
           std::string seen_by, bool readable_here)
      : view_(view), name_(std::move(name)), path_(std::move(path)), size_(size),
        seen_by_(std::move(seen_by)), readable_here_(readable_here) {}
  uint64_t size() const override { return size_; }
  Result<size_t> Read(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset >= size_ || dst.empty()) return size_t{0};
    const size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), size_ - offset));
    FC_ASSIGN_OR_RETURN(bool here, view_->ReadFetched(name_, offset, dst.first(n)));
    if (!here) return Error(offset, n);
    return n;
  }
  Result<Mapping> Map() const override {
    auto bytes = std::make_shared<std::string>(size_, '\0');
    std::span<std::byte> all = std::as_writable_bytes(std::span(bytes->data(), bytes->size()));
    if (!all.empty()) {
      FC_ASSIGN_OR_RETURN(bool here, view_->ReadFetched(name_, 0, all));
      if (!here) return Error(0, size_);
    }
    Mapping m;
    m.data = reinterpret_cast<const std::byte*>(bytes->data());
    m.size = bytes->size();
    m.holder = std::move(bytes);
    return m;
  }
  bool readable_here() const override { return readable_here_; }
  // Fetched bytes were read (and counted) by the process that holds the file.
  bool counts_as_read() const override { return false; }

 private:
  Status Error(uint64_t offset, uint64_t length) const {
    return NotFoundError(path_ + ": bytes " + std::to_string(offset) + ".." +
                         std::to_string(offset + length) + " are not on this process's disk (only " +
                         seen_by_ + " can read it)");
  }
  InputViewEnv* view_;
  std::string name_;
  std::string path_;
  uint64_t size_;
  std::string seen_by_;
  bool readable_here_;
};

// Metadata bytes one process read (and counted) and broadcast: reading them here reads no
// disk.
class SharedBytesFile final : public EnvReadableFile {
 public:
  explicit SharedBytesFile(std::unique_ptr<EnvReadableFile> bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_->size(); }
  Result<size_t> Read(uint64_t offset, std::span<std::byte> dst) const override {
    return bytes_->Read(offset, dst);
  }
  Result<Mapping> Map() const override { return bytes_->Map(); }
  bool counts_as_read() const override { return false; }

 private:
  std::unique_ptr<EnvReadableFile> bytes_;
};

}  // namespace

InputViewEnv::InputViewEnv(Env* base, std::string logical_root, std::string local_root,
                           std::map<std::string, Entry> entries)
    : base_(base),
      logical_root_(Collapse(logical_root)),
      local_root_(StripSlashes(std::move(local_root))),
      entries_(std::move(entries)) {
  for (const auto& [name, e] : entries_) {
    for (size_t slash = name.find('/'); slash != std::string::npos; slash = name.find('/', slash + 1)) {
      directories_.insert(name.substr(0, slash));
    }
  }
}

bool InputViewEnv::IsRoot(const std::string& path) const {
  return (logical_root_ == "." ? StripSlashes(path) : Collapse(path)) == logical_root_;
}

std::string InputViewEnv::RelativeName(const std::string& path) const {
  // The working directory as the root (a single file given without a directory): only
  // names that start with "./" are below it, as before.
  const std::string p = logical_root_ == "." ? StripSlashes(path) : Collapse(path);
  if (p.size() <= logical_root_.size() + 1 || p.compare(0, logical_root_.size(), logical_root_) != 0 ||
      p[logical_root_.size()] != '/') {
    return "";
  }
  return p.substr(logical_root_.size() + 1);
}

std::string InputViewEnv::Local(const std::string& path) const {
  if (IsRoot(path)) return local_root_;
  const std::string name = RelativeName(path);
  return name.empty() ? path : local_root_ + "/" + name;
}

bool InputViewEnv::LocalFile(const std::string& path) {
  const std::string name = RelativeName(path);
  auto it = name.empty() ? entries_.end() : entries_.find(name);
  if (it != entries_.end()) return it->second.local;
  const EnvFileType type = base_->Type(Local(path), /*follow=*/true);
  return type == EnvFileType::kRegular;
}

void InputViewEnv::SetFetch(Fetch fetch) {
  std::lock_guard<std::mutex> lock(mu_);
  fetch_ = std::move(fetch);
}

bool InputViewEnv::Fetching() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<bool>(fetch_);
}

void InputViewEnv::AddFetched(const std::string& name, uint64_t offset,
                              std::shared_ptr<const std::string> bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& ranges = fetched_[name];
  auto [it, inserted] = ranges.emplace(offset, bytes);
  if (!inserted && it->second->size() < bytes->size()) it->second = std::move(bytes);
}

Result<std::unique_ptr<EnvReadableFile>> InputViewEnv::OpenLocal(const std::string& name) {
  return base_->OpenForRead(JoinPath(local_root_, name));
}

const InputViewEnv::Entry* InputViewEnv::Find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

bool InputViewEnv::HasUnsharedFiles() const {
  return std::any_of(entries_.begin(), entries_.end(), [](const auto& kv) {
    return !kv.second.on_every_process && !kv.second.bytes;
  });
}

bool InputViewEnv::CopyFetched(const std::string& name, uint64_t offset,
                               std::span<std::byte> dst) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto f = fetched_.find(name);
  if (f == fetched_.end()) return false;
  // Ranges are few per file (what opening reads); any one that covers the request serves it.
  for (auto it = f->second.upper_bound(offset); it != f->second.begin();) {
    --it;
    const uint64_t skip = offset - it->first;
    if (skip <= it->second->size() && dst.size() <= it->second->size() - skip) {
      if (!dst.empty()) std::memcpy(dst.data(), it->second->data() + skip, dst.size());
      return true;
    }
  }
  return false;
}

Result<bool> InputViewEnv::ReadFetched(const std::string& name, uint64_t offset,
                                       std::span<std::byte> dst) {
  if (CopyFetched(name, offset, dst)) return true;
  Fetch fetch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fetch = fetch_;
  }
  if (!fetch) {
    ++missed_reads_;
    return false;
  }
  FC_RETURN_IF_ERROR(fetch(name, offset, dst.size()));
  if (!CopyFetched(name, offset, dst)) {
    return InternalError(JoinPath(logical_root_, name) + ": fetched bytes " + std::to_string(offset) +
                         " +" + std::to_string(dst.size()) + " did not arrive");
  }
  return true;
}

Result<std::unique_ptr<EnvReadableFile>> InputViewEnv::OpenForRead(const std::string& path) {
  const std::string name = RelativeName(path);
  auto it = name.empty() ? entries_.end() : entries_.find(name);
  if (it == entries_.end()) return base_->OpenForRead(Local(path));
  const Entry& e = it->second;
  if (e.bytes) {
    return std::unique_ptr<EnvReadableFile>(new SharedBytesFile(NewMemoryReadableFile(
        std::as_bytes(std::span(e.bytes->data(), e.bytes->size())), e.bytes)));
  }
  if (e.local && (e.on_every_process || !Fetching())) return base_->OpenForRead(Local(path));
  return std::unique_ptr<EnvReadableFile>(
      new ViewFile(this, name, path, e.size, e.seen_by, /*readable_here=*/e.local));
}

Result<std::unique_ptr<EnvWritableFile>> InputViewEnv::CreateForWrite(const std::string& path) {
  return base_->CreateForWrite(path);
}

EnvFileType InputViewEnv::Type(const std::string& path, bool follow) {
  if (IsRoot(path)) {
    // A directory when some process has files there or this one has the directory;
    // missing otherwise, so that opening says "not found".
    if (!entries_.empty()) return EnvFileType::kDirectory;
    return base_->Type(local_root_, follow);
  }
  const std::string name = RelativeName(path);
  if (!name.empty() && entries_.count(name)) return EnvFileType::kRegular;
  if (!name.empty() && directories_.count(name)) return EnvFileType::kDirectory;
  return base_->Type(Local(path), follow);
}

Result<std::vector<std::string>> InputViewEnv::ListDirectory(const std::string& dir) {
  std::string prefix;
  if (!IsRoot(dir)) {
    const std::string name = RelativeName(dir);
    if (name.empty() || !directories_.count(name)) return base_->ListDirectory(Local(dir));
    prefix = name + "/";
  }
  std::set<std::string> names;
  for (auto it = entries_.lower_bound(prefix);
       it != entries_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    const std::string rest = it->first.substr(prefix.size());
    names.insert(rest.substr(0, rest.find('/')));
  }
  // What this process has there that the union does not describe.
  if (Result<std::vector<std::string>> local = base_->ListDirectory(Local(dir)); local.ok()) {
    names.insert(local->begin(), local->end());
  }
  return std::vector<std::string>(names.begin(), names.end());
}

Status InputViewEnv::CreateDirectory(const std::string& dir) { return base_->CreateDirectory(dir); }
Status InputViewEnv::Rename(const std::string& from, const std::string& to) {
  return base_->Rename(from, to);
}
Status InputViewEnv::Exchange(const std::string& a, const std::string& b) {
  return base_->Exchange(a, b);
}
Status InputViewEnv::SyncDirectory(const std::string& dir) { return base_->SyncDirectory(dir); }
Status InputViewEnv::RemoveAll(const std::string& path) { return base_->RemoveAll(path); }
Result<std::unique_ptr<EnvFileLock>> InputViewEnv::LockFile(const std::string& path,
                                                            std::string* holder) {
  return base_->LockFile(path, holder);
}

}  // namespace fc
