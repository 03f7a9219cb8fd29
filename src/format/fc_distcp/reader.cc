// fc distcp reader: fc.metadata.json -> CheckpointIndex, then cross-checked against the
// safetensors headers of the data files so that a metadata file and data files that do not
// belong together are caught at open time rather than as wrong tensor values later.
#include <unordered_map>
#include <unordered_set>

#include "fc/core/checked_math.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/open_problems.h"
#include "fc/io/file.h"
#include "src/format/fc_distcp/internal.h"
#include "src/codec/json_util.h"

namespace fc {
namespace {

using fcdistcp_internal::ChunkEntryName;
using fcdistcp_internal::ChunkText;
using fcdistcp_internal::ObjectEntryName;
using json_internal::Excerpt;
using json_internal::GetShape;
using json_internal::GetString;
using json_internal::GetUint;
using json_internal::ShapeText;

// The metadata file lists every chunk; 1 GiB is far beyond any real checkpoint's.
constexpr uint64_t kMaxMetadataBytes = 1ull << 30;

// Field access with "<context>: <problem>" errors.
class Fields {
 public:
  Fields(simdjson::dom::object obj, std::string context)
      : obj_(obj), context_(std::move(context)) {}

  const std::string& context() const { return context_; }
  // The same object under another context.
  Fields Renamed(std::string context) const { return Fields(obj_, std::move(context)); }

  Result<simdjson::dom::element> Get(std::string_view name) const {
    simdjson::dom::element e;
    if (obj_[name].get(e) != simdjson::SUCCESS) {
      return DataLossError(context_ + ": missing \"" + std::string(name) + "\"");
    }
    return e;
  }
  Result<std::string> String(std::string_view name) const {
    FC_ASSIGN_OR_RETURN(simdjson::dom::element e, Get(name));
    std::optional<std::string_view> s = GetString(e);
    if (!s) return Bad(name, "a string", e);
    return std::string(*s);
  }
  Result<uint64_t> Uint(std::string_view name) const {
    FC_ASSIGN_OR_RETURN(simdjson::dom::element e, Get(name));
    std::optional<uint64_t> v = GetUint(e);
    if (!v) return Bad(name, "a non-negative integer", e);
    return *v;
  }
  Result<Shape> ShapeField(std::string_view name) const {
    FC_ASSIGN_OR_RETURN(simdjson::dom::element e, Get(name));
    std::optional<Shape> v = GetShape(e);
    if (!v) return Bad(name, "an array of non-negative integers", e);
    return *v;
  }
  Result<simdjson::dom::array> Array(std::string_view name) const {
    FC_ASSIGN_OR_RETURN(simdjson::dom::element e, Get(name));
    simdjson::dom::array a;
    if (e.get_array().get(a) != simdjson::SUCCESS) return Bad(name, "an array", e);
    return a;
  }
  Status Bad(std::string_view name, std::string_view want, simdjson::dom::element e) const {
    return DataLossError(context_ + ": \"" + std::string(name) + "\" is not " +
                         std::string(want) + ": " + Excerpt(e));
  }

 private:
  simdjson::dom::object obj_;
  std::string context_;
};

Result<Fields> AsObject(simdjson::dom::element e, std::string context) {
  simdjson::dom::object obj;
  if (e.get_object().get(obj) != simdjson::SUCCESS) {
    return DataLossError(context + ": not an object: " + Excerpt(e));
  }
  return Fields(obj, std::move(context));
}

Result<uint64_t> ParseHex64(const Fields& f) {
  FC_ASSIGN_OR_RETURN(std::string s, f.String("xxh3_64"));
  if (s.size() != 16) {
    return DataLossError(f.context() + ": \"xxh3_64\" \"" + s + "\" is not 16 hex digits");
  }
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return DataLossError(f.context() + ": \"xxh3_64\" \"" + s + "\" is not 16 hex digits");
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

struct FileRef {
  uint32_t id;
  uint64_t size;
};

// "file", "byte_offset", "byte_length": the file is listed and the range is inside it (the
// range is left to VerifyCheckpoint when opening leniently).
Status ParseLocation(const Fields& f, const std::unordered_map<std::string, FileRef>& files,
                     uint32_t* file, uint64_t* offset, uint64_t* length, bool lenient) {
  FC_ASSIGN_OR_RETURN(std::string name, f.String("file"));
  auto it = files.find(name);
  if (it == files.end()) {
    return DataLossError(f.context() + ": file \"" + name + "\" is not in \"files\"");
  }
  FC_ASSIGN_OR_RETURN(*offset, f.Uint("byte_offset"));
  FC_ASSIGN_OR_RETURN(*length, f.Uint("byte_length"));
  std::optional<uint64_t> end = CheckedAddU(*offset, *length);
  if (!lenient && (!end || *end > it->second.size)) {
    return DataLossError(f.context() + ": bytes [" + std::to_string(*offset) + ", +" +
                         std::to_string(*length) + ") pass the end of " + name + " (" +
                         std::to_string(it->second.size) + " bytes)");
  }
  *file = it->second.id;
  return Status::Ok();
}

Result<Chunk> ParseChunk(simdjson::dom::element e, const TensorEntry& t, size_t index,
                         const std::unordered_map<std::string, FileRef>& files,
                         const CheckpointIndex& fc_index, OpenProblems* lenient) {
  FC_ASSIGN_OR_RETURN(Fields f, AsObject(e, "tensor '" + t.key + "' chunk " +
                                                std::to_string(index)));
  Chunk c;
  FC_ASSIGN_OR_RETURN(c.box.global_offset, f.ShapeField("global_offset"));
  FC_ASSIGN_OR_RETURN(c.box.local_shape, f.ShapeField("local_shape"));
  FC_RETURN_IF_ERROR_WITH(ValidateBox(c.box, t.global_shape), f.context());
  const std::string what = ChunkText(t.key, c.box, std::nullopt);

  FC_ASSIGN_OR_RETURN(simdjson::dom::element flat, f.Get("flattened_range"));
  if (!flat.is_null()) {
    simdjson::dom::array pair;
    std::optional<int64_t> lo, hi;
    if (flat.get_array().get(pair) == simdjson::SUCCESS && pair.size() == 2) {
      lo = json_internal::GetNonNegativeInt(pair.at(0).value_unsafe());
      hi = json_internal::GetNonNegativeInt(pair.at(1).value_unsafe());
    }
    if (!lo || !hi) {
      return DataLossError(what + ": \"flattened_range\" is not null or [min, max]: " +
                           Excerpt(flat));
    }
    c.flat_range = FlatRange{*lo, *hi};
    if (*hi < *lo || *hi > c.box.num_elements()) {
      return DataLossError(what + ": flattened range " + c.flat_range->ToString() +
                           " is not within the box's " +
                           std::to_string(c.box.num_elements()) + " elements");
    }
  }
  const std::string full = ChunkText(t.key, c.box, c.flat_range);
  FC_ASSIGN_OR_RETURN(uint64_t replica, f.Renamed(full).Uint("replica_id"));
  if (replica > static_cast<uint64_t>(INT64_MAX)) {
    return DataLossError(full + ": replica_id " + std::to_string(replica) + " out of range");
  }
  c.replica_id = static_cast<int64_t>(replica);
  const Fields located = f.Renamed(full);
  FC_RETURN_IF_ERROR(ParseLocation(located, files, &c.file, &c.byte_offset, &c.byte_length,
                                   lenient != nullptr));
  std::optional<uint64_t> expected =
      CheckedMulU(static_cast<uint64_t>(c.stored_elements()), DTypeSize(t.dtype));
  if (!expected || *expected != c.byte_length) {
    const std::string what = "byte_length " + std::to_string(c.byte_length) + ", but " +
                             std::to_string(c.stored_elements()) + " elements of " +
                             std::string(DTypeName(t.dtype)) + " need " +
                             (expected ? std::to_string(*expected) : std::string("more"));
    if (!lenient) return DataLossError(full + ": " + what);
    // Too short is VerifyCheckpoint's "needs N bytes" problem; too long only shows here.
    if (expected && *expected < c.byte_length) {
      std::string chunk = "chunk " + c.box.ToString();
      if (c.flat_range) chunk += " flat " + c.flat_range->ToString();
      lenient->Add(fc_index.files[c.file].path, t.key, chunk + ": " + what);
    }
  }
  FC_ASSIGN_OR_RETURN(uint64_t sum, ParseHex64(located));
  c.xxh3_64 = sum;
  return c;
}

// Cross-checks one data file's safetensors header against the chunks and objects the
// metadata places in it. Leniently: a disagreement is recorded in `lenient` (and the file
// size the index keeps is the one on disk), a file that cannot be opened is left to
// VerifyCheckpoint, and so is a range past the file's end (its entry is not compared).
Status CheckDataFile(CheckpointIndex& index, uint32_t file_id,
                     const std::vector<std::pair<const TensorEntry*, size_t>>& chunks,
                     const std::vector<const ObjectEntry*>& objects, OpenProblems* lenient) {
  FileInfo& info = index.files[file_id];
  const std::string path = JoinPath(index.root, info.path);
  // The error, or the recorded problem; `key` is the tensor or object, `what` names it too.
  auto problem = [&](const std::string& key, const std::string& what) -> Status {
    if (!lenient) return DataLossError(path + ": " + what);
    // The problem names the key itself: "chunk [0, 2) x [0, 6): ...".
    const std::string named = "tensor '" + key + "' ";
    lenient->Add(info.path, key, what.compare(0, named.size(), named) == 0
                                     ? what.substr(named.size())
                                     : what);
    return Status::Ok();
  };
  Result<std::unique_ptr<RandomAccessFile>> opened = RandomAccessFile::Open(path);
  // A missing file is VerifyCheckpoint's to report; other refusals (a symlink out of the
  // checkpoint, a FIFO) stay errors.
  if (!opened.ok() && lenient && opened.status().code() == StatusCode::kNotFound) {
    return Status::Ok();
  }
  FC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, std::move(opened));
  if (file->size() != info.size) {
    FC_RETURN_IF_ERROR(problem("", "file is " + std::to_string(file->size()) +
                                       " bytes, fc.metadata.json says " +
                                       std::to_string(info.size)));
    // A file of another size is not compared entry by entry: the ranges past its end
    // are what VerifyCheckpoint goes on to report.
    info.size = file->size();
    return Status::Ok();
  }
  // A file on another process's disk (a multi-process run) is checked by the processes that
  // can read it: every process opens the checkpoint and they agree on the outcome.
  if (!file->readable_here()) return Status::Ok();
  Result<SafetensorsHeader> read = ReadSafetensorsHeader(*file);
  if (!read.ok() && lenient && read.status().code() == StatusCode::kDataLoss) {
    lenient->Add(info.path, "", "safetensors header: " + read.status().message());
    return Status::Ok();
  }
  FC_ASSIGN_OR_RETURN(SafetensorsHeader header, std::move(read));
  std::unordered_map<std::string_view, const SafetensorsTensorInfo*> entries;
  for (const SafetensorsTensorInfo& e : header.tensors) entries[e.name] = &e;

  size_t accounted = 0;
  auto check = [&](const std::string& key, const std::string& entry_name,
                   const std::string& what, DType dtype, const Shape& shape, uint64_t offset,
                   uint64_t length) -> Status {
    auto it = entries.find(entry_name);
    if (lenient) {
      std::optional<uint64_t> end = CheckedAddU(offset, length);
      if (!end || *end > info.size) {
        if (it != entries.end()) ++accounted;
        return Status::Ok();
      }
    }
    if (it == entries.end()) {
      return problem(key, what + ": no entry '" + entry_name +
                              "' in the file's safetensors header");
    }
    ++accounted;
    const SafetensorsTensorInfo& e = *it->second;
    if (e.dtype != dtype || e.shape != shape ||
        header.data_start() + e.begin != offset) {
      return problem(
          key, what + ": entry '" + entry_name + "' is " +
                   std::string(DTypeSafetensorsName(e.dtype)) + " " + ShapeText(e.shape) +
                   " at byte " + std::to_string(header.data_start() + e.begin) +
                   ", fc.metadata.json says " + std::string(DTypeSafetensorsName(dtype)) +
                   " " + ShapeText(shape) + " at byte " + std::to_string(offset));
    }
    return Status::Ok();
  };
  for (const auto& [t, i] : chunks) {
    const Chunk& c = t->chunks[i];
    Shape shape = c.flat_range ? Shape{c.flat_range->size()} : c.box.local_shape;
    FC_RETURN_IF_ERROR(check(t->key, ChunkEntryName(t->key, i),
                             ChunkText(t->key, c.box, c.flat_range), t->dtype, shape,
                             c.byte_offset, c.byte_length));
  }
  for (const ObjectEntry* o : objects) {
    FC_RETURN_IF_ERROR(check(o->key, ObjectEntryName(o->key), "object '" + o->key + "'",
                             DType::kUInt8, Shape{static_cast<int64_t>(o->byte_length)},
                             o->byte_offset, o->byte_length));
  }
  if (accounted != header.tensors.size()) {
    std::unordered_set<std::string> expected;
    for (const auto& [t, i] : chunks) expected.insert(ChunkEntryName(t->key, i));
    for (const ObjectEntry* o : objects) expected.insert(ObjectEntryName(o->key));
    for (const SafetensorsTensorInfo& e : header.tensors) {
      if (expected.count(e.name)) continue;
      const bool pad_name = e.name.size() > 4 && e.name.compare(0, 4, "@pad") == 0 &&
                            e.name.find_first_not_of("0123456789", 4) == std::string::npos;
      if (!pad_name || e.dtype != DType::kUInt8 || e.shape.size() != 1) {
        FC_RETURN_IF_ERROR(problem("", "entry '" + e.name + "' is neither a chunk or object "
                                       "of fc.metadata.json nor padding"));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<CheckpointIndex> ParseFcDistcpMetadata(std::span<const std::byte> json,
                                              const std::string& root, OpenProblems* lenient) {
  simdjson::dom::parser parser;
  FC_ASSIGN_OR_RETURN(simdjson::dom::element doc, json_internal::ParseDocument(
                                                      parser, json, kFcDistcpMetadataFileName));
  FC_ASSIGN_OR_RETURN(Fields top, AsObject(doc, std::string(kFcDistcpMetadataFileName)));

  FC_ASSIGN_OR_RETURN(std::string format, top.String("format"));
  if (format != kFcDistcpFormatName) {
    return DataLossError(top.context() + ": \"format\" is \"" + format + "\", expected \"" +
                         std::string(kFcDistcpFormatName) + "\"");
  }
  FC_ASSIGN_OR_RETURN(uint64_t version, top.Uint("version"));
  if (version > static_cast<uint64_t>(kFcDistcpVersion)) {
    return UnimplementedError(top.context() + ": format version " + std::to_string(version) +
                              " is newer than this fc supports (" +
                              std::to_string(kFcDistcpVersion) + ")");
  }
  if (version != static_cast<uint64_t>(kFcDistcpVersion)) {
    return DataLossError(top.context() + ": bad format version " + std::to_string(version));
  }

  CheckpointIndex index;
  index.format = CheckpointFormat::kFcDistcp;
  index.root = root;
  index.attributes["fc_distcp_version"] = std::to_string(version);

  simdjson::dom::element attrs;
  if (doc["attributes"].get(attrs) == simdjson::SUCCESS && !attrs.is_null()) {
    simdjson::dom::object obj;
    if (attrs.get_object().get(obj) != simdjson::SUCCESS) {
      return DataLossError(top.context() + ": \"attributes\" is not an object: " +
                           Excerpt(attrs));
    }
    for (simdjson::dom::key_value_pair kv : obj) {
      std::optional<std::string_view> v = GetString(kv.value);
      if (!v) {
        return DataLossError(top.context() + ": attribute '" + std::string(kv.key) +
                             "' is not a string");
      }
      index.attributes[std::string(kv.key)] = std::string(*v);
    }
  }

  std::unordered_map<std::string, FileRef> files;
  FC_ASSIGN_OR_RETURN(simdjson::dom::array file_list, top.Array("files"));
  for (simdjson::dom::element fe : file_list) {
    FC_ASSIGN_OR_RETURN(Fields f, AsObject(fe, "file " + std::to_string(index.files.size())));
    FC_ASSIGN_OR_RETURN(std::string name, f.String("name"));
    FC_ASSIGN_OR_RETURN(uint64_t size, f.Uint("size"));
    if (name.find('/') != std::string::npos || name.size() <= 7 ||
        name.compare(name.size() - 7, 7, ".distcp") != 0) {
      return DataLossError("file name \"" + name + "\" is not a plain *.distcp name");
    }
    if (!files.try_emplace(name, FileRef{static_cast<uint32_t>(index.files.size()), size})
             .second) {
      return DataLossError("file \"" + name + "\" is listed twice");
    }
    index.files.push_back(FileInfo{name, size});
  }

  std::unordered_set<std::string> keys;
  FC_ASSIGN_OR_RETURN(simdjson::dom::array tensor_list, top.Array("tensors"));
  for (simdjson::dom::element te : tensor_list) {
    FC_ASSIGN_OR_RETURN(Fields unnamed,
                        AsObject(te, "tensor " + std::to_string(index.tensors.size())));
    TensorEntry t;
    FC_ASSIGN_OR_RETURN(t.key, unnamed.String("key"));
    if (!keys.insert(t.key).second) {
      return DataLossError("tensor '" + t.key + "' is listed twice");
    }
    const std::string who = "tensor '" + t.key + "'";
    const Fields f = unnamed.Renamed(who);
    FC_ASSIGN_OR_RETURN(std::string dtype_name, f.String("dtype"));
    Result<DType> dtype = ParseDType(dtype_name);
    if (!dtype.ok()) return DataLossError(who + ": unknown dtype \"" + dtype_name + "\"");
    t.dtype = *dtype;
    FC_ASSIGN_OR_RETURN(t.global_shape, f.ShapeField("global_shape"));
    if (!CheckedNumElements(t.global_shape).ok()) {
      return DataLossError(who + ": global shape " + ShapeText(t.global_shape) +
                           " has too many elements");
    }
    FC_ASSIGN_OR_RETURN(simdjson::dom::array chunks, f.Array("chunks"));
    for (simdjson::dom::element ce : chunks) {
      FC_ASSIGN_OR_RETURN(Chunk c, ParseChunk(ce, t, t.chunks.size(), files, index, lenient));
      t.chunks.push_back(std::move(c));
    }
    index.tensors.push_back(std::move(t));
  }

  std::unordered_set<std::string> object_keys;
  FC_ASSIGN_OR_RETURN(simdjson::dom::array object_list, top.Array("objects"));
  for (simdjson::dom::element oe : object_list) {
    FC_ASSIGN_OR_RETURN(Fields unnamed,
                        AsObject(oe, "object " + std::to_string(index.objects.size())));
    ObjectEntry o;
    FC_ASSIGN_OR_RETURN(o.key, unnamed.String("key"));
    if (!object_keys.insert(o.key).second) {
      return DataLossError("object '" + o.key + "' is listed twice");
    }
    const Fields f = unnamed.Renamed("object '" + o.key + "'");
    FC_ASSIGN_OR_RETURN(std::string enc, f.String("encoding"));
    Result<ObjectEncoding> encoding = ParseObjectEncoding(enc);
    if (!encoding.ok()) return encoding.status().With(f.context());
    o.encoding = *encoding;
    FC_RETURN_IF_ERROR(ParseLocation(f, files, &o.file, &o.byte_offset, &o.byte_length,
                                     lenient != nullptr));
    FC_ASSIGN_OR_RETURN(uint64_t sum, ParseHex64(f));
    o.xxh3_64 = sum;
    index.objects.push_back(std::move(o));
  }
  return index;
}

Result<CheckpointIndex> ReadFcDistcp(const std::string& dir, OpenProblems* lenient) {
  const std::string meta_path = JoinPath(dir, std::string(kFcDistcpMetadataFileName));
  if (!IsDirectory(dir)) {
    if (!PathExists(dir)) return NotFoundError(dir + ": no such directory");
    return InvalidArgumentError(dir + ": not a directory (an fc distcp checkpoint is one)");
  }
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> json, ReadWholeFile(meta_path, kMaxMetadataBytes));
  Result<CheckpointIndex> parsed = ParseFcDistcpMetadata(json, dir, lenient);
  if (!parsed.ok()) return std::move(parsed).With(meta_path).status();
  CheckpointIndex index = std::move(*parsed);

  std::vector<std::vector<std::pair<const TensorEntry*, size_t>>> chunks(index.files.size());
  std::vector<std::vector<const ObjectEntry*>> objects(index.files.size());
  for (const TensorEntry& t : index.tensors) {
    for (size_t i = 0; i < t.chunks.size(); ++i) chunks[t.chunks[i].file].emplace_back(&t, i);
  }
  for (const ObjectEntry& o : index.objects) objects[o.file].push_back(&o);
  for (uint32_t f = 0; f < index.files.size(); ++f) {
    FC_RETURN_IF_ERROR(CheckDataFile(index, f, chunks[f], objects[f], lenient));
  }
  return index;
}

}  // namespace fc
