// ReadSafetensorsCheckpoint: one file, an HF index directory, or a directory of files.
#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "fc/core/box.h"
#include "fc/core/checked_math.h"
#include "fc/format/safetensors.h"
#include "fc/io/file.h"
#include "src/codec/json_util.h"

namespace fc {
namespace {

// HF index files are small (a line per tensor); anything this large is not one.
constexpr uint64_t kMaxIndexBytes = 1ull << 30;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A weight_map file name must stay inside the checkpoint directory.
bool IsSafeRelativePath(std::string_view p) {
  if (p.empty() || p.front() == '/') return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t slash = p.find('/', start);
    std::string_view part = p.substr(start, slash == std::string_view::npos ? p.npos
                                                                            : slash - start);
    if (part == ".." || part.empty()) return false;
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return true;
}

struct Builder {
  CheckpointIndex index;
  std::unordered_map<std::string, uint32_t> file_ids;
  OpenProblems* lenient = nullptr;  // opening for verification (fc/format/open_problems.h)
  std::unordered_set<std::string> skipped;  // files the lenient open could not read

  // A problem: the error, or, opening leniently, recorded (and Ok).
  Status Problem(const std::string& file, const std::string& key, const std::string& what,
                 const std::string& context) {
    if (!lenient) return DataLossError(context + what);
    lenient->Add(file, key, what);
    return Status::Ok();
  }

  // Reads one file's header, appends it to index.files; returns its parsed header. Opening
  // leniently, a file that cannot be opened or whose header cannot be parsed is recorded
  // and skipped (nullopt, in `skipped`); entries that do not tile its data buffer are
  // recorded, except a buffer too short for them (a truncated file): VerifyCheckpoint names
  // each tensor whose bytes pass the end of the file.
  Result<std::optional<SafetensorsHeader>> AddFile(const std::string& rel) {
    const std::string path = JoinPath(index.root, rel);
    std::string tiling;
    uint64_t size = 0;
    Result<SafetensorsHeader> read = [&]() -> Result<SafetensorsHeader> {
      FC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f, RandomAccessFile::Open(path));
      size = f->size();
      return ReadSafetensorsHeaderLenient(*f, lenient ? &tiling : nullptr);
    }();
    // Only a missing file and a corrupt header are the checkpoint's problems; a refused
    // symlink, an unsupported dtype, an I/O error stay errors.
    if (!read.ok() && lenient && (read.status().code() == StatusCode::kNotFound ||
                                  read.status().code() == StatusCode::kDataLoss)) {
      std::string what = read.status().message();
      if (what.compare(0, path.size() + 2, path + ": ") == 0) what.erase(0, path.size() + 2);
      lenient->Add(rel, "", what);
      skipped.insert(rel);
      return std::optional<SafetensorsHeader>();
    }
    FC_ASSIGN_OR_RETURN(SafetensorsHeader header, std::move(read));
    if (!tiling.empty()) {
      uint64_t end = 0;
      for (const SafetensorsTensorInfo& t : header.tensors) end = std::max(end, t.end);
      if (end <= size - header.data_start()) lenient->Add(rel, "", tiling);
    }
    file_ids[rel] = static_cast<uint32_t>(index.files.size());
    index.files.push_back(FileInfo{rel, size});
    for (const auto& [k, v] : header.metadata) {
      if (k == kDcpShardingInfoKey) continue;  // per file; becomes the chunks' offsets
      index.attributes.try_emplace("safetensors.metadata." + k, v);
    }
    return std::optional<SafetensorsHeader>(std::move(header));
  }

  static TensorEntry MakeEntry(const SafetensorsHeader& h, const SafetensorsTensorInfo& t,
                               uint32_t file) {
    TensorEntry e;
    e.key = t.name;
    e.dtype = t.dtype;
    e.global_shape = t.shape;
    Chunk c;
    c.box = Box::Whole(t.shape);
    c.file = file;
    c.byte_offset = h.data_start() + t.begin;
    c.byte_length = t.byte_length();
    e.chunks.push_back(std::move(c));
    return e;
  }
};

Result<CheckpointIndex> ReadIndexed(const std::string& dir, const std::string& index_name,
                                    OpenProblems* lenient) {
  const std::string index_path = JoinPath(dir, index_name);
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> text, ReadWholeFile(index_path, kMaxIndexBytes));
  simdjson::dom::parser parser;
  FC_ASSIGN_OR_RETURN(simdjson::dom::element root,
                      json_internal::ParseDocument(parser, text, index_path));
  simdjson::dom::element weight_map_e;
  simdjson::dom::object weight_map;
  if (root["weight_map"].get(weight_map_e) != simdjson::SUCCESS ||
      weight_map_e.get_object().get(weight_map) != simdjson::SUCCESS) {
    return DataLossError(index_path + ": no \"weight_map\" object");
  }

  Builder b;
  b.lenient = lenient;
  b.index.format = CheckpointFormat::kSafetensors;
  b.index.root = dir;
  b.index.attributes["hf_index"] = index_name;
  simdjson::dom::element total;
  if (root.at_pointer("/metadata/total_size").get(total) == simdjson::SUCCESS) {
    b.index.attributes["hf_total_size"] = simdjson::minify(total);
  }

  // Tensor name -> file, in weight_map order; files in order of first mention.
  std::vector<std::pair<std::string, std::string>> entries;
  std::unordered_set<std::string_view> seen;
  std::vector<std::string> files;
  std::unordered_set<std::string> file_set;
  for (simdjson::dom::key_value_pair kv : weight_map) {
    std::optional<std::string_view> file = json_internal::GetString(kv.value);
    if (!file) {
      return DataLossError(index_path + ": weight_map value of '" + std::string(kv.key) +
                           "' is not a string");
    }
    if (!IsSafeRelativePath(*file)) {
      return DataLossError(index_path + ": weight_map file name \"" + std::string(*file) +
                           "\" of '" + std::string(kv.key) +
                           "' is not a relative path inside the checkpoint");
    }
    if (!seen.insert(kv.key).second) {
      return DataLossError(index_path + ": tensor '" + std::string(kv.key) +
                           "' appears twice in weight_map");
    }
    entries.emplace_back(std::string(kv.key), std::string(*file));
    if (file_set.insert(std::string(*file)).second) files.emplace_back(*file);
  }

  // name -> (file id, header index); headers[id] is index.files[id]'s.
  std::vector<SafetensorsHeader> headers;
  std::unordered_map<std::string, std::pair<uint32_t, size_t>> where;
  for (const std::string& f : files) {
    FC_ASSIGN_OR_RETURN(std::optional<SafetensorsHeader> h, b.AddFile(f));
    if (!h) continue;  // recorded (lenient)
    const uint32_t id = b.file_ids[f];
    for (size_t i = 0; i < h->tensors.size(); ++i) {
      const std::string& name = h->tensors[i].name;
      auto [it, inserted] = where.try_emplace(name, id, i);
      if (!inserted) {
        FC_RETURN_IF_ERROR(b.Problem(f, name, "stored in both " +
                                                  b.index.files[it->second.first].path +
                                                  " and " + f, "tensor '" + name + "' is "));
      }
    }
    headers.push_back(std::move(*h));
  }
  const std::string index_context = index_path + ": ";
  for (const auto& [name, file] : entries) {
    if (b.skipped.count(file)) continue;  // its file's problem is recorded
    auto it = where.find(name);
    if (it == where.end()) {
      FC_RETURN_IF_ERROR(b.Problem(index_name, name, "weight_map puts tensor '" + name +
                                                         "' in " + file +
                                                         ", which does not hold it",
                                   index_context));
      continue;
    }
    const uint32_t id = it->second.first;
    if (b.index.files[id].path != file) {
      FC_RETURN_IF_ERROR(b.Problem(index_name, name, "weight_map puts tensor '" + name +
                                                         "' in " + file +
                                                         ", but it is stored in " +
                                                         b.index.files[id].path,
                                   index_context));
      continue;
    }
    b.index.tensors.push_back(
        Builder::MakeEntry(headers[id], headers[id].tensors[it->second.second], id));
  }
  for (const SafetensorsHeader& h : headers) {
    for (const SafetensorsTensorInfo& t : h.tensors) {
      if (!seen.count(t.name)) {
        FC_RETURN_IF_ERROR(b.Problem(index_name, t.name, "tensor '" + t.name + "' in " +
                                                             b.index.files[where[t.name].first].path +
                                                             " is missing from weight_map",
                                     index_context));
      }
    }
  }
  return std::move(b.index);
}

// DCP_SHARDING_INFO of one file: tensor name -> saved_offsets.
Result<std::map<std::string, Shape>> ParseShardingInfo(const std::string& text,
                                                       const std::string& what) {
  simdjson::dom::parser parser;
  FC_ASSIGN_OR_RETURN(simdjson::dom::element root,
                      json_internal::ParseDocument(
                          parser, std::as_bytes(std::span<const char>(text.data(), text.size())),
                          what));
  simdjson::dom::object obj;
  if (root.get_object().get(obj) != simdjson::SUCCESS) {
    return DataLossError(what + " is not a JSON object");
  }
  std::map<std::string, Shape> out;
  for (simdjson::dom::key_value_pair kv : obj) {
    simdjson::dom::element offsets;
    std::optional<Shape> shape;
    if (kv.value["saved_offsets"].get(offsets) != simdjson::SUCCESS ||
        !(shape = json_internal::GetShape(offsets))) {
      return DataLossError(what + ": tensor '" + std::string(kv.key) +
                           "' has no \"saved_offsets\" array of non-negative integers");
    }
    if (!out.emplace(std::string(kv.key), std::move(*shape)).second) {
      return DataLossError(what + ": tensor '" + std::string(kv.key) + "' appears twice");
    }
  }
  return out;
}

Result<CheckpointIndex> ReadFiles(const std::string& root, const std::vector<std::string>& files,
                                  OpenProblems* lenient) {
  Builder b;
  b.lenient = lenient;
  b.index.format = CheckpointFormat::kSafetensors;
  b.index.root = root;
  std::unordered_map<std::string, uint32_t> owner;       // unsharded tensors: file
  std::unordered_map<std::string, size_t> sharded_entry;  // sharded tensors: index entry
  size_t sharded_files = 0;
  for (const std::string& f : files) {
    FC_ASSIGN_OR_RETURN(std::optional<SafetensorsHeader> read, b.AddFile(f));
    if (!read) continue;  // recorded (lenient)
    const SafetensorsHeader& h = *read;
    const uint32_t id = b.file_ids[f];
    const std::string path = JoinPath(root, f);
    std::optional<std::map<std::string, Shape>> sharding;
    for (const auto& [k, v] : h.metadata) {
      if (k == kDcpShardingInfoKey) {
        FC_ASSIGN_OR_RETURN(sharding, ParseShardingInfo(v, path + ": " + k));
      }
    }
    if (sharding) ++sharded_files;
    for (const SafetensorsTensorInfo& t : h.tensors) {
      if (!sharding) {
        auto [it, inserted] = owner.try_emplace(t.name, id);
        if (!inserted || sharded_entry.count(t.name)) {
          FC_RETURN_IF_ERROR(b.Problem(
              f, t.name,
              "stored in both " +
                  (inserted ? std::string("a sharded file") : b.index.files[it->second].path) +
                  " and " + f + ", which is not a DCP shard",
              "tensor '" + t.name + "' is "));
          continue;
        }
        b.index.tensors.push_back(Builder::MakeEntry(h, t, id));
        continue;
      }
      // A piece of a tensor saved by several ranks: it lies at saved_offsets.
      auto off = sharding->find(t.name);
      if (off == sharding->end()) {
        return DataLossError(path + ": tensor '" + t.name + "' has no entry in " +
                             std::string(kDcpShardingInfoKey));
      }
      if (off->second.size() != t.shape.size()) {
        return DataLossError(path + ": tensor '" + t.name + "': saved_offsets " +
                             json_internal::ShapeText(off->second) + " and shape " +
                             json_internal::ShapeText(t.shape) + " differ in rank");
      }
      if (owner.count(t.name)) {
        return DataLossError("tensor '" + t.name + "' is stored whole in " +
                             b.index.files[owner[t.name]].path + " and as a DCP shard in " + f);
      }
      TensorEntry piece = Builder::MakeEntry(h, t, id);
      piece.chunks[0].box = Box{off->second, t.shape};
      auto [it, inserted] = sharded_entry.try_emplace(t.name, b.index.tensors.size());
      if (inserted) {
        b.index.tensors.push_back(std::move(piece));
        continue;
      }
      TensorEntry& e = b.index.tensors[it->second];
      if (e.dtype != piece.dtype || e.chunks[0].box.rank() != t.shape.size()) {
        return DataLossError(path + ": tensor '" + t.name + "' is " +
                             std::string(DTypeSafetensorsName(piece.dtype)) + " of rank " +
                             std::to_string(t.shape.size()) + " here but " +
                             std::string(DTypeSafetensorsName(e.dtype)) + " of rank " +
                             std::to_string(e.chunks[0].box.rank()) + " in " +
                             b.index.files[e.chunks[0].file].path);
      }
      Chunk c = std::move(piece.chunks[0]);
      for (const Chunk& other : e.chunks) {
        if (other.box.global_offset == c.box.global_offset &&
            other.box.local_shape == c.box.local_shape) {
          c.replica_id = std::max(c.replica_id, other.replica_id + 1);
        }
      }
      e.chunks.push_back(std::move(c));
    }
  }
  // Global shapes of sharded tensors: the end of the furthest piece in each dimension (as
  // torch's consolidate_safetensors_files does).
  for (const auto& [name, i] : sharded_entry) {
    TensorEntry& e = b.index.tensors[i];
    Shape global(e.chunks[0].box.rank(), 0);
    for (const Chunk& c : e.chunks) {
      for (size_t d = 0; d < global.size(); ++d) {
        int64_t end = 0;
        if (__builtin_add_overflow(c.box.global_offset[d], c.box.local_shape[d], &end)) {
          return DataLossError("tensor '" + name + "': piece " + c.box.ToString() + " in " +
                               b.index.files[c.file].path + " ends beyond 64-bit offsets");
        }
        global[d] = std::max(global[d], end);
      }
    }
    FC_RETURN_IF_ERROR_WITH(CheckedNumElements(global).status(), "tensor '" + name + "'");
    for (const Chunk& c : e.chunks) {
      FC_RETURN_IF_ERROR_WITH(ValidateBox(c.box, global),
                              "tensor '" + name + "' in " + b.index.files[c.file].path);
    }
    e.global_shape = std::move(global);
  }
  if (sharded_files) {
    b.index.attributes["dcp_sharded_files"] = std::to_string(sharded_files);
  }
  return std::move(b.index);
}

}  // namespace

Result<CheckpointIndex> ReadSafetensorsCheckpoint(const std::string& path, OpenProblems* lenient) {
  if (!PathExists(path)) return NotFoundError(path + ": no such file or directory");
  if (!IsDirectory(path)) {
    if (EndsWith(path, ".safetensors.index.json")) {
      return ReadIndexed(Dirname(path), Basename(path), lenient);
    }
    return ReadFiles(Dirname(path), {Basename(path)}, lenient);
  }

  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(path));
  std::vector<std::string> indexes, files;
  for (const std::string& n : names) {
    if (EndsWith(n, ".safetensors.index.json")) indexes.push_back(n);
    if (EndsWith(n, ".safetensors") && !IsDirectory(JoinPath(path, n))) files.push_back(n);
  }
  if (!indexes.empty()) {
    std::string chosen;
    for (const std::string& n : indexes) {
      if (n == kHfIndexFileName) chosen = n;
    }
    if (chosen.empty()) {
      if (indexes.size() > 1) {
        std::string list;
        for (const std::string& n : indexes) list += (list.empty() ? "" : ", ") + n;
        return InvalidArgumentError(path + ": several safetensors index files (" + list +
                                    ") and no " + std::string(kHfIndexFileName) +
                                    "; pass the index file itself");
      }
      chosen = indexes.front();
    }
    return ReadIndexed(path, chosen, lenient);
  }
  if (files.empty()) {
    // A distributed HuggingFaceStorageWriter save whose consolidated files are not there
    // (yet): the per-rank shards in sharded/.
    const std::string sharded = JoinPath(path, std::string(kHfShardedDirName));
    if (IsDirectory(sharded)) {
      FC_ASSIGN_OR_RETURN(std::vector<std::string> inner, ListDirectory(sharded));
      for (const std::string& n : inner) {
        if (EndsWith(n, ".safetensors") && !IsDirectory(JoinPath(sharded, n))) {
          files.push_back(std::string(kHfShardedDirName) + "/" + n);
        }
      }
    }
  }
  if (files.empty()) {
    return InvalidArgumentError(path + ": no *.safetensors files and no index");
  }
  return ReadFiles(path, files, lenient);
}

}  // namespace fc
