#include "src/ops/shared_input.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "fc/core/human_bytes.h"
#include "fc/exec/parallel.h"
#include "fc/format/open.h"
#include "fc/io/counters.h"
#include "fc/io/file.h"

namespace fc {
namespace {

// Metadata files (small, needed by every process to open the checkpoint) are broadcast;
// data files stay where they are.
bool IsMetadataName(const std::string& name) {
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".metadata") || ends_with(".json") || name == "latest" ||
         name == "latest_universal" || name == "latest_checkpointed_iteration.txt";
}
constexpr uint64_t kMaxSharedMetadata = uint64_t{4} << 30;

// A tiny length-prefixed encoding for listings sent between processes.
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutString(std::string& out, const std::string& s) {
  PutU64(out, s.size());
  out += s;
}
class Cursor {
 public:
  explicit Cursor(const std::string& s) : s_(s) {}
  bool U64(uint64_t& v) {
    if (s_.size() - at_ < 8) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) {
      v |= static_cast<uint64_t>(static_cast<unsigned char>(s_[at_ + static_cast<size_t>(i)])) << (8 * i);
    }
    at_ += 8;
    return true;
  }
  bool String(std::string& v) {
    uint64_t n = 0;
    if (!U64(n) || n > s_.size() - at_) return false;
    v = s_.substr(at_, n);
    at_ += n;
    return true;
  }
  bool done() const { return at_ == s_.size(); }

 private:
  const std::string& s_;
  size_t at_ = 0;
};

struct Listed {
  uint64_t size = 0;
  std::vector<int> ranks;
};

std::string Processes(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "process " : "processes ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Subdirectories below the input that are listed (DeepSpeed tag dirs, Megatron iter and
// rank dirs, UCP zero/<param>/), and at most how many files: the listing is sent to every
// process.
constexpr int kMaxListDepth = 4;
constexpr size_t kMaxListedFiles = size_t{1} << 20;

void ListInto(Env* env, const std::string& dir, const std::string& prefix, int depth,
              std::vector<std::pair<std::string, uint64_t>>& files, Status& status) {
  Result<std::vector<std::string>> names = env->ListDirectory(dir);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    if (!status.ok()) return;
    const std::string path = JoinPath(dir, name);
    const EnvFileType type = env->Type(path, /*follow=*/false);
    if (type == EnvFileType::kDirectory) {
      // Symlinked directories are not followed (Type without follow says kSymlink).
      if (depth < kMaxListDepth) ListInto(env, path, prefix + name + "/", depth + 1, files, status);
      continue;
    }
    if (type != EnvFileType::kRegular && type != EnvFileType::kSymlink) continue;
    // Opening applies the read policy (no FIFOs, no symlinks out of the directory).
    if (Result<std::unique_ptr<EnvReadableFile>> f = env->OpenForRead(path); f.ok()) {
      if (files.size() == kMaxListedFiles) {
        status = ResourceExhaustedError(dir + ": more than " + std::to_string(kMaxListedFiles) +
                                        " files under the input");
        return;
      }
      files.emplace_back(prefix + name, (*f)->size());
    }
  }
}

// This process's regular files in `dir` and its subdirectories (kMaxListDepth levels), by
// relative path (nothing when it does not exist here).
Result<std::string> ListLocal(Env* env, const std::string& dir) {
  std::string out;
  std::vector<std::pair<std::string, uint64_t>> files;
  Status status = Status::Ok();
  if (env->Type(dir, /*follow=*/true) == EnvFileType::kDirectory) {
    ListInto(env, dir, "", 0, files, status);
  }
  FC_RETURN_IF_ERROR(status);
  PutU64(out, files.size());
  for (const auto& [name, size] : files) {
    PutString(out, name);
    PutU64(out, size);
  }
  return out;
}

// Process 0: the union of every listing, or the first conflict.
Result<std::map<std::string, Listed>> MergeListings(const std::vector<std::string>& listings,
                                                    const std::string& input) {
  std::map<std::string, Listed> all;
  for (size_t r = 0; r < listings.size(); ++r) {
    Cursor c(listings[r]);
    uint64_t n = 0;
    if (!c.U64(n)) return InternalError("file listing of process " + std::to_string(r));
    for (uint64_t i = 0; i < n; ++i) {
      std::string name;
      uint64_t size = 0;
      if (!c.String(name) || !c.U64(size)) {
        return InternalError("file listing of process " + std::to_string(r));
      }
      Listed& l = all[name];
      if (!l.ranks.empty() && l.size != size) {
        return FailedPreconditionError(
            JoinPath(input, name) + " differs between processes: " + std::to_string(l.size) +
            " bytes on process " + std::to_string(l.ranks.front()) + ", " + std::to_string(size) +
            " on process " + std::to_string(r));
      }
      l.size = size;
      l.ranks.push_back(static_cast<int>(r));
    }
  }
  return all;
}

std::string EncodeUnion(const std::map<std::string, Listed>& all) {
  std::string out;
  PutU64(out, all.size());
  for (const auto& [name, l] : all) {
    PutString(out, name);
    PutU64(out, l.size);
    PutU64(out, l.ranks.size());
    for (int r : l.ranks) PutU64(out, static_cast<uint64_t>(r));
  }
  return out;
}

Result<std::map<std::string, Listed>> DecodeUnion(const std::string& bytes, int processes) {
  std::map<std::string, Listed> all;
  Cursor c(bytes);
  uint64_t n = 0;
  if (!c.U64(n)) return InternalError("file union message");
  for (uint64_t i = 0; i < n; ++i) {
    std::string name;
    Listed l;
    uint64_t count = 0;
    if (!c.String(name) || !c.U64(l.size) || !c.U64(count) ||
        count > static_cast<uint64_t>(processes)) {
      return InternalError("file union message");
    }
    for (uint64_t k = 0; k < count; ++k) {
      uint64_t r = 0;
      if (!c.U64(r) || r >= static_cast<uint64_t>(processes)) return InternalError("file union message");
      l.ranks.push_back(static_cast<int>(r));
    }
    all.emplace(std::move(name), std::move(l));
  }
  return all;
}

// The index of this process's host among the job's hosts, sorted by name.
int NodeIndex(Communicator& comm) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  std::vector<std::string> hosts = comm.Gather(host, 0);
  std::string mine_and_all;
  if (comm.rank() == 0) {
    std::set<std::string> unique(hosts.begin(), hosts.end());
    std::vector<std::string> sorted(unique.begin(), unique.end());
    for (const std::string& h : hosts) {
      PutU64(mine_and_all, static_cast<uint64_t>(
                               std::lower_bound(sorted.begin(), sorted.end(), h) - sorted.begin()));
    }
  }
  comm.Broadcast(mine_and_all, 0);
  Cursor c(mine_and_all);
  uint64_t node = 0;
  for (int r = 0; r <= comm.rank(); ++r) c.U64(node);
  return static_cast<int>(node);
}

}  // namespace

std::string ExpandInputPath(const std::string& pattern, int rank, int node) {
  std::string out;
  for (size_t i = 0; i < pattern.size();) {
    if (pattern.compare(i, 6, "{rank}") == 0) {
      out += std::to_string(rank);
      i += 6;
    } else if (pattern.compare(i, 6, "{node}") == 0) {
      out += std::to_string(node);
      i += 6;
    } else {
      out += pattern[i++];
    }
  }
  return out;
}

Result<SharedInput> ShareInput(const std::string& input, Communicator& comm) {
  SharedInput shared;
  shared.path = input;
  const bool has_rank = input.find("{rank}") != std::string::npos;
  const bool has_node = input.find("{node}") != std::string::npos;
  if (comm.size() == 1 && !has_rank && !has_node) {
    shared.local_path = input;
    return shared;
  }
  Env* base = DefaultEnv();
  const int node = has_node ? NodeIndex(comm) : 0;
  shared.local_path = ExpandInputPath(input, comm.rank(), node);
  // A single file (safetensors): its directory is shared, the name must not vary.
  std::string logical_root = input;
  std::string local_root = shared.local_path;
  Status kind = Status::Ok();
  if (base->Type(shared.local_path, /*follow=*/true) == EnvFileType::kRegular) {
    logical_root = Dirname(input);
    local_root = Dirname(shared.local_path);
    if (Basename(input) != Basename(shared.local_path)) {
      kind = InvalidArgumentError(input + ": {rank} and {node} may appear only in the directory part");
    }
  }
  FC_RETURN_IF_ERROR(comm.AllOk(kind));

  // 1-2. Listings, merged by process 0, the union broadcast.
  Result<std::string> listing = ListLocal(base, local_root);
  FC_RETURN_IF_ERROR(comm.AllOk(listing.status()));
  const std::vector<std::string> listings = comm.Gather(*listing, 0);
  std::string union_bytes;
  Status merged = Status::Ok();
  if (comm.rank() == 0) {
    Result<std::map<std::string, Listed>> all = MergeListings(listings, logical_root);
    if (all.ok()) union_bytes = EncodeUnion(*all);
    merged = all.status();
  }
  FC_RETURN_IF_ERROR(comm.AllOk(merged));
  comm.Broadcast(union_bytes, 0);
  FC_ASSIGN_OR_RETURN(auto all, DecodeUnion(union_bytes, comm.size()));

  // 3. Metadata: read once, by the lowest process that has it, and broadcast.
  std::map<std::string, InputViewEnv::Entry> entries;
  // Every process holds every shared metadata file: their total is bounded, not only each
  // one (the sizes come from the union, so every process decides alike).
  uint64_t shared_bytes = 0;
  for (const auto& [name, listed] : all) {
    InputViewEnv::Entry e;
    e.size = listed.size;
    e.local = std::binary_search(listed.ranks.begin(), listed.ranks.end(), comm.rank());
    e.on_every_process = listed.ranks.size() == static_cast<size_t>(comm.size());
    e.reader = listed.ranks.front();
    e.seen_by = Processes(listed.ranks);
    // Beyond the bound a metadata file stays where it is, like a data file.
    if (IsMetadataName(Basename(name)) && listed.size <= kMaxSharedMetadata - shared_bytes) {
      shared_bytes += listed.size;
      const int root = listed.ranks.front();
      std::string message;
      if (comm.rank() == root) {
        Result<std::vector<std::byte>> bytes =
            ReadWholeFile(JoinPath(local_root, name), kMaxSharedMetadata);
        if (bytes.ok()) {
          message = "\1" + std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
        } else {
          message = "\0" + bytes.status().ToString();
          message[0] = '\0';
        }
      }
      comm.Broadcast(message, root);
      if (message.empty() || message[0] != '\1') {
        return IoError("process " + std::to_string(root) + " could not read " +
                       JoinPath(input, name) + ": " + (message.empty() ? "" : message.substr(1)));
      }
      e.bytes = std::make_shared<const std::string>(message.substr(1));
    }
    entries.emplace(name, std::move(e));
  }
  // 4. The view.
  shared.view = std::make_unique<InputViewEnv>(base, logical_root, local_root, std::move(entries));
  shared.scope = std::make_unique<ScopedEnvOverride>(shared.view.get());
  return shared;
}

namespace {

// Up to `length` bytes at `offset` of entry `name`, read from this process's disk.
Result<std::string> ReadLocalRange(InputViewEnv& view, const std::string& name, uint64_t offset,
                                   uint64_t length) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<EnvReadableFile> f, view.OpenLocal(name));
  if (offset > f->size()) return std::string();
  std::string bytes(static_cast<size_t>(std::min(length, f->size() - offset)), '\0');
  std::span<std::byte> dst = std::as_writable_bytes(std::span(bytes.data(), bytes.size()));
  for (size_t done = 0; done < dst.size();) {
    FC_ASSIGN_OR_RETURN(size_t n, f->Read(offset + done, dst.subspan(done)));
    if (n == 0) return DataLossError(name + ": file shrank while reading at " + std::to_string(offset + done));
    CountRead(n);  // read from this disk for every process (which count none of it)
    done += n;
  }
  return bytes;
}

// On every process in step: the lowest process that has `name` reads the range and
// broadcasts it; every process adds it to its view.
Status ServeFetch(InputViewEnv& view, const std::string& input, const std::string& name,
                  uint64_t offset, uint64_t length, Communicator& comm) {
  const InputViewEnv::Entry* e = view.Find(name);
  const int holder = e ? e->reader : 0;
  std::string message;
  if (comm.rank() == holder) {
    Result<std::string> bytes = e ? ReadLocalRange(view, name, offset, length)
                                  : Result<std::string>(NotFoundError("not among the input's files"));
    message = bytes.ok() ? "\1" + *bytes : std::string(1, '\0') + bytes.status().ToString();
  }
  comm.Broadcast(message, holder);
  if (message.empty() || message[0] != '\1') {
    return IoError("process " + std::to_string(holder) + " could not read " + JoinPath(input, name) +
                   (message.size() > 1 ? ": " + message.substr(1) : std::string()));
  }
  view.AddFetched(name, offset, std::make_shared<const std::string>(message.substr(1)));
  return Status::Ok();
}

}  // namespace

Result<CheckpointIndex> OpenSharedCheckpoint(SharedInput& input, const OpenOptions& options,
                                             Communicator& comm) {
  OpenOptions agreed = options;
  CheckpointIndex index;
  auto open = [&]() -> Status {
    FC_ASSIGN_OR_RETURN(index, OpenCheckpoint(input.path, agreed));
    return Status::Ok();
  };
  bool fetch = input.view && input.view->HasUnsharedFiles();
  if (fetch) {
    // Process 0 detects the format for all: detection looks at names only, but each
    // process's listing of a directory adds what it alone has there (an empty directory, a
    // refused symlink), so two processes may detect different formats; taking different
    // paths below would pair process 0's fetch requests with the others' AllOk and hang.
    std::string decision;  // fetch (0 or 1), then the detected format when there is one
    if (comm.rank() == 0) {
      Result<CheckpointFormat> detected = options.format
                                              ? Result<CheckpointFormat>(*options.format)
                                              : DetectCheckpointFormat(input.path);
      fetch = detected.ok() && *detected != CheckpointFormat::kTorchDcp &&
              *detected != CheckpointFormat::kFcDistcp;
      decision.push_back(fetch ? '\1' : '\0');
      if (detected.ok()) decision.push_back(static_cast<char>(*detected));
    }
    comm.Broadcast(decision, 0);
    fetch = !decision.empty() && decision[0] == '\1';
    if (decision.size() == 2) agreed.format = static_cast<CheckpointFormat>(decision[1]);
  }
  if (!fetch) {
    const uint64_t missed_before = input.view ? input.view->missed_reads() : 0;
    FC_RETURN_IF_ERROR(comm.AllOk(open()));
    // Torch DCP opens from its metadata alone, except what it reads to show Megatron's
    // common.pt and flat optimizer states (src/format/megatron/megatron_buckets.h), which a
    // process without those files reads otherwise, or not at all. When any process missed
    // a read, the checkpoint is opened again as the formats that read data are: process 0
    // first, the others from the same bytes.
    if (!input.view || !input.view->HasUnsharedFiles()) return index;
    const std::string mine(1, input.view->missed_reads() > missed_before ? '\1' : '\0');
    std::vector<std::string> all = comm.Gather(mine, 0);
    std::string any(1, '\0');
    if (comm.rank() == 0) {
      for (const std::string& a : all) any[0] = static_cast<char>(any[0] | (a.empty() ? 0 : a[0]));
    }
    comm.Broadcast(any, 0);
    if (any.empty() || any[0] == '\0') return index;
    agreed.format = index.format;
    index = CheckpointIndex();
  }
  InputViewEnv& view = *input.view;
  Status opened = Status::Ok();
  if (comm.rank() == 0) {
    uint64_t fetched = 0;
    view.SetFetch([&](const std::string& name, uint64_t offset, uint64_t length) -> Status {
      if (length > kMaxSharedMetadata - fetched) {
        return ResourceExhaustedError(JoinPath(input.path, name) + ": opening the checkpoint " +
                                      "read more than " + HumanBytes(kMaxSharedMetadata) +
                                      " of files that are not on every process's disk");
      }
      fetched += length;
      std::string request;
      PutU64(request, 1);
      PutString(request, name);
      PutU64(request, offset);
      PutU64(request, length);
      comm.Broadcast(request, 0);
      return ServeFetch(view, input.path, name, offset, length, comm);
    });
    opened = open();
    view.SetFetch({});
    std::string done;
    PutU64(done, 0);
    comm.Broadcast(done, 0);
  } else {
    for (;;) {
      std::string request;
      comm.Broadcast(request, 0);
      Cursor c(request);
      uint64_t kind = 0, offset = 0, length = 0;
      std::string name;
      if (!c.U64(kind) || kind == 0) break;
      if (!c.String(name) || !c.U64(offset) || !c.U64(length)) {
        return InternalError("fetch request of " + std::to_string(request.size()) + " bytes");
      }
      // A failed fetch is process 0's error to report; keep serving.
      (void)ServeFetch(view, input.path, name, offset, length, comm);
    }
    opened = open();
  }
  FC_RETURN_IF_ERROR(comm.AllOk(opened));
  return index;
}

Result<std::vector<std::vector<int>>> ShareVisibility(const CheckpointIndex& index,
                                                      SharedInput& input, Communicator& comm) {
  std::vector<std::vector<int>> visibility;
  if (!input.view) return visibility;
  std::string mine(index.files.size(), '\0');
  for (size_t f = 0; f < index.files.size(); ++f) {
    if (input.view->LocalFile(JoinPath(index.root, index.files[f].path))) mine[f] = '\1';
  }
  std::vector<std::string> all = comm.Gather(mine, 0);
  std::string joined;
  if (comm.rank() == 0) {
    for (const std::string& s : all) joined += s;
  }
  comm.Broadcast(joined, 0);
  if (joined.size() != index.files.size() * static_cast<size_t>(comm.size())) {
    return InternalError("file visibility message of " + std::to_string(joined.size()) + " bytes");
  }
  visibility.resize(index.files.size());
  for (int r = 0; r < comm.size(); ++r) {
    for (size_t f = 0; f < index.files.size(); ++f) {
      if (joined[static_cast<size_t>(r) * index.files.size() + f]) visibility[f].push_back(r);
    }
  }
  return visibility;
}

PlanResources AgreeOnResources(int requested_threads, uint64_t requested_budget,
                               Communicator& comm) {
  PlanResources r;
  std::string message;
  if (comm.rank() == 0) {
    uint64_t local = 1;
    if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); v != nullptr && comm.size() > 1) {
      local = std::clamp<uint64_t>(std::strtoull(v, nullptr, 10), 1, 4096);
    }
    const uint64_t threads =
        requested_threads > 0
            ? static_cast<uint64_t>(requested_threads)
            : std::max<uint64_t>(1, static_cast<uint64_t>(WorkerThreads(0)) / local);
    const uint64_t budget =
        requested_budget > 0 ? requested_budget : PhysicalMemoryBytes() / 4 / local;
    PutU64(message, threads);
    PutU64(message, budget);
  }
  comm.Broadcast(message, 0);
  Cursor c(message);
  uint64_t threads = 1, budget = 0;
  c.U64(threads);
  c.U64(budget);
  r.threads = static_cast<int>(std::clamp<uint64_t>(threads, 1, 1024));
  r.memory_budget = budget;
  return r;
}

std::vector<std::vector<int>> SimulatedVisibility(const CheckpointIndex& index, int processes,
                                                  bool shared) {
  std::vector<std::vector<int>> visibility;
  if (shared || processes < 1) return visibility;
  std::vector<int> everyone(static_cast<size_t>(processes));
  for (int r = 0; r < processes; ++r) everyone[static_cast<size_t>(r)] = r;
  for (const FileInfo& f : index.files) {
    const std::string name = Basename(f.path);
    const size_t digit = name.find_first_of("0123456789");
    if (digit == std::string::npos) {
      visibility.push_back(everyone);
      continue;
    }
    uint64_t rank = 0;
    for (size_t i = digit; i < name.size() && name[i] >= '0' && name[i] <= '9' && rank < (1u << 30); ++i) {
      rank = rank * 10 + static_cast<uint64_t>(name[i] - '0');
    }
    visibility.push_back({static_cast<int>(rank % static_cast<uint64_t>(processes))});
  }
  return visibility;
}

Status CheckNeededFilesVisible(const PlanRequest& request, const CheckpointIndex& index) {
  if (request.source_visibility.empty()) return Status::Ok();
  std::set<const TensorEntry*> seen;
  for (const PlanTensor& t : request.tensors) {
    for (const SourcePiece& p : t.pieces) {
      if (!p.source || !seen.insert(p.source).second) continue;
      for (const Chunk& c : p.source->chunks) {
        if (c.replica_id != 0 || c.file >= request.source_visibility.size()) continue;
        if (request.source_visibility[c.file].empty()) {
          return NotFoundError(JoinPath(index.root, index.files[c.file].path) +
                               " (holding '" + p.source->key + "' " + c.box.ToString() +
                               ") is on no process's disk");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace fc
