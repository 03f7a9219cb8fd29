// ReadSafetensorsCheckpoint: one file, an HF index directory, or a directory of files.
#include <string>
#include <unordered_map>
#include <unordered_set>

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

  // Reads one file's header, appends it to index.files; returns its parsed header.
  Result<SafetensorsHeader> AddFile(const std::string& rel) {
    const std::string path = JoinPath(index.root, rel);
    FC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f, RandomAccessFile::Open(path));
    FC_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(*f));
    file_ids[rel] = static_cast<uint32_t>(index.files.size());
    index.files.push_back(FileInfo{rel, f->size()});
    for (const auto& [k, v] : header.metadata) {
      index.attributes.try_emplace("safetensors.metadata." + k, v);
    }
    return header;
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

Result<CheckpointIndex> ReadIndexed(const std::string& dir, const std::string& index_name) {
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

  // name -> (file id, header index)
  std::vector<SafetensorsHeader> headers;
  std::unordered_map<std::string, std::pair<uint32_t, size_t>> where;
  for (const std::string& f : files) {
    FC_ASSIGN_OR_RETURN(SafetensorsHeader h, b.AddFile(f));
    const uint32_t id = b.file_ids[f];
    for (size_t i = 0; i < h.tensors.size(); ++i) {
      const std::string& name = h.tensors[i].name;
      auto [it, inserted] = where.try_emplace(name, id, i);
      if (!inserted) {
        return DataLossError("tensor '" + name + "' is stored in both " +
                             b.index.files[it->second.first].path + " and " + f);
      }
    }
    headers.push_back(std::move(h));
  }
  for (const auto& [name, file] : entries) {
    auto it = where.find(name);
    if (it == where.end()) {
      return DataLossError(index_path + ": weight_map puts tensor '" + name + "' in " + file +
                           ", which does not hold it");
    }
    const uint32_t id = it->second.first;
    if (b.index.files[id].path != file) {
      return DataLossError(index_path + ": weight_map puts tensor '" + name + "' in " + file +
                           ", but it is stored in " + b.index.files[id].path);
    }
    b.index.tensors.push_back(
        Builder::MakeEntry(headers[id], headers[id].tensors[it->second.second], id));
  }
  if (b.index.tensors.size() != where.size()) {
    for (const SafetensorsHeader& h : headers) {
      for (const SafetensorsTensorInfo& t : h.tensors) {
        if (!seen.count(t.name)) {
          return DataLossError(index_path + ": tensor '" + t.name + "' in " +
                               b.index.files[where[t.name].first].path +
                               " is missing from weight_map");
        }
      }
    }
  }
  return std::move(b.index);
}

Result<CheckpointIndex> ReadFiles(const std::string& root, const std::vector<std::string>& files) {
  Builder b;
  b.index.format = CheckpointFormat::kSafetensors;
  b.index.root = root;
  std::unordered_map<std::string, uint32_t> owner;
  for (const std::string& f : files) {
    FC_ASSIGN_OR_RETURN(SafetensorsHeader h, b.AddFile(f));
    const uint32_t id = b.file_ids[f];
    for (const SafetensorsTensorInfo& t : h.tensors) {
      auto [it, inserted] = owner.try_emplace(t.name, id);
      if (!inserted) {
        return DataLossError("tensor '" + t.name + "' is stored in both " +
                             b.index.files[it->second].path + " and " + f);
      }
      b.index.tensors.push_back(Builder::MakeEntry(h, t, id));
    }
  }
  return std::move(b.index);
}

}  // namespace

Result<CheckpointIndex> ReadSafetensorsCheckpoint(const std::string& path) {
  if (!PathExists(path)) return NotFoundError(path + ": no such file or directory");
  if (!IsDirectory(path)) {
    if (EndsWith(path, ".safetensors.index.json")) {
      return ReadIndexed(Dirname(path), Basename(path));
    }
    return ReadFiles(Dirname(path), {Basename(path)});
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
    return ReadIndexed(path, chosen);
  }
  if (files.empty()) {
    return InvalidArgumentError(path + ": no *.safetensors files and no index");
  }
  return ReadFiles(path, files);
}

}  // namespace fc
