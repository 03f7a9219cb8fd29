// PaddlePaddle FlexCheckpoint reader. Layout and contract: include/fc/format/paddle_flex.h.
//
// Why the data files are parsed at all: paddle.save keeps no offsets anywhere, so the only
// way to find a shard's bytes is to run its pickle. The pickle VM runs over a memory map
// and leaves large bytes payloads in place (PickleLimits::max_inline_bytes), recording
// their offsets: opening a checkpoint touches the opcodes, not the tensor data.
#include "fc/format/paddle_flex.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string_view>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/checked_math.h"
#include "fc/core/dtype.h"
#include "fc/codec/pickle.h"
#include "fc/format/file_names.h"
#include "fc/format/safetensors.h"
#include "fc/io/file.h"

namespace fc {
namespace {

using Kind = PickleValue::Kind;

constexpr std::string_view kCurrentModule = "paddle.distributed.flex_checkpoint.dcp.metadata";
constexpr std::string_view kOlderModule = "paddle.distributed.checkpoint.metadata";

// The attributes of a dataclass instance (NEWOBJ + BUILD with a dict), by name.
using Fields = std::map<std::string, const PickleValue*>;

Result<Fields> ObjectFields(const PickleValue& v, std::string_view cls, const std::string& what) {
  const PickleValue* g = v.CalleeGlobal();
  if ((v.kind != Kind::kObject && v.kind != Kind::kCall) || g == nullptr || g->name != cls ||
      (g->str != kCurrentModule && g->str != kOlderModule)) {
    return DataLossError(what + ": expected a paddle " + std::string(cls) + ", got " +
                         v.DebugString());
  }
  Fields fields;
  if (!v.state) return fields;
  if (v.state->kind != Kind::kDict) {
    return DataLossError(what + ": " + std::string(cls) + " has an unexpected state " +
                         v.DebugString());
  }
  for (const auto& [k, val] : v.state->entries) {
    if (k->kind != Kind::kStr) {
      return DataLossError(what + ": " + std::string(cls) + " has a non-string attribute " +
                           k->DebugString());
    }
    fields[k->str] = val.get();
  }
  return fields;
}

const PickleValue* Get(const Fields& f, const std::string& name) {
  auto it = f.find(name);
  return it == f.end() ? nullptr : it->second;
}

bool IsNone(const PickleValue* v) { return v == nullptr || v->kind == Kind::kNone; }

// A numpy integer scalar (numpy.core.multiarray.scalar(dtype('i8'), <little-endian bytes>)):
// its value, or nullopt when v is not one. The real sharding optimizer of Paddle 3.3
// (DygraphShardingOptimizerV2.sharded_state_dict) builds flattened_range from
// np.int64 buffer offsets, so (start, stop) arrive as numpy scalars, not Python ints.
std::optional<int64_t> NumpyIntScalar(const PickleValue& v) {
  const PickleValue* g = v.CalleeGlobal();
  if (v.kind != Kind::kCall || g == nullptr || g->name != "scalar" ||
      (g->str != "numpy.core.multiarray" && g->str != "numpy._core.multiarray") || !v.args ||
      v.args->kind != Kind::kTuple || v.args->items.size() != 2) {
    return std::nullopt;
  }
  const PickleValue& dt = *v.args->items[0];
  const PickleValue& raw = *v.args->items[1];
  const PickleValue* dg = dt.CalleeGlobal();
  if (dt.kind != Kind::kCall || dg == nullptr || dg->str != "numpy" || dg->name != "dtype" ||
      !dt.args || dt.args->items.empty() || dt.args->items[0]->kind != Kind::kStr ||
      raw.kind != Kind::kBytes) {
    return std::nullopt;
  }
  if (dt.state && dt.state->kind == Kind::kTuple && dt.state->items.size() >= 2 &&
      dt.state->items[1]->kind == Kind::kStr && dt.state->items[1]->str == ">") {
    return std::nullopt;  // big-endian
  }
  const std::string& type = dt.args->items[0]->str;
  if (type.size() != 2 || (type[0] != 'i' && type[0] != 'u') || type[1] < '1' ||
      type[1] > '8' || raw.str.size() != static_cast<size_t>(type[1] - '0') ||
      raw.bytes_length != raw.str.size()) {
    return std::nullopt;
  }
  uint64_t u = 0;
  for (size_t i = raw.str.size(); i-- > 0;) u = (u << 8) | static_cast<unsigned char>(raw.str[i]);
  if (type[0] == 'i' && raw.str.size() < 8 && (u >> (8 * raw.str.size() - 1)) != 0) {
    return -1;  // a negative value of a narrower signed type (refused by the caller)
  }
  if (type[0] == 'u' && u > static_cast<uint64_t>(INT64_MAX)) return -1;
  return static_cast<int64_t>(u);
}

Result<Shape> IntTuple(const PickleValue* v, const std::string& what) {
  if (v == nullptr || (v->kind != Kind::kTuple && v->kind != Kind::kList)) {
    return DataLossError(what + " is not a tuple of integers: " +
                         (v ? v->DebugString() : std::string("missing")));
  }
  Shape out;
  for (const auto& item : v->items) {
    std::optional<int64_t> value;
    if (item->kind == Kind::kInt) value = item->int_value;
    else value = NumpyIntScalar(*item);
    if (!value || *value < 0) {
      return DataLossError(what + " holds " + item->DebugString() + ", not an integer >= 0");
    }
    out.push_back(*value);
  }
  return out;
}

Result<std::optional<FlatRange>> FlatRangeField(const Fields& f, const std::string& what) {
  const PickleValue* flat = Get(f, "is_flattened");
  if (IsNone(flat) || (flat->kind == Kind::kBool && !flat->bool_value)) {
    return std::optional<FlatRange>();
  }
  FC_ASSIGN_OR_RETURN(Shape r, IntTuple(Get(f, "flattened_range"), what + " flattened_range"));
  if (r.size() != 2 || r[0] > r[1]) {
    return DataLossError(what + ": flattened_range " + Box::Whole(r).ToString() +
                         " is not (start, stop) with start <= stop");
  }
  return std::optional<FlatRange>(FlatRange{r[0], r[1]});
}

// One chunk as the metadata describes it.
struct ChunkMeta {
  Shape global_offset;
  Shape local_shape;
  std::optional<FlatRange> flat_range;
  std::optional<DType> dtype;
  std::optional<Shape> global_shape;
};

// Orderable identities (FlatRange has no ordering): no range is (-1, -1).
std::pair<int64_t, int64_t> FlatKey(const std::optional<FlatRange>& r) {
  return r ? std::make_pair(r->inclusive_min, r->exclusive_max) : std::make_pair(-1L, -1L);
}

// Where a chunk is stored: the file, and the replica id (the lowest wins).
struct StorageRef {
  std::string file;
  int64_t replica_id = 0;
  std::optional<Shape> local_shape;  // newer LocalTensorIndex entries carry it
};

std::string ChunkLabel(const std::string& key, const ChunkMeta& c) {
  std::string s = "tensor '" + key + "' chunk at " + Box{c.global_offset, c.local_shape}.ToString();
  if (c.flat_range) s += " range " + c.flat_range->ToString();
  return s;
}

// An ndarray found in a data file: its numpy type, shape, order and where its bytes are.
struct ArrayRef {
  std::string type;  // numpy kind + size, e.g. "f4", "u2"; empty for a safetensors array
  std::optional<DType> safetensors_dtype;  // the dtype of a safetensors array
  Shape shape;
  bool fortran = false;
  uint64_t offset = 0;
  uint64_t length = 0;
};

Result<ArrayRef> ParseNdarray(const PickleValue& v, const std::string& what) {
  const PickleValue* node = &v;
  // Older paddle.save: (name, ndarray).
  if (node->kind == Kind::kTuple && node->items.size() == 2 &&
      node->items[0]->kind == Kind::kStr) {
    node = node->items[1].get();
  }
  const PickleValue* g = node->CalleeGlobal();
  if (node->kind != Kind::kCall || g == nullptr || g->name != "_reconstruct" ||
      (g->str != "numpy.core.multiarray" && g->str != "numpy._core.multiarray") ||
      !node->state || node->state->kind != Kind::kTuple || node->state->items.size() != 5) {
    return DataLossError(what + " is not a numpy array: " + node->DebugString());
  }
  const auto& st = node->state->items;
  ArrayRef a;
  FC_ASSIGN_OR_RETURN(a.shape, IntTuple(st[1].get(), what + " shape"));
  const PickleValue& dt = *st[2];
  const PickleValue* dg = dt.CalleeGlobal();
  if (dt.kind != Kind::kCall || dg == nullptr || dg->str != "numpy" || dg->name != "dtype" ||
      !dt.args || dt.args->items.empty() || dt.args->items[0]->kind != Kind::kStr) {
    return DataLossError(what + ": dtype is not a numpy.dtype: " + dt.DebugString());
  }
  a.type = dt.args->items[0]->str;
  // dtype state: (version, byteorder, ...).
  if (dt.state && dt.state->kind == Kind::kTuple && dt.state->items.size() >= 2 &&
      dt.state->items[1]->kind == Kind::kStr && dt.state->items[1]->str == ">") {
    return UnimplementedError(what + ": big-endian numpy arrays are not supported");
  }
  if (st[3]->kind != Kind::kBool) {
    return DataLossError(what + ": is_fortran is not a bool: " + st[3]->DebugString());
  }
  a.fortran = st[3]->bool_value;
  if (st[4]->kind != Kind::kBytes) {
    return DataLossError(what + ": array data is not a bytes value: " + st[4]->DebugString());
  }
  a.offset = st[4]->bytes_offset;
  a.length = st[4]->bytes_length;
  return a;
}

// numpy type string (without byte order) -> fc dtype; bfloat16 travels as u2.
Result<DType> NumpyDType(const std::string& type, std::optional<DType> declared,
                         const std::string& what) {
  static const std::map<std::string, DType> kTypes = {
      {"b1", DType::kBool},    {"u1", DType::kUInt8},   {"i1", DType::kInt8},
      {"i2", DType::kInt16},   {"i4", DType::kInt32},   {"i8", DType::kInt64},
      {"f2", DType::kFloat16}, {"f4", DType::kFloat32}, {"f8", DType::kFloat64},
      {"u4", DType::kUInt32},  {"u8", DType::kUInt64},  {"c8", DType::kComplex64}};
  // '<u2' carries bfloat16 bits; it is uint16 only where the metadata says so.
  if (type == "u2" && declared && *declared == DType::kBFloat16) return DType::kBFloat16;
  if (type == "u2" && declared && *declared == DType::kUInt16) return DType::kUInt16;
  auto it = kTypes.find(type);
  if (it == kTypes.end()) {
    return UnimplementedError(what + ": numpy type '" + type + "' has no fc dtype");
  }
  if (declared && *declared != it->second) {
    return DataLossError(what + ": the metadata says " + std::string(DTypeName(*declared)) +
                         ", the array is numpy '" + type + "'");
  }
  return it->second;
}

// The dtype of a safetensors array against the metadata's: they must agree, except that
// bfloat16 saved through numpy arrives as U16 (Paddle's own safetensors mapping reads U16 as
// bfloat16 too).
Result<DType> SafetensorsArrayDType(DType stored, std::optional<DType> declared,
                                    const std::string& what) {
  if (!declared) return stored;
  if (stored == DType::kUInt16 && *declared == DType::kBFloat16) return DType::kBFloat16;
  if (stored != *declared) {
    return DataLossError(what + ": the metadata says " + std::string(DTypeName(*declared)) +
                         ", the safetensors array is " +
                         std::string(DTypeSafetensorsName(stored)));
  }
  return stored;
}

// "<id>.metadata" with a decimal id. (Names are matched by hand, not with std::regex: a
// storage-key file name comes from the metadata, and std::regex recursed once per character;
// a 30k-character name overflowed the stack.)
bool IsMetadataName(std::string_view n) { return MatchNumberedName(n, "#.metadata").has_value(); }

// "<rank>_<id>.distcp" (paddle.save pickles) or "<rank>_<id>.safetensors"
// (save_state_dict(..., safetensors=True), Paddle 3.3's name for its safetensors data files)
// with decimal rank and id: the id, or nullopt.
std::optional<uint64_t> DataFileId(std::string_view n) {
  std::optional<NumberedName> m = MatchNumberedName(n, "#_#.distcp");
  if (!m) m = MatchNumberedName(n, "#_#.safetensors");
  if (!m) return std::nullopt;
  return (*m)[1];
}

// The metadata file to read among `names` (the files of `dir`): the only <id>.metadata, or
// Paddle's unique_id's, the largest id among the data files.
Result<std::string> ChooseMetadata(const std::string& dir, const std::vector<std::string>& names) {
  std::vector<std::string> metas;
  for (const std::string& n : names) {
    if (IsMetadataName(n)) metas.push_back(n);
  }
  if (metas.empty()) return NotFoundError(dir + ": no <id>.metadata file");
  // Paddle's unique_id: the largest id among the data files.
  int64_t unique_id = -1;
  for (const std::string& n : names) {
    if (std::optional<uint64_t> id = DataFileId(n)) {
      unique_id = std::max(unique_id, static_cast<int64_t>(*id));  // < 1e18: fits
    }
  }
  std::string meta_name = metas.size() == 1 ? metas.front() : std::string();
  if (unique_id >= 0 && PathExists(JoinPath(dir, std::to_string(unique_id) + ".metadata"))) {
    meta_name = std::to_string(unique_id) + ".metadata";
  }
  if (meta_name.empty()) {
    return DataLossError(dir + ": several <id>.metadata files and " +
                         (unique_id < 0 ? std::string("no data file to pick one by")
                                        : "none for the data files' id " +
                                              std::to_string(unique_id)));
  }
  return meta_name;
}

// storage_metadata: (key, offset, flat range) -> file of the lowest replica.
using StorageKey = std::tuple<std::string, Shape, std::pair<int64_t, int64_t>>;
using StorageMap = std::map<StorageKey, StorageRef>;

Result<StorageMap> ReadStorageMetadata(const PickleValue& storage, const std::string& meta_path) {
  StorageMap where;
  for (const auto& [k, v] : storage.entries) {
    const std::string what = meta_path + ": storage_metadata key " + k->DebugString(80);
    FC_ASSIGN_OR_RETURN(Fields idx, ObjectFields(*k, "LocalTensorIndex", what));
    const PickleValue* key = Get(idx, "tensor_key");
    if (key == nullptr || key->kind != Kind::kStr) return DataLossError(what + ": no tensor_key");
    FC_ASSIGN_OR_RETURN(Shape offset, IntTuple(Get(idx, "global_offset"), what + " global_offset"));
    FC_ASSIGN_OR_RETURN(std::optional<FlatRange> flat, FlatRangeField(idx, what));
    if (v->kind != Kind::kStr || !DataFileId(v->str)) {
      return DataLossError(what + ": file name " + v->DebugString(80) +
                           " is not <rank>_<id>.distcp or <rank>_<id>.safetensors");
    }
    const PickleValue* replica = Get(idx, "replica_id");
    if (!IsNone(replica) && replica->kind != Kind::kInt) {
      return DataLossError(what + ": replica_id " + replica->DebugString() + " is not an integer");
    }
    const int64_t replica_id = IsNone(replica) ? 0 : replica->int_value;
    std::optional<Shape> local_shape;
    if (!IsNone(Get(idx, "local_shape"))) {
      FC_ASSIGN_OR_RETURN(local_shape, IntTuple(Get(idx, "local_shape"), what + " local_shape"));
    }
    StorageKey sk{key->str, offset, FlatKey(flat)};
    auto it = where.find(sk);
    if (it == where.end() || replica_id < it->second.replica_id) {
      where[sk] = {v->str, replica_id, local_shape};
    }
  }
  return where;
}

// A tensor of state_dict_metadata: its chunks and the file each lives in.
struct Pending {
  std::vector<ChunkMeta> chunks;
  std::vector<std::string> files;
  std::optional<DType> dtype;
  std::optional<Shape> global_shape;
};

// One LocalTensorMetadata `item` of tensor `key`, added to `p` unless another rank listed
// the same chunk (`seen_chunks`).
Status AddChunkMeta(const PickleValue* item, const std::string& key, const StorageMap& where,
                    const std::string& meta_path,
                    std::set<std::tuple<Shape, Shape, std::pair<int64_t, int64_t>>>& seen_chunks,
                    Pending& p) {
  const std::string what = meta_path + ": tensor '" + key + "'";
  FC_ASSIGN_OR_RETURN(Fields f, ObjectFields(*item, "LocalTensorMetadata", what));
  ChunkMeta c;
  FC_ASSIGN_OR_RETURN(c.global_offset, IntTuple(Get(f, "global_offset"), what + " global_offset"));
  FC_ASSIGN_OR_RETURN(c.local_shape, IntTuple(Get(f, "local_shape"), what + " local_shape"));
  if (c.global_offset.size() != c.local_shape.size()) {
    return DataLossError(what + ": global_offset " + Box::Whole(c.global_offset).ToString() +
                         " and local_shape " + Box::Whole(c.local_shape).ToString() +
                         " differ in rank");
  }
  FC_ASSIGN_OR_RETURN(c.flat_range, FlatRangeField(f, what));
  const PickleValue* dt = Get(f, "dtype");
  if (!IsNone(dt)) {
    if (dt->kind != Kind::kStr) return DataLossError(what + ": dtype is not a string");
    Result<DType> parsed = ParseDType(dt->str);
    if (!parsed.ok()) {
      return UnimplementedError(what + ": dtype '" + dt->str + "' has no fc type");
    }
    if (p.dtype && *p.dtype != *parsed) {
      return DataLossError(what + ": chunks disagree on the dtype (" +
                           std::string(DTypeName(*p.dtype)) + " and " + dt->str + ")");
    }
    p.dtype = *parsed;
  }
  const PickleValue* gs = Get(f, "global_shape");
  if (!IsNone(gs)) {
    FC_ASSIGN_OR_RETURN(Shape shape, IntTuple(gs, what + " global_shape"));
    if (p.global_shape && *p.global_shape != shape) {
      return DataLossError(what + ": chunks disagree on the global shape");
    }
    p.global_shape = shape;
  }
  if (!seen_chunks.insert({c.global_offset, c.local_shape, FlatKey(c.flat_range)}).second) {
    return Status::Ok();  // listed by several ranks
  }
  auto it = where.find(StorageKey{key, c.global_offset, FlatKey(c.flat_range)});
  if (it == where.end()) {
    return DataLossError(meta_path + ": " + ChunkLabel(key, c) +
                         " has no entry in storage_metadata");
  }
  if (it->second.local_shape && *it->second.local_shape != c.local_shape) {
    return DataLossError(meta_path + ": " + ChunkLabel(key, c) + ": storage_metadata gives "
                         "it local_shape " + Box::Whole(*it->second.local_shape).ToString());
  }
  p.files.push_back(it->second.file);
  p.chunks.push_back(std::move(c));
  return Status::Ok();
}

// state_dict_metadata: each tensor's chunks, in the metadata's order.
Result<std::vector<std::pair<std::string, Pending>>> ReadTensorMetadata(
    const PickleValue& sdm, const StorageMap& where, const std::string& meta_path) {
  std::vector<std::pair<std::string, Pending>> pending;
  std::set<std::string> seen_keys;
  for (const auto& [k, list] : sdm.entries) {
    if (k->kind != Kind::kStr) {
      return DataLossError(meta_path + ": state_dict_metadata key " + k->DebugString() +
                           " is not a string");
    }
    const std::string& key = k->str;
    if (!seen_keys.insert(key).second) {
      return DataLossError(meta_path + ": tensor '" + key + "' is listed twice");
    }
    if (list->kind != Kind::kList && list->kind != Kind::kTuple) {
      return DataLossError(meta_path + ": tensor '" + key + "': expected a list of "
                           "LocalTensorMetadata, got " + list->DebugString());
    }
    Pending p;
    std::set<std::tuple<Shape, Shape, std::pair<int64_t, int64_t>>> seen_chunks;
    for (const auto& item : list->items) {
      FC_RETURN_IF_ERROR(AddChunkMeta(item.get(), key, where, meta_path, seen_chunks, p));
    }
    pending.emplace_back(key, std::move(p));
  }
  return pending;
}

// The arrays of each data file that the metadata places there, by file and key.
using ArraysByFile = std::map<std::string, std::map<std::string, ArrayRef>>;

// The data files: each parsed once, the arrays the metadata places there located. Lists
// the files in `index` and their numbers in `file_index`.
Result<ArraysByFile> LocateArrays(const std::string& dir,
                                  const std::vector<std::pair<std::string, Pending>>& pending,
                                  std::map<std::string, uint32_t>* file_index_out,
                                  CheckpointIndex* index_out) {
  std::map<std::string, uint32_t>& file_index = *file_index_out;
  CheckpointIndex& index = *index_out;
  std::map<std::string, std::set<std::string>> wanted;  // file -> tensor keys
  for (const auto& [key, p] : pending) {
    for (const std::string& name : p.files) wanted[name].insert(key);
  }
  std::map<std::string, std::map<std::string, ArrayRef>> arrays;
  for (const auto& [key, p] : pending) {
    for (const std::string& name : p.files) {
      if (arrays.count(name)) continue;
      const std::string path = JoinPath(dir, name);
      FC_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
      const std::span<const std::byte> head = mapped->bytes().first(
          std::min<size_t>(9, mapped->bytes().size()));
      std::map<std::string, ArrayRef>& found = arrays[name];
      if (head.size() == 9 && head[0] != std::byte{0x80} && head[8] == std::byte{'{'}) {
        // save_state_dict(..., safetensors=True): the data file is a safetensors file.
        FC_ASSIGN_OR_RETURN(SafetensorsHeader h,
                            ParseSafetensorsHeader(mapped->bytes(), mapped->bytes().size())
                                .With(path));
        for (const SafetensorsTensorInfo& t : h.tensors) {
          if (!wanted[name].count(t.name)) continue;
          ArrayRef a;
          a.safetensors_dtype = t.dtype;
          a.shape = t.shape;
          a.offset = h.data_start() + t.begin;
          a.length = t.byte_length();
          found[t.name] = std::move(a);
        }
        file_index[name] = static_cast<uint32_t>(index.files.size());
        index.files.push_back({name, static_cast<uint64_t>(mapped->bytes().size())});
        continue;
      }
      PickleLimits limits;
      limits.max_inline_bytes = 256;
      FC_ASSIGN_OR_RETURN(PickleValue data, ParsePickle(mapped->bytes(), limits).With(path));
      if (data.kind != Kind::kDict) {
        return DataLossError(path + ": expected a dict of arrays, got " + data.DebugString());
      }
      for (const auto& [k, v] : data.entries) {
        // Other values (the name table, counters) are not tensors of the metadata.
        if (k->kind != Kind::kStr || !wanted[name].count(k->str)) continue;
        FC_ASSIGN_OR_RETURN(found[k->str], ParseNdarray(*v, path + ": '" + k->str + "'"));
      }
      file_index[name] = static_cast<uint32_t>(index.files.size());
      index.files.push_back({name, static_cast<uint64_t>(mapped->bytes().size())});
    }
  }
  return arrays;
}

// The chunk that array `a` (in file number `file`) holds for chunk `c` of a tensor whose
// metadata is `p`: its dtype checked against the tensor's `*t_dtype`, which the `first`
// chunk sets; `label` names it in messages.
Result<Chunk> ArrayChunk(const ArrayRef& a, const ChunkMeta& c, const Pending& p,
                         uint32_t file, bool first, const std::string& label, DType* t_dtype) {
  DType dtype;
  if (a.safetensors_dtype) {
    FC_ASSIGN_OR_RETURN(dtype, SafetensorsArrayDType(*a.safetensors_dtype, p.dtype, label));
  } else {
    // The type string: optional byte order, then kind and size ("<f4", "|b1", "u2").
    const size_t kind_at = a.type.find_first_not_of("<>|=");
    if (kind_at == std::string::npos || a.type.find('>') != std::string::npos) {
      return DataLossError(label + ": numpy type '" + a.type + "' is not a little-endian " +
                           "kind and size");
    }
    FC_ASSIGN_OR_RETURN(dtype, NumpyDType(a.type.substr(kind_at), p.dtype, label));
  }
  if (first) *t_dtype = dtype;
  if (dtype != *t_dtype) return DataLossError(label + ": arrays of one tensor differ in dtype");
  Chunk chunk;
  chunk.box = Box{c.global_offset, c.local_shape};
  chunk.flat_range = c.flat_range;
  chunk.file = file;
  chunk.byte_offset = a.offset;
  chunk.byte_length = a.length;
  const Shape want_shape = c.flat_range ? Shape{c.flat_range->size()} : c.local_shape;
  if (a.shape != want_shape) {
    return DataLossError(label + ": the array has shape " + Box::Whole(a.shape).ToString() +
                         ", expected " + Box::Whole(want_shape).ToString());
  }
  FC_ASSIGN_OR_RETURN(uint64_t bytes,
                      CheckedByteSize(want_shape, DTypeSize(dtype)).With(label));
  if (bytes != a.length) {
    return DataLossError(label + ": the array holds " + std::to_string(a.length) +
                         " bytes, its shape needs " + std::to_string(bytes));
  }
  if (a.fortran && !c.flat_range && want_shape.size() > 1) {
    // Column-major: the first index moves fastest.
    chunk.strides.resize(want_shape.size());
    int64_t stride = 1;
    for (size_t d = 0; d < want_shape.size(); ++d) {
      chunk.strides[d] = stride;
      stride *= want_shape[d];
    }
  }
  return chunk;
}

// The global shape of a tensor whose metadata has none: its chunks' bounding box.
Status BoundingShape(const std::string& meta_path, const std::string& key, TensorEntry* t) {
  for (const Chunk& c : t->chunks) {
    if (t->global_shape.empty()) t->global_shape.assign(c.box.rank(), 0);
    if (c.box.rank() != t->global_shape.size()) {
      return DataLossError(meta_path + ": tensor '" + key + "' has chunks of different ranks");
    }
    for (size_t d = 0; d < c.box.rank(); ++d) {
      int64_t end = 0;
      if (__builtin_add_overflow(c.box.global_offset[d], c.box.local_shape[d], &end)) {
        return DataLossError(meta_path + ": tensor '" + key + "' chunk " + c.box.ToString() +
                             " ends beyond 64-bit offsets");
      }
      t->global_shape[d] = std::max(t->global_shape[d], end);
    }
  }
  return Status::Ok();
}

// Tensor `key` from its metadata `p` and the located arrays.
Result<TensorEntry> BuildTensor(const std::string& dir, const std::string& meta_path,
                                const std::string& key, const Pending& p,
                                ArraysByFile& arrays,
                                const std::map<std::string, uint32_t>& file_index) {
  TensorEntry t;
  t.key = key;
  t.dtype = p.dtype.value_or(DType::kFloat32);
  std::set<std::string> files_used;  // paddle writes at most one chunk of a key per file
  for (size_t i = 0; i < p.chunks.size(); ++i) {
    const ChunkMeta& c = p.chunks[i];
    const std::string& name = p.files[i];
    const std::string label = JoinPath(dir, name) + ": " + ChunkLabel(key, c);
    // Sizes from the file are checked before anything multiplies them.
    FC_RETURN_IF_ERROR_WITH(CheckedNumElements(c.local_shape).status(), label);
    if (!files_used.insert(name).second) {
      return DataLossError(label + ": a second chunk of '" + key + "' placed in the same file "
                           "(each file holds one array per key)");
    }
    auto it = arrays[name].find(key);
    if (it == arrays[name].end()) {
      return DataLossError(label + ": the file holds no array '" + key + "'");
    }
    FC_ASSIGN_OR_RETURN(Chunk chunk, ArrayChunk(it->second, c, p, file_index.at(name),
                                                t.chunks.empty(), label, &t.dtype));
    t.chunks.push_back(std::move(chunk));
  }
  if (p.global_shape) {
    t.global_shape = *p.global_shape;
  } else {
    FC_RETURN_IF_ERROR(BoundingShape(meta_path, key, &t));
  }
  FC_RETURN_IF_ERROR_WITH(CheckedNumElements(t.global_shape).status(),
                          meta_path + ": tensor '" + key + "'");
  for (const Chunk& c : t.chunks) {
    FC_RETURN_IF_ERROR_WITH(ValidateBox(c.box, t.global_shape),
                            meta_path + ": tensor '" + key + "'");
    if (c.flat_range && c.flat_range->exclusive_max > c.box.num_elements()) {
      return DataLossError(meta_path + ": tensor '" + key + "': flattened range " +
                           c.flat_range->ToString() + " passes the end of its block " +
                           c.box.ToString());
    }
  }
  return t;
}

}  // namespace

Result<CheckpointIndex> ReadPaddleFlexCheckpoint(const std::string& dir) {
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  FC_ASSIGN_OR_RETURN(const std::string meta_name, ChooseMetadata(dir, names));
  const std::string meta_path = JoinPath(dir, meta_name);
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> meta_bytes, ReadWholeFile(meta_path, 1ull << 30));
  FC_ASSIGN_OR_RETURN(PickleValue root, ParsePickle(meta_bytes).With(meta_path));
  FC_ASSIGN_OR_RETURN(Fields md, ObjectFields(root, "Metadata", meta_path));
  const PickleValue* sdm = Get(md, "state_dict_metadata");
  const PickleValue* storage = Get(md, "storage_metadata");
  if (sdm == nullptr || sdm->kind != Kind::kDict || storage == nullptr ||
      storage->kind != Kind::kDict) {
    return DataLossError(meta_path + ": Metadata lacks the state_dict_metadata and "
                         "storage_metadata dicts");
  }
  const bool older = root.CalleeGlobal()->str == kOlderModule;
  FC_ASSIGN_OR_RETURN(const StorageMap where, ReadStorageMetadata(*storage, meta_path));

  CheckpointIndex index;
  index.format = CheckpointFormat::kPaddleFlex;
  index.root = dir;
  index.attributes["paddle_metadata"] = meta_name;
  index.attributes["paddle_metadata_module"] = std::string(older ? kOlderModule : kCurrentModule);
  FC_ASSIGN_OR_RETURN(auto pending, ReadTensorMetadata(*sdm, where, meta_path));
  std::map<std::string, uint32_t> file_index;
  FC_ASSIGN_OR_RETURN(ArraysByFile arrays, LocateArrays(dir, pending, &file_index, &index));
  for (auto& [key, p] : pending) {
    FC_ASSIGN_OR_RETURN(TensorEntry t, BuildTensor(dir, meta_path, key, p, arrays, file_index));
    index.tensors.push_back(std::move(t));
  }
  return index;
}

}  // namespace fc
