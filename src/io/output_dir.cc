// Why the lock file sits next to OUT and not inside it: the commit renames the staging
// directory onto OUT, which rename(2) allows only while OUT is absent or empty; a lock
// file inside OUT would make it non-empty.
#include "fc/io/output_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "fc/io/env.h"
#include "fc/io/file.h"

namespace fc {
namespace {

constexpr const char kStagingInfix[] = ".fc-tmp-";
constexpr const char kLockSuffix[] = ".fc-lock";

bool IsWithin(const std::string& path, const std::string& dir) {
  if (dir == "/") return path != "/";
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

// realpath of `path`, or of its nearest existing ancestor with the rest appended.
std::string ResolveLoosely(const std::string& path) {
  std::string existing = StripTrailingSlashes(path);
  std::string rest;
  char buf[PATH_MAX];
  for (int i = 0; i < 256; ++i) {
    if (::realpath(existing.c_str(), buf) != nullptr) {
      std::string r = buf;
      return rest.empty() ? r : JoinPath(r, rest);
    }
    const std::string parent = Dirname(existing);
    const std::string base = Basename(existing);
    rest = rest.empty() ? base : JoinPath(base, rest);
    if (parent == existing) break;
    existing = parent;
  }
  return path;
}

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return true;  // not ours to judge
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A zombie (killed, not yet reaped: e.g. a rank mpirun killed a moment ago) is gone too.
  // Linux: the state is the field after the ")" that ends the command name in /proc/PID/stat.
  if (FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r")) {
    char buf[512];
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    if (const char* close = std::strrchr(buf, ')'); close != nullptr && close[1] == ' ') {
      return close[2] != 'Z' && close[2] != 'X';
    }
  }
  return true;
}

// "<out>.fc-tmp-<pid>-XXXXXX", created (defined below CreateStagingDir).
Result<std::string> CreateStagingDirNextTo(const std::string& out);

// OUT paths that an OutputDir of this process opened with ExistingOutput::kReplace: the
// commit (which writers may call themselves, knowing only OUT) replaces those.
std::mutex replaceable_mu;
std::set<std::string>& Replaceable() {
  static std::set<std::string> outs;
  return outs;
}
bool IsReplaceable(const std::string& out) {
  std::lock_guard<std::mutex> lock(replaceable_mu);
  return Replaceable().count(out) > 0;
}

bool IsNonEmptyDirectory(const std::string& dir) {
  if (!IsDirectory(dir)) return false;
  auto names = ListDirectory(dir);
  return names.ok() && !names->empty();
}

// Puts the committed staging directory in OUT's place and removes the old output (the
// protocol in the header).
Status ReplaceOutput(const std::string& staging, const std::string& out) {
  Status swapped = DefaultEnv()->Exchange(staging, out);
  if (swapped.code() == StatusCode::kUnimplemented) {
    const std::string old = out + ".fc-old-" + std::to_string(::getpid());
    FC_RETURN_IF_ERROR(RemoveAll(old));  // this process's own leftover, if any
    FC_RETURN_IF_ERROR(DefaultEnv()->Rename(out, old));
    if (Status moved = DefaultEnv()->Rename(staging, out); !moved.ok()) {
      if (Status back = DefaultEnv()->Rename(old, out); !back.ok()) {
        return moved.With("the old output is at " + old + " (" + back.message() + ")");
      }
      return moved;
    }
    Status synced = SyncDirectory(Dirname(out));
    if (!synced.ok()) {
      // Not known durable: put both back, as CommitStagingDir does.
      if (Status back = DefaultEnv()->Rename(out, staging); !back.ok()) {
        spdlog::warn("{}", back.message());
      } else if (Status back2 = DefaultEnv()->Rename(old, out); !back2.ok()) {
        spdlog::warn("{}", back2.message());
      }
      return synced;
    }
    if (Status removed = RemoveAll(old); !removed.ok()) {
      spdlog::warn("replaced {}; the old output is left at {}: {}", out, old, removed.message());
    }
    return Status::Ok();
  }
  FC_RETURN_IF_ERROR(swapped);
  Status synced = SyncDirectory(Dirname(out));
  if (!synced.ok()) {
    if (Status back = DefaultEnv()->Exchange(staging, out); !back.ok()) {
      spdlog::warn("{}", back.message());
    }
    return synced;
  }
  // The staging path now holds the old output.
  if (Status removed = RemoveAll(staging); !removed.ok()) {
    spdlog::warn("replaced {}; the old output is left at {}: {}", out, staging,
                 removed.message());
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> CreateStagingDir(const std::string& out_dir) {
  const std::string out = StripTrailingSlashes(out_dir);
  FC_RETURN_IF_ERROR(CheckOutputFree(out));
  return CreateStagingDirNextTo(out);
}

namespace {

Result<std::string> CreateStagingDirNextTo(const std::string& out) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd());
  const std::string prefix = out + kStagingInfix + std::to_string(::getpid()) + "-";
  // Not mkdtemp(3): it creates mode 0700, and the renamed output would keep that.
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string path = prefix;
    for (int i = 0; i < 6; ++i) path += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
    Status made = DefaultEnv()->CreateDirectory(path);
    if (made.ok()) return path;
    if (made.code() != StatusCode::kFailedPrecondition) {
      return made.With("creating staging directory next to " + out);
    }
  }
  return IoError("creating a staging directory next to " + out + ": all names taken");
}

// Every directory of the staging tree, children before their parent: the writers sync their
// files, but a file's name lives in its directory, and an output with subdirectories (a
// Universal Checkpoint's zero/<param>/, a DeepSpeed save's global_step<N>/) would
// otherwise depend on the file system's journal to keep, after a power loss, the names of
// files whose data it synced. Symlinks are not followed (fc writes none); the walk stops
// at kMaxStagingDepth levels.
constexpr int kMaxStagingDepth = 32;

Status SyncStagingTree(const std::string& staging) {
  struct Pending {
    std::string dir;
    int depth;
    bool children_done;
  };
  std::vector<Pending> stack = {{staging, 0, false}};
  while (!stack.empty()) {
    Pending& top = stack.back();
    if (top.children_done) {
      FC_RETURN_IF_ERROR(SyncDirectory(top.dir));
      stack.pop_back();
      continue;
    }
    top.children_done = true;
    const std::string dir = top.dir;
    const int depth = top.depth;
    FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
    for (const std::string& name : names) {
      const std::string path = JoinPath(dir, name);
      if (DefaultEnv()->Type(path, /*follow=*/false) != EnvFileType::kDirectory) continue;
      if (depth + 1 > kMaxStagingDepth) {
        return InternalError(path + ": staging directories nested deeper than " +
                             std::to_string(kMaxStagingDepth) + " levels");
      }
      stack.push_back({path, depth + 1, false});  // `top` may move: not used below
    }
  }
  return Status::Ok();
}

}  // namespace

Status CommitStagingDir(const std::string& staging, const std::string& out_dir) {
  const std::string out = StripTrailingSlashes(out_dir);
  FC_RETURN_IF_ERROR(SyncStagingTree(staging));
  if (IsReplaceable(out) && IsNonEmptyDirectory(out)) return ReplaceOutput(staging, out);
  // Re-check just before the rename: rename(2) silently replaces an empty directory but
  // fails with a bare ENOTEMPTY on a full one; say why.
  FC_RETURN_IF_ERROR(CheckOutputFree(out));
  FC_RETURN_IF_ERROR(DefaultEnv()->Rename(staging, out));
  Status synced = SyncDirectory(Dirname(out));
  if (!synced.ok()) {
    // The rename is not known to be durable, and the caller will report a failure: put
    // the directory back, so that a failed run never leaves an OUT that looks complete.
    if (Status back = DefaultEnv()->Rename(out, staging); !back.ok()) {
      spdlog::warn("{}", back.message());
    }
  }
  return synced;
}

Result<int> SweepDeadStaging(const std::string& out_dir) {
  const std::string out = StripTrailingSlashes(out_dir);
  const std::string parent = Dirname(out);
  const std::string prefix = Basename(out) + kStagingInfix;
  auto names = ListDirectory(parent);
  if (!names.ok()) {
    if (names.status().code() == StatusCode::kNotFound) return 0;
    return names.status();
  }
  int swept = 0;
  for (const std::string& name : *names) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    // "<pid>-XXXXXX"
    const std::string rest = name.substr(prefix.size());
    const size_t dash = rest.find('-');
    if (dash == std::string::npos || dash == 0 || dash > 9) continue;
    pid_t pid = 0;
    bool digits = true;
    for (size_t i = 0; i < dash; ++i) {
      if (rest[i] < '0' || rest[i] > '9') digits = false;
      else pid = pid * 10 + (rest[i] - '0');
    }
    if (!digits || ProcessAlive(pid)) continue;
    const std::string path = JoinPath(parent, name);
    spdlog::info("removing {} (staging of process {}, which is gone)", path, pid);
    FC_RETURN_IF_ERROR(RemoveAll(path));
    ++swept;
  }
  return swept;
}

Status CheckOutputNotNested(const std::string& out, const std::string& input) {
  const std::string in = ResolveLoosely(input);
  const std::string o = ResolveLoosely(out);
  if (o == in) {
    return InvalidArgumentError(out + ": output is the input " + input +
                                "; choose an output directory outside the input");
  }
  if (IsDirectory(input) && IsWithin(o, in)) {
    return InvalidArgumentError(out + ": output is inside the input directory " + input +
                                "; choose an output directory outside the input");
  }
  if (IsWithin(in, o)) {
    return InvalidArgumentError(out + ": output directory contains the input " + input +
                                "; choose an output directory outside the input");
  }
  return Status::Ok();
}

Result<std::unique_ptr<OutputDir>> OutputDir::Open(const std::string& out_dir,
                                                   const std::string& input,
                                                   ExistingOutput existing) {
  const std::string out = StripTrailingSlashes(out_dir);
  if (out.empty()) return InvalidArgumentError("empty output directory name");
  if (!input.empty()) FC_RETURN_IF_ERROR(CheckOutputNotNested(out, input));
  auto d = std::unique_ptr<OutputDir>(new OutputDir());
  d->out_ = out;
  const std::string lock_path = out + kLockSuffix;
  std::string holder;
  auto lock = DefaultEnv()->LockFile(lock_path, &holder);
  if (!lock.ok() && lock.status().code() == StatusCode::kFailedPrecondition) {
    return FailedPreconditionError(out + ": output in use by PID " + holder + " (lock " +
                                   lock_path + ")");
  }
  if (!lock.ok()) return lock.status();
  d->lock_ = std::move(*lock);
  if (existing == ExistingOutput::kReplace && PathExists(out)) {
    if (DefaultEnv()->Type(out, /*follow=*/false) != EnvFileType::kDirectory) {
      return FailedPreconditionError(out + ": output exists and is not a directory; "
                                     "--overwrite replaces a directory only");
    }
  } else {
    FC_RETURN_IF_ERROR(CheckOutputFree(out));
  }
  FC_RETURN_IF_ERROR(SweepDeadStaging(out).status());
  if (existing == ExistingOutput::kReplace) {
    std::lock_guard<std::mutex> guard(replaceable_mu);
    if (!Replaceable().insert(out).second) {
      return FailedPreconditionError(out + ": already claimed by this process");
    }
    d->replace_ = true;
  }
  // CreateStagingDir refuses a non-empty OUT; the staging name does not depend on it.
  FC_ASSIGN_OR_RETURN(d->staging_, CreateStagingDirNextTo(out));
  return d;
}

OutputDir::~OutputDir() {
  if (!committed_ && !staging_.empty()) {
    if (Status s = RemoveAll(staging_); !s.ok()) spdlog::warn("{}", s.message());
  }
  if (replace_) {
    std::lock_guard<std::mutex> guard(replaceable_mu);
    Replaceable().erase(out_);
  }
  lock_.reset();  // removes the lock file, then releases the lock
}

Status OutputDir::Commit() {
  FC_RETURN_IF_ERROR(CommitStagingDir(staging_, out_));
  committed_ = true;
  return Status::Ok();
}

}  // namespace fc
