// TorchDcpWriter: plan validation, item layout, tensor archives, .metadata, atomic commit.
// Layout and contract: include/fc/format/torch_dcp_writer.h.
//
// Why every item's size is computed up front: a DCP tensor item is a torch.save zip whose
// only variable parts are data.pkl (a function of dtype and chunk shape) and the storage
// record (numel * itemsize), so the whole file layout follows from the plan. That lets
// WriteChunk pwrite tensor bytes to their final place from any thread in any order, and
// leaves Finish only the small headers (a few hundred bytes per chunk) to write.
//
// Why the CRCs are combined rather than re-read: the data/0 CRC is needed in the data
// descriptor and central directory after the data. Each slab is CRC'd while it is still in
// the caller's (hot) buffer, and touching slabs merge with crc32_combine (O(log n)), so the
// written ranges of a chunk collapse to one range with one CRC; Finish reads nothing back.
#include "fc/format/torch_dcp_writer.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "fc/core/checked_math.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"
#include "fc/codec/json_writer.h"
#include "fc/codec/pickle_writer.h"
#include "src/format/torch/torch_save_writer.h"
#include "fc/codec/zip_writer.h"

namespace fc {
namespace {

using internal_torch::Crc32;
using internal_torch::Crc32Combine;
using internal_torch::PickleWriter;
using internal_torch::TensorArchive;

std::string Quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string Range(uint64_t a, uint64_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

std::string ChunkLabel(const FcDistcpFileSpec& file, const FcDistcpChunkSpec& c) {
  return file.name + ": tensor " + Quoted(c.key) + " chunk " +
         (c.box.global_offset.size() == c.box.local_shape.size() ? c.box.ToString()
                                                                  : std::string("(bad box)"));
}

std::string ObjectLabel(const FcDistcpFileSpec& file, const FcDistcpObjectSpec& o) {
  return file.name + ": object " + Quoted(o.key);
}

// "__<rank>_<n>.distcp" with canonical decimals (no sign, no leading zeros).
bool IsDcpFileName(std::string_view name) {
  if (name.size() < 12 || !name.starts_with("__") || !name.ends_with(".distcp")) return false;
  std::string_view s = name.substr(2, name.size() - 2 - 7);
  const size_t us = s.find('_');
  if (us == std::string_view::npos) return false;
  auto canonical = [](std::string_view d) {
    if (d.empty() || d.size() > 18) return false;
    if (d.size() > 1 && d[0] == '0') return false;
    return std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return canonical(s.substr(0, us)) && canonical(s.substr(us + 1));
}

// IsValidUtf8: fc/codec/json_writer.h (Python's decoder's rules).

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// The replica-0 chunks of one tensor must tile it: pairwise disjoint and together exactly as
// large as the tensor. Disjointness is a sweep over axis 0: only chunks whose axis-0 ranges
// meet are compared (n log n for row splits; quadratic only when every chunk spans axis 0).
Status CheckTiling(const FcDistcpTensorSpec& t, std::vector<const FcDistcpChunkSpec*> chunks,
                   int64_t numel) {
  // Sorted by offsets (lexicographic, so by the axis-0 offset first): equal offsets are
  // neighbours (in plan order), and the overlap scan below can stop at the first chunk past a box's end.
  // (No set of offset copies: a plan may hold millions of chunks.)
  std::stable_sort(chunks.begin(), chunks.end(), [](const auto* a, const auto* b) {
    return a->box.global_offset < b->box.global_offset;
  });
  int64_t volume = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const FcDistcpChunkSpec* c = chunks[i];
    if (i > 0 && chunks[i - 1]->box.global_offset == c->box.global_offset) {
      return InvalidArgumentError("tensor " + Quoted(t.key) + ": two chunks start at " +
                                  c->box.ToString());
    }
    // Each box fits in the tensor, so only a sum of many overlapping boxes can overflow.
    volume = CheckedAdd(volume, c->box.num_elements()).value_or(INT64_MAX);
  }
  if (!t.global_shape.empty()) {
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i]->box.empty()) continue;
      for (size_t j = i + 1; j < chunks.size(); ++j) {
        if (chunks[j]->box.global_offset[0] >= chunks[i]->box.exclusive_max(0)) break;
        if (chunks[j]->box.empty()) continue;
        if (Intersect(chunks[i]->box, chunks[j]->box)) {
          return InvalidArgumentError("tensor " + Quoted(t.key) + ": chunks " +
                                      chunks[i]->box.ToString() + " and " +
                                      chunks[j]->box.ToString() +
                                      " overlap (DCP stores each element once)");
        }
      }
    }
  }
  if (volume != numel) {
    return InvalidArgumentError("tensor " + Quoted(t.key) + ": its chunks with replica_id 0 hold " +
                                std::to_string(volume) + " of " + std::to_string(numel) +
                                " elements (DCP chunks must cover the tensor exactly)");
  }
  return Status::Ok();
}

// Generation-dependent module paths (formats.md 2.3).
struct Modules {
  std::string_view metadata, properties, mem_format, filesystem;
};
Modules ModulesFor(TorchGeneration g) {
  if (g == TorchGeneration::k1_13) {
    return {"torch.distributed._shard.checkpoint.metadata",
            "torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING",
            "torch.distributed._shard.checkpoint.filesystem"};
  }
  if (g == TorchGeneration::k2_0) {
    // TensorProperties under its 2.0-2.2 home, which every later release still resolves
    // (torch's test_compatibility.py::test_sharded_tensor_dependency).
    return {"torch.distributed.checkpoint.metadata",
            "torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING",
            "torch.distributed.checkpoint.filesystem"};
  }
  return {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.metadata",
          "_MEM_FORMAT_ENCODING", "torch.distributed.checkpoint.filesystem"};
}

// Emits n dict entries (each pushes key, value) the way CPython batches them: MARK ...
// SETITEMS per 1000, a lone trailing entry with SETITEM.
template <typename F>
void EmitDictItems(PickleWriter& w, size_t n, F&& emit) {
  for (size_t b = 0; b < n; b += PickleWriter::kBatchSize) {
    const size_t e = std::min(n, b + PickleWriter::kBatchSize);
    if (e - b > 1) w.Mark();
    for (size_t i = b; i < e; ++i) emit(i);
    if (e - b > 1) {
      w.SetItems();
    } else {
      w.SetItem();
    }
  }
}
template <typename F>
void EmitListItems(PickleWriter& w, size_t n, F&& emit) {
  for (size_t b = 0; b < n; b += PickleWriter::kBatchSize) {
    const size_t e = std::min(n, b + PickleWriter::kBatchSize);
    if (e - b > 1) w.Mark();
    for (size_t i = b; i < e; ++i) emit(i);
    if (e - b > 1) {
      w.Appends();
    } else {
      w.Append();
    }
  }
}

// torch.Size((d0, ...)): REDUCE(torch.Size, ((d0, ...),)).
void EmitTorchSize(PickleWriter& w, std::span<const int64_t> dims) {
  w.Global("torch", "Size");
  if (dims.empty()) {
    w.EmptyTuple();
  } else {
    if (dims.size() > 3) w.Mark();
    for (int64_t d : dims) w.Int(d);
    w.TupleOf(dims.size());
  }
  w.TupleOf(1).Reduce();
}

// A random id in str(uuid.uuid4()) form ("xxxxxxxx-xxxx-4xxx-Vxxx-xxxxxxxxxxxx", V in 8-b),
// what FileSystemWriter stores as storage_meta.save_id.
std::string RandomUuid4() {
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 32; ++i) {
    unsigned nibble = rd() & 15;
    if (i == 12) nibble = 4;                 // version 4
    if (i == 16) nibble = 8 | (nibble & 3);  // RFC 4122 variant
    if (i == 8 || i == 12 || i == 16 || i == 20) out.push_back('-');
    out.push_back(kHex[nibble]);
  }
  return out;
}

// pathlib.PurePosixPath(path).parts: "/" first for an absolute path, then the non-empty,
// non-"." components ("a//b/./c" -> a, b, c; "" -> none, which is Path(".")).
std::vector<std::string> PosixPathParts(std::string_view path) {
  std::vector<std::string> parts;
  if (!path.empty() && path.front() == '/') {
    // POSIX keeps exactly two leading slashes; one or three and more are one root.
    parts.push_back(path.size() >= 2 && path[1] == '/' && (path.size() == 2 || path[2] != '/')
                        ? "//"
                        : "/");
  }
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    std::string_view part = path.substr(i, j - i);
    if (!part.empty() && part != ".") parts.emplace_back(part);
    i = j + 1;
  }
  return parts;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Validation and layout.

Status ValidateTorchDcpPlan(const FcDistcpPlan& plan, TorchDcpWriteOptions options) {
  std::unordered_map<std::string, size_t> tensor_index;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const FcDistcpTensorSpec& t = plan.tensors[i];
    if (t.key.empty() || !IsValidUtf8(t.key)) {
      return InvalidArgumentError("tensor key " + Quoted(t.key) + " is empty or not UTF-8");
    }
    if (!tensor_index.emplace(t.key, i).second) {
      return InvalidArgumentError("tensor " + Quoted(t.key) + " is listed twice");
    }
    if (IsPacked(t.dtype)) {
      return InvalidArgumentError("tensor " + Quoted(t.key) + ": dtype " +
                                  std::string(DTypeName(t.dtype)) + " (safetensors " +
                                  std::string(DTypeSafetensorsName(t.dtype)) +
                                  ") cannot be written to torch DCP by fc");
    }
    if (options.generation == TorchGeneration::k1_13 &&
        internal_torch::UsesRebuildTensorV3(t.dtype)) {
      return InvalidArgumentError("tensor " + Quoted(t.key) + ": torch 1.13 has no dtype " +
                                  std::string(DTypeName(t.dtype)));
    }
    auto bytes = CheckedByteSize(t.global_shape, DTypeSize(t.dtype));
    if (!bytes.ok()) return InvalidArgumentError("tensor " + Quoted(t.key) + ": " +
                                                 bytes.status().message());
  }
  std::unordered_set<std::string> names;
  std::unordered_set<std::string> object_keys;
  std::vector<std::vector<const FcDistcpChunkSpec*>> stored(plan.tensors.size());
  for (const FcDistcpFileSpec& f : plan.files) {
    if (!IsDcpFileName(f.name)) {
      return InvalidArgumentError("file name " + Quoted(f.name) +
                                  " is not of the form __<rank>_<n>.distcp");
    }
    if (!names.insert(f.name).second) {
      return InvalidArgumentError("file " + Quoted(f.name) + " is listed twice");
    }
    for (const FcDistcpChunkSpec& c : f.chunks) {
      // Built only for an error: a plan may hold millions of chunks.
      auto label = [&] { return ChunkLabel(f, c); };
      auto it = tensor_index.find(c.key);
      if (it == tensor_index.end()) {
        return InvalidArgumentError(label() + ": no such tensor in the plan");
      }
      const FcDistcpTensorSpec& t = plan.tensors[it->second];
      if (c.flat_range) {
        return InvalidArgumentError(label() + ": has a flattened range " +
                                    c.flat_range->ToString() +
                                    "; torch DCP stores whole n-d boxes only");
      }
      if (c.replica_id < 0) {
        return InvalidArgumentError(label() + ": replica_id " + std::to_string(c.replica_id) +
                                    " < 0");
      }
      if (Status s = ValidateBox(c.box, t.global_shape); !s.ok()) {
        return InvalidArgumentError(label() + ": " + s.message());
      }
      if (c.replica_id == 0) stored[it->second].push_back(&c);
    }
    if (options.serialization == TorchDcpSerialization::kSafetensors) {
      if (options.generation != TorchGeneration::k2) {
        return InvalidArgumentError(
            "the SAFETENSORS serialization exists in torch 2.8+ only (generation 2)");
      }
      std::unordered_set<std::string_view> in_file;
      for (const FcDistcpChunkSpec& c : f.chunks) {
        if (c.replica_id == 0 && !in_file.insert(c.key).second) {
          return InvalidArgumentError(ChunkLabel(f, c) + ": a second chunk of its tensor in " +
                                      "this file; the SAFETENSORS serialization keys the " +
                                      "file's blob by fqn (one chunk per tensor per file)");
        }
      }
    }
    for (const FcDistcpObjectSpec& o : f.objects) {
      const std::string label = ObjectLabel(f, o);
      if (o.key.empty() || !IsValidUtf8(o.key)) {
        return InvalidArgumentError(label + ": key is empty or not UTF-8");
      }
      if (o.encoding != ObjectEncoding::kTorchSave) {
        return InvalidArgumentError(label + ": encoding " +
                                    std::string(ObjectEncodingName(o.encoding)) +
                                    "; torch DCP BYTE_IO items must be torch.save archives");
      }
      if (o.byte_length < 4) {
        return InvalidArgumentError(label + ": " + std::to_string(o.byte_length) +
                                    " bytes cannot be a torch.save archive");
      }
      if (tensor_index.count(o.key) > 0) {
        return InvalidArgumentError(label + ": a tensor has the same key (DCP fqns are unique)");
      }
      if (!object_keys.insert(o.key).second) {
        return InvalidArgumentError(label + ": the key is used twice");
      }
    }
  }
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const FcDistcpTensorSpec& t = plan.tensors[i];
    FC_ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(t.global_shape));
    FC_RETURN_IF_ERROR(CheckTiling(t, stored[i], numel));
  }
  return Status::Ok();
}

namespace {

// SerializationFormat.SAFETENSORS: after the objects (ending at `blob_start`), one
// safetensors blob of the file's stored chunks keyed by fqn, in plan order, header padded
// with spaces to a multiple of 8, __metadata__ {DCP_SHARDING_INFO, DCP_VERSION "1.0",
// format "pt"}. Items: offset = blob start, length = data bytes (as torch records them).
Status LayOutSafetensorsBlob(const FcDistcpFileSpec& spec,
                             const std::unordered_map<std::string, DType>& dtypes,
                             uint64_t blob_start, TorchDcpFileLayout* layout) {
  // json.dumps with Python's default separators, as torch writes it.
  JsonWriter sharding(JsonWriter::Style::kPretty);
  sharding.BeginObject(true);
  for (const FcDistcpChunkSpec& c : spec.chunks) {
    if (c.replica_id > 0) continue;
    sharding.Key(c.key).BeginObject(true).Key("saved_offsets").BeginArray(true);
    for (int64_t o : c.box.global_offset) sharding.Int(o);
    sharding.EndArray().EndObject();
  }
  sharding.EndObject();
  JsonWriter h;
  h.BeginObject().Key("__metadata__").BeginObject();
  h.Key("DCP_SHARDING_INFO").String(sharding.str());
  h.Key("DCP_VERSION").String("1.0").Key("format").String("pt").EndObject();
  uint64_t begin = 0;
  std::vector<uint64_t> begins;
  for (const FcDistcpChunkSpec& c : spec.chunks) {
    const DType dtype = dtypes.at(c.key);
    const uint64_t bytes = static_cast<uint64_t>(c.box.num_elements()) * DTypeSize(dtype);
    begins.push_back(begin);
    if (c.replica_id > 0) continue;
    h.Key(c.key).BeginObject().Key("dtype").String(DTypeSafetensorsName(dtype));
    h.Key("shape").BeginArray();
    for (int64_t d : c.box.local_shape) h.Int(d);
    h.EndArray().Key("data_offsets").BeginArray().Uint(begin).Uint(begin + bytes).EndArray();
    h.EndObject();
    begin += bytes;
  }
  h.EndObject();
  std::string json = h.Take();
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t data_start = blob_start + 8 + json.size();
  for (size_t i = 0; i < spec.chunks.size(); ++i) {
    const FcDistcpChunkSpec& c = spec.chunks[i];
    TorchDcpItemPlacement p;
    p.data_length = static_cast<uint64_t>(c.box.num_elements()) * DTypeSize(dtypes.at(c.key));
    p.written = c.replica_id == 0;
    if (p.written) {
      p.item_offset = blob_start;
      p.item_length = p.data_length;
      p.data_offset = data_start + begins[i];
    }
    layout->chunks.push_back(p);
  }
  auto end = CheckedAddU(data_start, begin);
  if (!end || *end > (uint64_t{1} << 62)) {
    return InvalidArgumentError(spec.name + ": file offsets overflow");
  }
  layout->blob_offset = blob_start;
  layout->blob_header.resize(8 + json.size());
  for (int k = 0; k < 8; ++k) {
    layout->blob_header[k] = static_cast<char>((json.size() >> (8 * k)) & 0xff);
  }
  std::copy(json.begin(), json.end(), layout->blob_header.begin() + 8);
  layout->file_size = *end;
  return Status::Ok();
}

}  // namespace

Result<std::vector<TorchDcpFileLayout>> ComputeTorchDcpLayouts(const FcDistcpPlan& plan,
                                                               TorchDcpWriteOptions options) {
  FC_RETURN_IF_ERROR(ValidateTorchDcpPlan(plan, options));
  std::unordered_map<std::string, DType> dtypes;
  for (const FcDistcpTensorSpec& t : plan.tensors) dtypes[t.key] = t.dtype;
  std::vector<TorchDcpFileLayout> out(plan.files.size());
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const FcDistcpFileSpec& spec = plan.files[f];
    TorchDcpFileLayout& layout = out[f];
    uint64_t cursor = 0;
    auto advance = [&](uint64_t n, const std::string& label) -> Status {
      auto end = CheckedAddU(cursor, n);
      if (!end || *end > (uint64_t{1} << 62)) {
        return InvalidArgumentError(label + ": file offsets overflow");
      }
      cursor = *end;
      return Status::Ok();
    };
    // BYTE_IO items first, as torch's FileSystemWriter orders them.
    for (const FcDistcpObjectSpec& o : spec.objects) {
      TorchDcpItemPlacement p;
      p.item_offset = p.data_offset = cursor;
      p.item_length = p.data_length = o.byte_length;
      FC_RETURN_IF_ERROR(advance(o.byte_length, ObjectLabel(spec, o)));
      layout.objects.push_back(p);
    }
    if (options.serialization == TorchDcpSerialization::kSafetensors) {
      FC_RETURN_IF_ERROR(LayOutSafetensorsBlob(spec, dtypes, cursor, &layout));
      continue;
    }
    for (const FcDistcpChunkSpec& c : spec.chunks) {
      const DType dtype = dtypes.at(c.key);
      TorchDcpItemPlacement p;
      // ValidateTorchDcpPlan bounded the box by its tensor, whose byte size fits.
      p.data_length = static_cast<uint64_t>(c.box.num_elements()) * DTypeSize(dtype);
      if (c.replica_id > 0) {
        p.written = false;
        layout.chunks.push_back(p);
        continue;
      }
      const TensorArchive archive = internal_torch::PlanTensorArchive(dtype, c.box.local_shape);
      p.item_offset = cursor;
      p.item_length = archive.size();
      p.data_offset = cursor + archive.data_offset();
      FC_RETURN_IF_ERROR(advance(archive.size(), ChunkLabel(spec, c)));
      layout.chunks.push_back(p);
    }
    layout.file_size = cursor;
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// The writer.

struct TorchDcpWriter::ItemState {
  internal_torch::CrcParts ranges;  // written ranges, merged when touching (CRC: chunks only)
  uint64_t bytes_done = 0;
};

struct TorchDcpWriter::FileState {
  std::unique_ptr<WritableFile> file;
  std::mutex mu;  // guards the item states and `poisoned`
  std::vector<ItemState> chunks;
  std::vector<ItemState> objects;
  Status poisoned;
};

TorchDcpWriter::TorchDcpWriter() = default;

Result<std::unique_ptr<TorchDcpWriter>> TorchDcpWriter::Create(const std::string& out_dir,
                                                               FcDistcpPlan plan,
                                                               TorchDcpWriteOptions options) {
  FC_ASSIGN_OR_RETURN(std::vector<TorchDcpFileLayout> layouts,
                      ComputeTorchDcpLayouts(plan, options));
  std::vector<bool> mine(plan.files.size(), options.files.empty());
  for (size_t f : options.files) {
    if (f >= plan.files.size()) {
      return InvalidArgumentError("writer file index " + std::to_string(f) +
                                  " out of range (plan has " +
                                  std::to_string(plan.files.size()) + " files)");
    }
    mine[f] = true;
  }
  if (options.generation == TorchGeneration::k2 && !IsValidUtf8(out_dir)) {
    return InvalidArgumentError(out_dir + ": the output path is not UTF-8, so it cannot be "
                                "storage_meta.checkpoint_id (write generation 2.0 instead)");
  }
  std::unique_ptr<TorchDcpWriter> w(new TorchDcpWriter());
  w->out_dir_ = StripTrailingSlashes(out_dir);
  if (options.staging_dir.empty()) {
    FC_ASSIGN_OR_RETURN(w->staging_dir_, CreateStagingDir(w->out_dir_));
    w->owns_staging_ = true;
  } else {
    w->staging_dir_ = options.staging_dir;
  }
  w->plan_ = std::move(plan);
  w->options_ = options;
  w->layouts_ = std::move(layouts);
  // From here on an error return destroys `w`, whose destructor removes what it made.
  w->files_.resize(w->plan_.files.size());
  for (size_t f = 0; f < w->plan_.files.size(); ++f) {
    if (!mine[f]) continue;
    auto state = std::make_unique<FileState>();
    FC_ASSIGN_OR_RETURN(state->file,
                        WritableFile::Create(JoinPath(w->staging_dir_, w->plan_.files[f].name)));
    FC_RETURN_IF_ERROR(state->file->Reserve(w->layouts_[f].file_size));
    state->chunks.resize(w->plan_.files[f].chunks.size());
    state->objects.resize(w->plan_.files[f].objects.size());
    w->files_[f] = std::move(state);
  }
  return w;
}

std::string TorchDcpWriter::StateName() const {
  switch (state_) {
    case State::kOpen: return "nothing";
    case State::kDataFinished: return "FinishDataFiles";
    case State::kCommitted: return "the commit";
    case State::kAborted: return "Abort";
  }
  return "?";
}

TorchDcpWriter::~TorchDcpWriter() {
  // After FinishDataFiles, a shared staging directory's files await the committing process.
  if (state_ == State::kOpen || (state_ == State::kDataFinished && owns_staging_)) Abort();
}

Status TorchDcpWriter::WriteItem(size_t file, bool is_object, size_t index, uint64_t offset,
                                 std::span<const std::byte> bytes) {
  if (state_ != State::kOpen) {
    return FailedPreconditionError(out_dir_ + ": write after " + StateName());
  }
  if (file >= plan_.files.size()) {
    return InvalidArgumentError(out_dir_ + ": file index " + std::to_string(file) +
                                " out of range (plan has " + std::to_string(plan_.files.size()) +
                                " files)");
  }
  if (!files_[file]) {
    return InvalidArgumentError(out_dir_ + ": " + plan_.files[file].name +
                                " is not written by this writer");
  }
  const FcDistcpFileSpec& spec = plan_.files[file];
  const size_t count = is_object ? spec.objects.size() : spec.chunks.size();
  if (index >= count) {
    return InvalidArgumentError(out_dir_ + ": " + spec.name + " has no " +
                                (is_object ? "object " : "chunk ") + std::to_string(index));
  }
  const TorchDcpItemPlacement& p =
      is_object ? layouts_[file].objects[index] : layouts_[file].chunks[index];
  const std::string label = is_object ? ObjectLabel(spec, spec.objects[index])
                                      : ChunkLabel(spec, spec.chunks[index]);
  const std::optional<uint64_t> end = CheckedAddU(offset, bytes.size());
  if (!end || *end > p.data_length) {
    return InvalidArgumentError(label + ": bytes " + Range(offset, offset + bytes.size()) +
                                " pass its end " + std::to_string(p.data_length));
  }
  if (bytes.empty() || !p.written) return Status::Ok();  // replicas are not stored
  if (is_object && offset < 4) {
    static constexpr char kMagic[] = "PK\3\4";
    for (uint64_t i = offset; i < std::min<uint64_t>(4, *end); ++i) {
      if (static_cast<char>(bytes[i - offset]) != kMagic[i]) {
        return InvalidArgumentError(label + ": does not start with a zip local header "
                                    "(torch DCP objects must be torch.save archives)");
      }
    }
  }
  // CRC outside the lock: it is the expensive part, and the bytes are the caller's.
  const uint32_t crc = is_object ? 0 : Crc32(0, bytes);
  FileState& fs = *files_[file];
  {
    std::lock_guard<std::mutex> lock(fs.mu);
    if (!fs.poisoned.ok()) return fs.poisoned;
    ItemState& item = is_object ? fs.objects[index] : fs.chunks[index];
    // Reserve [offset, end) before writing, so a concurrent writer of the same bytes is
    // caught although the pwrite itself happens outside the lock.
    if (auto twice = internal_torch::AddCrcPart(item.ranges, offset, *end, crc)) {
      return InvalidArgumentError(label + ": bytes " + Range(twice->first, twice->second) +
                                  " written twice");
    }
    item.bytes_done += bytes.size();
  }
  Status s = fs.file->WriteAt(p.data_offset + offset, bytes);
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(fs.mu);
    if (fs.poisoned.ok()) fs.poisoned = s;
  }
  return s;
}

Status TorchDcpWriter::WriteChunk(size_t file, size_t chunk, uint64_t offset,
                                  std::span<const std::byte> bytes) {
  return WriteItem(file, false, chunk, offset, bytes);
}

Status TorchDcpWriter::WriteObject(size_t file, size_t object, uint64_t offset,
                                   std::span<const std::byte> bytes) {
  return WriteItem(file, true, object, offset, bytes);
}

Status TorchDcpWriter::FinishFile(size_t f) {
  const FcDistcpFileSpec& spec = plan_.files[f];
  FileState& fs = *files_[f];
  std::unordered_map<std::string, DType> dtypes;
  for (const FcDistcpTensorSpec& t : plan_.tensors) dtypes[t.key] = t.dtype;
  if (options_.serialization == TorchDcpSerialization::kSafetensors) {
    FC_RETURN_IF_ERROR(
        fs.file->WriteAt(layouts_[f].blob_offset, AsBytes(layouts_[f].blob_header)));
  }
  for (size_t c = 0; c < spec.chunks.size(); ++c) {
    const TorchDcpItemPlacement& p = layouts_[f].chunks[c];
    if (!p.written || options_.serialization == TorchDcpSerialization::kSafetensors) continue;
    const ItemState& item = fs.chunks[c];
    const uint32_t data_crc = item.ranges.empty() ? 0 : item.ranges.begin()->second.crc;
    const TensorArchive archive = internal_torch::PlanTensorArchive(
        dtypes.at(spec.chunks[c].key), spec.chunks[c].box.local_shape);
    if (p.item_offset + archive.data_offset() != p.data_offset ||
        archive.size() != p.item_length || archive.data_bytes() != p.data_length) {
      return InternalError(ChunkLabel(spec, spec.chunks[c]) + ": item layout changed");
    }
    // Everything before the tensor bytes, then everything after them.
    FC_RETURN_IF_ERROR(
        fs.file->WriteAt(p.item_offset, AsBytes(internal_torch::TensorArchiveHead(archive))));
    FC_RETURN_IF_ERROR(fs.file->WriteAt(p.data_offset + p.data_length,
                                        AsBytes(internal_torch::TensorArchiveTail(archive, data_crc))));
  }
  FC_RETURN_IF_ERROR(fs.file->Sync());
  return fs.file->Close();
}

// ---------------------------------------------------------------------------------------
// .metadata, in steps: what it lists, then its three (with k2: four) entries.

namespace {

struct ChunkRef {
  size_t file, chunk;
};
struct ObjectRef {
  size_t file, object;
};

// What .metadata lists: item i < plan.tensors.size() is tensor i (its written chunks in
// `chunks[i]`, in file order, then order within the file), the others are `objects` in file
// order. Refers to `plan`, which must outlive it.
struct MetadataItems {
  const FcDistcpPlan& plan;
  std::vector<std::vector<ChunkRef>> chunks;
  std::vector<ObjectRef> objects;

  size_t size() const { return plan.tensors.size() + objects.size(); }
  const std::string& fqn(size_t i) const {
    return i < plan.tensors.size()
               ? plan.tensors[i].key
               : plan.files[objects[i - plan.tensors.size()].file]
                     .objects[objects[i - plan.tensors.size()].object]
                     .key;
  }
};

MetadataItems ListMetadataItems(const FcDistcpPlan& plan,
                                const std::vector<TorchDcpFileLayout>& layouts) {
  MetadataItems items{plan, std::vector<std::vector<ChunkRef>>(plan.tensors.size()), {}};
  std::unordered_map<std::string, size_t> tensor_index;
  for (size_t i = 0; i < plan.tensors.size(); ++i) tensor_index[plan.tensors[i].key] = i;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    for (size_t c = 0; c < plan.files[f].chunks.size(); ++c) {
      if (!layouts[f].chunks[c].written) continue;
      items.chunks[tensor_index.at(plan.files[f].chunks[c].key)].push_back({f, c});
    }
    for (size_t o = 0; o < plan.files[f].objects.size(); ++o) items.objects.push_back({f, o});
  }
  return items;
}

// The value of tensor i in state_dict_metadata: TensorStorageMetadata(properties, size,
// chunks). `v2`: any generation after 1.13.
void EmitTensorStorageMetadata(PickleWriter& w, const Modules& m, bool v2,
                               const MetadataItems& items, size_t i) {
  const FcDistcpTensorSpec& t = items.plan.tensors[i];
  w.Global(m.metadata, "TensorStorageMetadata").EmptyTuple().NewObj();
  w.EmptyDict().Mark();
  w.Str("properties");
  w.Global(m.properties, "TensorProperties").EmptyTuple().NewObj();
  // __getstate__: (dtype, layout, requires_grad, memory_format enum, pin_memory).
  w.Mark();
  w.Global("torch", DTypeName(t.dtype));
  w.Global("torch.serialization", "_get_layout").Str("torch.strided").TupleOf(1).Reduce();
  w.Bool(false);
  if (v2) {
    // By value, as CPython 3.8-3.10 and >= 3.11.7 pickle enum members.
    w.Global(m.properties, m.mem_format).Int(0).TupleOf(1).Reduce();
  } else {
    // By name, as Debian 12's CPython 3.11.2 pickled the real 1.13 files.
    w.Global("builtins", "getattr").Global(m.properties, m.mem_format);
    w.Str("TORCH_CONTIGUOUS_FORMAT").TupleOf(2).Reduce();
  }
  w.Bool(false);
  w.TupleOf(5).Build();
  w.Str("size");
  EmitTorchSize(w, t.global_shape);
  w.Str("chunks").EmptyList();
  const std::vector<ChunkRef>& chunks = items.chunks[i];
  EmitListItems(w, chunks.size(), [&](size_t k) {
    const Box& box = items.plan.files[chunks[k].file].chunks[chunks[k].chunk].box;
    w.Global(m.metadata, "ChunkStorageMetadata").EmptyTuple().NewObj();
    w.EmptyDict().Mark();
    w.Str("offsets");
    EmitTorchSize(w, box.global_offset);
    w.Str("sizes");
    EmitTorchSize(w, box.local_shape);
    w.SetItems().Build();
  });
  w.SetItems().Build();
}

// storage_data: MetadataIndex -> _StorageInfo, the tensors' chunks first, then the objects.
void EmitStorageData(PickleWriter& w, const Modules& m, const MetadataItems& items,
                     const std::vector<TorchDcpFileLayout>& layouts) {
  const FcDistcpPlan& plan = items.plan;
  const std::vector<ObjectRef>& objects = items.objects;
  struct StorageEntry {
    size_t item;     // fqn index
    int64_t index;   // chunk position, or -1 for objects
    size_t file;
    const Box* box;  // nullptr for objects
    uint64_t offset, length;
  };
  std::vector<StorageEntry> storage;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    for (size_t k = 0; k < items.chunks[i].size(); ++k) {
      const auto [f, c] = items.chunks[i][k];
      const TorchDcpItemPlacement& p = layouts[f].chunks[c];
      storage.push_back({i, static_cast<int64_t>(k), f, &plan.files[f].chunks[c].box,
                         p.item_offset, p.item_length});
    }
  }
  for (size_t o = 0; o < objects.size(); ++o) {
    const TorchDcpItemPlacement& p = layouts[objects[o].file].objects[objects[o].object];
    storage.push_back({plan.tensors.size() + o, -1, objects[o].file, nullptr, p.item_offset,
                       p.item_length});
  }
  w.Str("storage_data").EmptyDict();
  EmitDictItems(w, storage.size(), [&](size_t s) {
    const StorageEntry& e = storage[s];
    // MetadataIndex: __init__ sets fqn, index, then offset (only when not None).
    w.Global(m.metadata, "MetadataIndex").EmptyTuple().NewObj();
    w.EmptyDict().Mark();
    w.Str("fqn").Str(items.fqn(e.item));
    w.Str("index");
    if (e.box != nullptr) {
      w.Int(e.index);
      w.Str("offset");
      EmitTorchSize(w, e.box->global_offset);
    } else {
      w.None();
    }
    w.SetItems().Build();
    w.Global(m.filesystem, "_StorageInfo").EmptyTuple().NewObj();
    w.EmptyDict().Mark();
    w.Str("relative_path").Str(plan.files[e.file].name);
    w.Str("offset").Int(static_cast<int64_t>(e.offset));
    w.Str("length").Int(static_cast<int64_t>(e.length));
    w.SetItems().Build();
  });
}

// storage_meta and version (generation k2 only).
void EmitStorageMeta(PickleWriter& w, const Modules& m, const std::string& out_dir) {
  // FileSystemWriter.storage_meta(): StorageMeta(checkpoint_id=self.path, save_id=...);
  // the dataclass's __dict__ order, no __getstate__. self.path is a pathlib.Path, pickled
  // as pathlib.PosixPath(*parts) (CPython <= 3.12's reduce; 3.13 still loads it).
  w.Str("storage_meta");
  w.Global(m.metadata, "StorageMeta").EmptyTuple().NewObj();
  w.EmptyDict().Mark();
  w.Str("checkpoint_id");
  const std::vector<std::string> parts = PosixPathParts(out_dir);
  w.Global("pathlib", "PosixPath");
  if (parts.empty()) {
    w.EmptyTuple();
  } else {
    if (parts.size() > 3) w.Mark();
    for (const std::string& part : parts) w.Str(part);
    w.TupleOf(parts.size());
  }
  w.Reduce();
  w.Str("save_id").Str(RandomUuid4());
  w.Str("load_id").None();
  w.Str("modules").EmptyList();
  w.SetItems().Build();
  w.Str("version").Str("1.0.0");  // CURRENT_DCP_VERSION (~2.6+; older 2.4+ loads ignore it)
}

}  // namespace

Result<std::string> TorchDcpWriter::MetadataPickle() const {
  const bool v2 = options_.generation != TorchGeneration::k1_13;
  const bool v2_4 = options_.generation == TorchGeneration::k2;
  const Modules m = ModulesFor(options_.generation);
  const MetadataItems items = ListMetadataItems(plan_, layouts_);

  PickleWriter w(4);
  w.Global(m.metadata, "Metadata").EmptyTuple().NewObj().Memoize();
  w.EmptyDict().Memoize().Mark();

  // state_dict_metadata
  w.Str("state_dict_metadata").EmptyDict();
  EmitDictItems(w, items.size(), [&](size_t i) {
    w.Str(items.fqn(i));
    if (i >= plan_.tensors.size()) {
      w.Global(m.metadata, "BytesStorageMetadata").EmptyTuple().NewObj();
      return;
    }
    EmitTensorStorageMetadata(w, m, v2, items, i);
  });

  // planner_data
  w.Str("planner_data");
  if (v2) {
    // DefaultSavePlanner's flatten mapping for a flat state dict: fqn -> (fqn,).
    w.EmptyDict();
    EmitDictItems(w, items.size(),
                  [&](size_t i) { w.Str(items.fqn(i)).Str(items.fqn(i)).TupleOf(1); });
  } else {
    w.None();
  }

  EmitStorageData(w, m, items, layouts_);
  if (v2_4) EmitStorageMeta(w, m, out_dir_);
  w.SetItems().Build();
  return w.Finish();
}

Status TorchDcpWriter::FinishDataFiles() {
  if (state_ != State::kOpen) {
    return FailedPreconditionError(out_dir_ + ": FinishDataFiles after " + StateName());
  }
  Status s = [&]() -> Status {
    // All bytes present?
    for (size_t f = 0; f < plan_.files.size(); ++f) {
      if (!files_[f]) continue;
      const FcDistcpFileSpec& spec = plan_.files[f];
      FileState& fs = *files_[f];
      FC_RETURN_IF_ERROR(fs.poisoned);
      for (size_t k = 0; k < spec.objects.size() + spec.chunks.size(); ++k) {
        const bool is_object = k < spec.objects.size();
        const size_t i = is_object ? k : k - spec.objects.size();
        const TorchDcpItemPlacement& p =
            is_object ? layouts_[f].objects[i] : layouts_[f].chunks[i];
        const ItemState& item = is_object ? fs.objects[i] : fs.chunks[i];
        if (!p.written || item.bytes_done == p.data_length) continue;
        uint64_t gap_begin = 0, gap_end = p.data_length;
        if (!item.ranges.empty()) {
          if (item.ranges.begin()->first > 0) {
            gap_end = item.ranges.begin()->first;
          } else {
            gap_begin = item.ranges.begin()->second.end;
            auto second = std::next(item.ranges.begin());
            if (second != item.ranges.end()) gap_end = second->first;
          }
        }
        return FailedPreconditionError(
            (is_object ? ObjectLabel(spec, spec.objects[i]) : ChunkLabel(spec, spec.chunks[i])) +
            " is incomplete: " + std::to_string(item.bytes_done) + " of " +
            std::to_string(p.data_length) + " bytes written, bytes " +
            Range(gap_begin, gap_end) + " missing");
      }
    }
    for (size_t f = 0; f < plan_.files.size(); ++f) {
      if (files_[f]) FC_RETURN_IF_ERROR_WITH(FinishFile(f), "finishing " + plan_.files[f].name);
    }
    return SyncDirectory(staging_dir_);
  }();
  if (!s.ok()) {
    Abort();
    return s.With(out_dir_);
  }
  state_ = State::kDataFinished;
  return Status::Ok();
}

Status TorchDcpWriter::CommitMetadata() {
  if (state_ != State::kDataFinished) {
    return FailedPreconditionError(out_dir_ + ": CommitMetadata " +
                                   (state_ == State::kOpen ? std::string("before FinishDataFiles")
                                                           : "after " + StateName()));
  }
  Status s = [&]() -> Status {
    for (size_t f = 0; f < plan_.files.size(); ++f) {
      Result<std::unique_ptr<RandomAccessFile>> file =
          RandomAccessFile::Open(JoinPath(staging_dir_, plan_.files[f].name));
      if (!file.ok() && file.status().code() != StatusCode::kNotFound) return file.status();
      if (!file.ok()) {
        return DataLossError("data file " + plan_.files[f].name +
                             " is missing: " + file.status().message());
      }
      if ((*file)->size() != layouts_[f].file_size) {
        return DataLossError("data file " + plan_.files[f].name + " is " +
                             std::to_string((*file)->size()) + " bytes, expected " +
                             std::to_string(layouts_[f].file_size));
      }
    }
    FC_ASSIGN_OR_RETURN(std::string md, MetadataPickle());
    FC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> mf,
                        WritableFile::Create(JoinPath(staging_dir_, ".metadata")));
    FC_RETURN_IF_ERROR(mf->Append(md));
    FC_RETURN_IF_ERROR(mf->Sync());
    FC_RETURN_IF_ERROR(mf->Close());
    return CommitStagingDir(staging_dir_, out_dir_);
  }();
  if (!s.ok()) {
    Abort();
    return s.With("committing " + out_dir_);
  }
  files_.clear();
  state_ = State::kCommitted;
  return Status::Ok();
}

Status TorchDcpWriter::Finish() {
  if (state_ != State::kOpen) {
    return FailedPreconditionError(out_dir_ + ": Finish after " + StateName());
  }
  FC_RETURN_IF_ERROR(FinishDataFiles());
  return CommitMetadata();
}

void TorchDcpWriter::Abort() {
  if (state_ == State::kCommitted || state_ == State::kAborted) return;
  if (owns_staging_) {
    files_.clear();  // closes the descriptors
    AbortFcDistcpStaging(staging_dir_);
  } else {
    for (size_t f = 0; f < files_.size(); ++f) {
      if (!files_[f]) continue;
      files_[f].reset();
      (void)RemoveAll(JoinPath(staging_dir_, plan_.files[f].name));
    }
    files_.clear();
  }
  state_ = State::kAborted;
}

}  // namespace fc
