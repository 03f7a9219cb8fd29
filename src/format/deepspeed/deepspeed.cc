// ReadDeepSpeedCheckpoint: DeepSpeed save/tag dirs -> CheckpointIndex.
// Layout, names and contract: include/fc/format/deepspeed.h; file facts:
// shared/reference/deepspeed.md.
//
// Every file is a torch.save zip or legacy stream; its pickle is parsed into a value tree
// (nothing runs) and the tensors are located inside their storages. The ZeRO flat
// partitions are never copied: each param's piece of a partition becomes a flattened-range
// chunk pointing at the partition's bytes, so padding (tail padding for ZeRO-1/2 and
// BF16_Optimizer, per-param ceil-div padding for ZeRO-3) is simply never addressed.
//
// Each model-parallel rank is read on its own into tensor families (weights, frozen,
// buffers, other module tensors, module, exp_avg, exp_avg_sq, step); pipeline stages of one
// TP rank are then united (first stage wins for shared params) and the layer files added;
// last the TP ranks are merged. A TP merge never touches data either: concatenation along
// an axis only moves a chunk's box, and the vocabulary cut and the two-sub-param split only
// narrow a chunk to some rows of its box (RowSlice), which for a flattened range is a
// sub-range and for a strided block a byte offset.
#include "fc/format/deepspeed.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include <re2/re2.h>

#include "fc/codec/pickle_globals.h"
#include "fc/core/checked_math.h"
#include "fc/core/dtype_convert.h"
#include "fc/core/flat_range.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/file_names.h"
#include "fc/format/torch_save.h"
#include "fc/io/file.h"

namespace fc {
namespace {

constexpr uint64_t kMaxPickleBytes = uint64_t{256} << 20;
std::string ShapeText(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// One element for messages: its value, and for a float its bit pattern too.
std::string ElementText(DType dtype, const std::byte* p) {
  const size_t item = DTypeSize(dtype);
  std::string hex = "0x";
  for (size_t b = item; b-- > 0;) {  // little-endian in the file: most significant first
    char h[3];
    std::snprintf(h, sizeof h, "%02x", std::to_integer<unsigned>(p[b]));
    hex += h;
  }
  if (dtype == DType::kInt64 || dtype == DType::kUInt64) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return dtype == DType::kInt64 ? std::to_string(static_cast<int64_t>(v)) : std::to_string(v);
  }
  double v = 0;
  if (IsPacked(dtype) || dtype == DType::kComplex64 ||
      !ConvertElements(p, dtype, &v, DType::kFloat64, 1).ok()) {
    return hex;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, dtype == DType::kFloat64 ? "%.17g" : "%.9g", v);
  return IsFloating(dtype) ? std::string(buf) + " (" + hex + ")" : std::string(buf);
}

// Whether two elements are equal as torch.equal sees them: equal bytes, or floats of equal
// value (+0 and -0).
bool SameElement(DType dtype, const std::byte* a, const std::byte* b) {
  const size_t item = DTypeSize(dtype);
  if (std::memcmp(a, b, item) == 0) return true;
  if (!IsFloating(dtype) || IsPacked(dtype) || dtype == DType::kComplex64) return false;
  double x = 0, y = 0;
  if (!ConvertElements(a, dtype, &x, DType::kFloat64, 1).ok() ||
      !ConvertElements(b, dtype, &y, DType::kFloat64, 1).ok()) {
    return false;
  }
  return x == y;
}

// The first element where a TP copy of a replicated tensor differs from TP rank 0's.
struct ReplicaDifference {
  size_t rank = 0;      // the TP rank whose copy differs
  int64_t element = 0;  // row-major index in the tensor
  std::string value0, value;
};

// --- File names ------------------------------------------------------------------------

enum class FileKind {
  kModelMp, kModelZero3, kOptim, kPipelineLayer, kExpert, kExpertOptim, kOther
};

struct NameInfo {
  FileKind kind = FileKind::kOther;
  int64_t dp = 0, mp = 0;
  int64_t layer = 0;  // kPipelineLayer: the global layer index
};

// Ranks and layers in DeepSpeed names stay below 1e9: larger numbers are not a DeepSpeed
// file (and would size tables later).
std::optional<NumberedName> MatchName(std::string_view n, std::string_view pattern) {
  std::optional<NumberedName> m = MatchNumberedName(n, pattern);
  for (size_t i = 0; m && i < m->count; ++i) {
    if ((*m)[i] >= 1'000'000'000) return std::nullopt;
  }
  return m;
}

// Names, after DeepSpeed's checkpoint naming functions:
//   layer_XX-model_YY-model_states.pt, layer_XX-model_states.pt (no model axis: TP rank 0)
//                                          PipelineModule.ckpt_layer_path
//   layer_L_expert_E_mp_rank_XX_model_states.pt   MoE layer L's global expert E (dp carries E)
//   mp_rank_XX_model_states.pt | [bf16_|fp16_]zero_pp_rank_N_mp_rank_XX_{model,optim}_states.pt
//   expp_rank_*_optim_states.pt                   MoE optimizer states (not read)
NameInfo ClassifyName(std::string_view n) {
  NameInfo info;
  auto as = [&](FileKind kind, std::string_view pattern, int64_t* a, int64_t* b) {
    std::optional<NumberedName> m = MatchName(n, pattern);
    if (!m) return false;
    info.kind = kind;
    *a = static_cast<int64_t>((*m)[0]);
    if (b) *b = static_cast<int64_t>((*m)[1]);
    return true;
  };
  if (n.starts_with("layer_")) {
    if (as(FileKind::kPipelineLayer, "layer_#-model_states.pt", &info.layer, nullptr) ||
        as(FileKind::kPipelineLayer, "layer_#-model_#-model_states.pt", &info.layer, &info.mp)) {
      return info;
    }
    if (std::optional<NumberedName> m =
            MatchName(n, "layer_#_expert_#_mp_rank_#_model_states.pt")) {
      info.kind = FileKind::kExpert;
      info.layer = static_cast<int64_t>((*m)[0]);
      info.dp = static_cast<int64_t>((*m)[1]);
      info.mp = static_cast<int64_t>((*m)[2]);
    }
    return info;
  }
  if (n.starts_with("expp_rank_") && n.ends_with("_optim_states.pt")) {
    info.kind = FileKind::kExpertOptim;
    return info;
  }
  if (n.starts_with("bf16_") || n.starts_with("fp16_")) n.remove_prefix(5);
  if (as(FileKind::kModelMp, "mp_rank_#_model_states.pt", &info.mp, nullptr) ||
      as(FileKind::kModelZero3, "zero_pp_rank_#_mp_rank_#_model_states.pt", &info.dp, &info.mp) ||
      as(FileKind::kOptim, "zero_pp_rank_#_mp_rank_#_optim_states.pt", &info.dp, &info.mp)) {
    return info;
  }
  return NameInfo{};
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' ||
                        s.back() == '\t')) {
    s.pop_back();
  }
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

bool HasStateFiles(const std::string& dir) {
  auto names = ListDirectory(dir);
  if (!names.ok()) return false;
  for (const std::string& n : *names) {
    const FileKind k = ClassifyName(n).kind;
    if (k == FileKind::kModelMp || k == FileKind::kModelZero3 || k == FileKind::kOptim) {
      return true;
    }
  }
  return false;
}

// The tag named by <dir>/<file> (latest, latest_universal), if that file exists.
Result<std::optional<std::string>> LatestTag(const std::string& dir, const std::string& file) {
  const std::string latest = dir + "/" + file;
  if (!PathExists(latest) || IsDirectory(latest)) return std::optional<std::string>();
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(latest, 4096));
  std::string tag = Trim(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos ||
      tag.find('\0') != std::string::npos) {
    return DataLossError(latest + ": '" + tag + "' is not a tag directory name");
  }
  return std::optional<std::string>(tag);
}

// --- Pickle helpers ----------------------------------------------------------------------

using PV = PickleValue;
using Entries = std::vector<std::pair<PV::Ptr, PV::Ptr>>;

// Dict entries of a dict or of a REDUCE'd collections.OrderedDict; nullptr otherwise.
const Entries* DictEntries(const PV* v) {
  if (v == nullptr) return nullptr;
  if (v->kind == PV::Kind::kDict) return &v->entries;
  if (v->kind == PV::Kind::kCall || v->kind == PV::Kind::kObject) {
    const PV* g = v->CalleeGlobal();
    if (g != nullptr && g->IsGlobal("collections", "OrderedDict")) return &v->entries;
  }
  return nullptr;
}

const PV* FindIntKey(const PV* dict, int64_t key) {
  const Entries* e = DictEntries(dict);
  if (e == nullptr) return nullptr;
  const PV* found = nullptr;
  for (const auto& [k, v] : *e) {
    if (k && k->is_int() && k->int_value == key) found = v.get();
  }
  return found;
}

const std::vector<PV::Ptr>* ListItems(const PV* v) {
  if (v == nullptr || (v->kind != PV::Kind::kList && v->kind != PV::Kind::kTuple)) {
    return nullptr;
  }
  return &v->items;
}

bool IsZeroStageEnum(const PV* g) {
  return g != nullptr && g->IsGlobal("deepspeed.runtime.zero.config", "ZeroStageEnum");
}

// An int, or the int Enum ZeroStageEnum, pickled as ZeroStageEnum((value,)) (Python < 3.11)
// or as getattr(ZeroStageEnum, 'member_name') (Python >= 3.11 Enum.__reduce_ex__).
std::optional<int64_t> IntOf(const PV* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_int()) return v->int_value;
  if (v->kind == PV::Kind::kBool) return v->bool_value ? 1 : 0;
  if (v->kind == PV::Kind::kCall) {
    const PV* g = v->CalleeGlobal();
    if (g != nullptr && (g->IsGlobal("builtins", "getattr") ||
                         g->IsGlobal("__builtin__", "getattr")) &&
        v->args && v->args->is_tuple() && v->args->items.size() == 2 &&
        IsZeroStageEnum(v->args->items[0].get()) && v->args->items[1]->is_str()) {
      static const std::map<std::string, int64_t> kMembers = {
          {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}};
      auto it = kMembers.find(v->args->items[1]->str);
      if (it != kMembers.end()) return it->second;
      return std::nullopt;
    }
    if (g != nullptr && g->str == "deepspeed.runtime.zero.config" && g->name == "ZeroStageEnum" &&
        v->args && v->args->is_tuple() && v->args->items.size() == 1 &&
        v->args->items[0]->is_int()) {
      return v->args->items[0]->int_value;
    }
  }
  return std::nullopt;
}

// torch.Size((d0, d1, ...)) or a plain tuple/list of ints.
std::optional<Shape> ShapeOf(const PV* v) {
  if (v == nullptr) return std::nullopt;
  const PV* t = v;
  if (v->kind == PV::Kind::kCall) {
    const PV* g = v->CalleeGlobal();
    if (g == nullptr || !g->IsGlobal("torch", "Size") || !v->args || !v->args->is_tuple() ||
        v->args->items.size() != 1) {
      return std::nullopt;
    }
    t = v->args->items[0].get();
  }
  const auto* items = ListItems(t);
  if (items == nullptr) return std::nullopt;
  Shape s;
  for (const auto& i : *items) {
    if (!i->is_int() || i->int_value < 0) return std::nullopt;
    s.push_back(i->int_value);
  }
  return s;
}

std::optional<std::string> StrOf(const PV* v) {
  if (v == nullptr || !v->is_str()) return std::nullopt;
  return v->str;
}

// The allow-list: globals whose meaning fc knows (deepspeed.md section 0). Anything else is
// kept as an opaque node and reported.
bool AllowedGlobal(const std::string& module, const std::string& name) {
  static const std::set<std::pair<std::string, std::string>> kAllowed = {
      {"collections", "OrderedDict"},
      {"torch", "Size"},
      {"torch", "device"},
      {"__builtin__", "set"}, {"builtins", "set"},
      // Only ever interpreted as getattr(ZeroStageEnum, 'member') (see IntOf); never called.
      {"__builtin__", "getattr"}, {"builtins", "getattr"},
      {"__builtin__", "frozenset"}, {"builtins", "frozenset"},
      {"deepspeed.runtime.zero.config", "ZeroStageEnum"},
      {"deepspeed.runtime.fp16.loss_scaler", "LossScaler"},
      {"deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"},
      {"deepspeed.utils.tensor_fragment", "fragment_address"},
      {"deepspeed.checkpoint.universal_checkpoint", "SubparamShape"},
      {"argparse", "Namespace"},
      // Protocol 2 writes bytes objects (numpy RNG key arrays) as _codecs.encode(str, enc).
      {"_codecs", "encode"},
      {"numpy.core.multiarray", "_reconstruct"},
      {"numpy._core.multiarray", "_reconstruct"},
      {"numpy.core.multiarray", "scalar"},
      {"numpy", "ndarray"},
      {"numpy", "dtype"},
  };
  if (kAllowed.count({module, name})) return true;
  if (module == "torch._utils" && name.starts_with("_rebuild_")) return true;
  if (module == "torch._tensor" && name == "_rebuild_from_type_v2") return true;
  if (module == "torch" && (name.ends_with("Storage") || name == "Tensor" ||
                            name == "bfloat16" || name == "float32" || name == "float16")) {
    return true;
  }
  return false;
}


// --- Files and tensors -------------------------------------------------------------------

struct Located {
  DType dtype = DType::kFloat32;
  Shape shape;
  Shape strides;
  bool contiguous = true;
  int64_t numel = 0;
  uint64_t first = 0;  // absolute file offset of element (0, ..., 0)
  uint64_t span = 0;   // ViewSpanBytes
};

struct PtFile {
  std::string name;
  uint32_t index = 0;
  std::unique_ptr<RandomAccessFile> file;
  TorchSaveArchive archive;
  PickleValue root;
  // Legacy (non-zip) files: storage key -> [first byte, + bytes) of its data in the file.
  bool legacy = false;
  std::map<std::string, std::pair<uint64_t, uint64_t>> legacy_storages;

  Result<Located> Locate(const PV* v, const std::string& what) const {
    if (v == nullptr) return DataLossError(name + ": " + what + " is missing");
    auto ref = DecodeTorchTensor(*v);
    if (!ref.ok()) return ref.status().With(name + ": " + what);
    uint64_t data_offset = 0;
    if (legacy) {
      auto it = legacy_storages.find(ref->storage_key);
      if (it == legacy_storages.end()) {
        return DataLossError(name + ": " + what + ": storage '" + ref->storage_key +
                             "' is not in the file's storage list");
      }
      if (it->second.second != ref->storage_bytes) {
        return DataLossError(name + ": " + what + ": storage '" + ref->storage_key + "' has " +
                             std::to_string(it->second.second) + " bytes, the pickle says " +
                             std::to_string(ref->storage_bytes));
      }
      data_offset = it->second.first;
    } else {
      FC_ASSIGN_OR_RETURN(data_offset, ZipStorage(*ref, what));
    }
    Located l;
    l.dtype = ref->dtype;
    l.shape = ref->shape;
    l.strides = ref->strides;
    l.contiguous = ref->IsRowMajorContiguous();
    FC_ASSIGN_OR_RETURN(l.numel, CheckedNumElements(l.shape).With(name + ": " + what));
    // In range: DecodeTorchTensor checked that the view fits the storage.
    l.first = data_offset + static_cast<uint64_t>(ref->storage_offset) * DTypeSize(l.dtype);
    l.span = ref->ViewSpanBytes();
    return l;
  }

  // The file offset of storage record data/<key> of a zip file.
  Result<uint64_t> ZipStorage(const TorchTensorRef& ref, const std::string& what) const {
    const ZipEntry* e = archive.FindRecord("data/" + ref.storage_key);
    if (e == nullptr) {
      return DataLossError(name + ": " + what + ": storage record 'data/" + ref.storage_key +
                           "' is missing");
    }
    if (e->method != 0) {
      return UnimplementedError(name + ": " + what + ": storage record '" + e->name +
                                "' is compressed");
    }
    if (e->compressed_size != ref.storage_bytes) {
      return DataLossError(name + ": " + what + ": storage record '" + e->name + "' has " +
                           std::to_string(e->compressed_size) + " bytes, data.pkl says " +
                           std::to_string(ref.storage_bytes));
    }
    if (e->data_exclusive_max() > file->size()) {
      return DataLossError(name + ": " + what + ": storage record '" + e->name +
                           "' passes the end of the file");
    }
    return e->data_offset;
  }
};

// Legacy torch.save (_use_new_zipfile_serialization=False; DeepSpeed's
// checkpoint_serialization: false): five protocol-2 pickles back to back (magic number
// 0x1950a86a20f9469cfc6c, protocol version 1001, sys_info, the object, the list of storage
// keys), then per key in that list: its element count (int64 little-endian) and its raw
// bytes. `head` holds the file's first bytes; kDataLoss when the pickles pass its end.
Status ReadLegacyHead(std::span<const std::byte> head, PtFile* pt) {
  size_t pos = 0;
  std::vector<PickleValue> parts;
  for (int i = 0; i < 5; ++i) {
    size_t used = 0;
    auto v = ParsePickle(head.subspan(pos), PickleLimits{}, &used);
    if (!v.ok()) return v.status();
    parts.push_back(std::move(*v));
    pos += used;
  }
  static const char kMagic[] = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
  if (parts[0].kind != PV::Kind::kBigInt || parts[0].str != std::string(kMagic, 10)) {
    return DataLossError("legacy torch.save magic number is " + parts[0].DebugString());
  }
  if (!parts[1].is_int() || parts[1].int_value != 1001) {
    return UnimplementedError("legacy torch.save protocol version " + parts[1].DebugString() +
                              " (fc reads 1001)");
  }
  if (const PV* le = parts[2].Find("little_endian");
      le != nullptr && le->kind == PV::Kind::kBool && !le->bool_value) {
    return UnimplementedError("legacy torch.save written on a big-endian machine");
  }
  pt->root = std::move(parts[3]);
  const auto* keys = ListItems(&parts[4]);
  if (keys == nullptr) {
    return DataLossError("legacy torch.save storage key list is " + parts[4].DebugString());
  }
  // Each storage's byte size, from the tensors that reference it.
  std::map<std::string, std::pair<uint64_t, uint64_t>> bytes;  // key -> (bytes, item size)
  std::unordered_set<const PV*> seen;
  std::vector<const PV*> stack = {&pt->root};
  while (!stack.empty()) {
    const PV* v = stack.back();
    stack.pop_back();
    if (v == nullptr || !seen.insert(v).second) continue;
    if (v->kind == PV::Kind::kCall) {
      if (auto ref = DecodeTorchTensor(*v); ref.ok()) {
        auto [it, fresh] = bytes.emplace(ref->storage_key,
                                         std::pair<uint64_t, uint64_t>{ref->storage_bytes,
                                                                       DTypeSize(ref->dtype)});
        if (!fresh && it->second.first != ref->storage_bytes) {
          return DataLossError("legacy torch.save storage '" + ref->storage_key +
                               "' has two sizes in the pickle");
        }
        continue;
      }
    }
    for (const auto& i : v->items) stack.push_back(i.get());
    for (const auto& [k, x] : v->entries) {
      stack.push_back(k.get());
      stack.push_back(x.get());
    }
    for (const PV::Ptr* p : {&v->callee, &v->args, &v->kwargs, &v->state}) {
      if (*p) stack.push_back(p->get());
    }
  }
  uint64_t off = pos;
  const uint64_t size = pt->file->size();
  for (const auto& k : *keys) {
    auto key = StrOf(k.get());
    if (!key) return DataLossError("legacy torch.save storage key " + k->DebugString());
    auto it = bytes.find(*key);
    if (it == bytes.end()) {
      return DataLossError("legacy torch.save storage '" + *key + "' is used by no tensor");
    }
    if (off > size || size - off < 8) {
      return DataLossError("legacy torch.save storage '" + *key + "' starts past the end");
    }
    std::byte n[8];
    FC_RETURN_IF_ERROR(pt->file->ReadAt(off, n));
    uint64_t numel = 0;
    for (int b = 7; b >= 0; --b) numel = (numel << 8) | static_cast<uint64_t>(n[b]);
    off += 8;
    const auto [storage_bytes, item] = it->second;
    if (size - off < storage_bytes) {
      return DataLossError("legacy torch.save storage '" + *key + "' (" +
                           std::to_string(storage_bytes) + " bytes) passes the end of the file");
    }
    // The element count written before the data must name the pickle's bytes.
    if (numel > storage_bytes || numel * item != storage_bytes) {
      return DataLossError("legacy torch.save storage '" + *key + "' holds " +
                           std::to_string(numel) + " elements of " + std::to_string(item) +
                           " bytes, the pickle says " + std::to_string(storage_bytes) + " bytes");
    }
    if (!pt->legacy_storages.emplace(*key, std::pair{off, storage_bytes}).second) {
      return DataLossError("legacy torch.save storage '" + *key + "' listed twice");
    }
    off += storage_bytes;
  }
  pt->legacy = true;
  return Status::Ok();
}

Status ReadLegacy(PtFile* pt) {
  // The pickles come first; read a growing prefix until they parse.
  const uint64_t size = pt->file->size();
  const uint64_t cap = std::min(size, kMaxPickleBytes);
  uint64_t want = std::min<uint64_t>(cap, uint64_t{1} << 20);
  for (;;) {
    std::vector<std::byte> head(static_cast<size_t>(want));
    FC_RETURN_IF_ERROR(pt->file->ReadAt(0, head));
    pt->legacy_storages.clear();
    Status s = ReadLegacyHead(head, pt);
    if (s.ok()) return s;
    if (want >= cap) return s.With(pt->name);
    want = std::min(cap, want * 8);
  }
}

Result<std::unique_ptr<PtFile>> OpenPt(const std::string& dir, const std::string& name,
                                       uint32_t index) {
  auto pt = std::make_unique<PtFile>();
  pt->name = name;
  pt->index = index;
  FC_ASSIGN_OR_RETURN(pt->file, RandomAccessFile::Open(dir + "/" + name));
  const RandomAccessFile* f = pt->file.get();
  ZipReadFn read = [f](uint64_t off, std::span<std::byte> dst) { return f->ReadAt(off, dst); };
  if (f->size() >= 2) {
    std::byte magic[2];
    FC_RETURN_IF_ERROR(f->ReadAt(0, magic));
    if (magic[0] != std::byte{'P'} || magic[1] != std::byte{'K'}) {
      // Legacy torch.save starts with a pickled magic number (protocol 2: 0x80 0x02).
      if (magic[0] == std::byte{0x80}) {
        FC_RETURN_IF_ERROR(ReadLegacy(pt.get()));
        return pt;
      }
      return DataLossError(name + ": not a torch.save zip archive");
    }
  }
  auto archive = ReadTorchSaveArchive(f->size(), read);
  if (!archive.ok()) return archive.status().With(name);
  pt->archive = std::move(*archive);
  auto root = ReadTorchSavePickle(pt->archive, read, kMaxPickleBytes);
  if (!root.ok()) return root.status().With(name);
  pt->root = std::move(*root);
  return pt;
}

// --- Index building ----------------------------------------------------------------------

class Builder {
 public:
  // Adds a chunk to tensor `key`, creating it; dtype and shape must agree.
  Status Add(const std::string& key, DType dtype, const Shape& shape, Chunk chunk,
             const std::string& where) {
    auto it = pos_.find(key);
    if (it == pos_.end()) {
      it = pos_.emplace(key, tensors_.size()).first;
      TensorEntry t;
      t.key = key;
      t.dtype = dtype;
      t.global_shape = shape;
      tensors_.push_back(std::move(t));
    }
    TensorEntry& t = tensors_[it->second];
    if (t.dtype != dtype || t.global_shape != shape) {
      return DataLossError(where + ": tensor '" + key + "' is " + std::string(DTypeName(dtype)) +
                           " " + ShapeText(shape) + " here but " +
                           std::string(DTypeName(t.dtype)) + " " + ShapeText(t.global_shape) +
                           " elsewhere");
    }
    t.chunks.push_back(std::move(chunk));
    return Status::Ok();
  }
  bool Has(const std::string& key) const { return pos_.count(key) > 0; }
  const TensorEntry* Get(const std::string& key) const {
    auto it = pos_.find(key);
    return it == pos_.end() ? nullptr : &tensors_[it->second];
  }
  void AddCopy(const std::string& key, const TensorEntry& from) {
    if (Has(key)) return;
    pos_.emplace(key, tensors_.size());
    TensorEntry t = from;
    t.key = key;
    tensors_.push_back(std::move(t));
  }
  std::vector<TensorEntry> Take() {
    pos_.clear();
    std::vector<TensorEntry> out = std::move(tensors_);
    tensors_.clear();
    return out;
  }

 private:
  std::map<std::string, size_t> pos_;
  std::vector<TensorEntry> tensors_;
};

Chunk WholeChunk(const Located& l, uint32_t file) {
  Chunk c;
  c.box = Box::Whole(l.shape);
  c.file = file;
  c.byte_offset = l.first;
  c.byte_length = l.span;
  if (!l.contiguous) c.strides = l.strides;
  return c;
}

// Elements [element_offset, element_offset + range.size()) of the 1-D tensor `l` hold the
// flattened range `range` of a tensor of `shape`.
Result<Chunk> FlatChunk(const Located& l, uint32_t file, const Shape& shape, FlatRange range,
                        int64_t element_offset, const std::string& what) {
  if (l.shape.size() != 1) {
    return DataLossError(what + ": flat partition has shape " + ShapeText(l.shape) +
                         ", expected 1-D");
  }
  if (l.numel > 1 && l.strides[0] != 1) {
    return UnimplementedError(what + ": flat partition has stride " +
                              std::to_string(l.strides[0]));
  }
  if (element_offset < 0 || range.size() < 0 || element_offset > l.numel ||
      range.size() > l.numel - element_offset) {
    return DataLossError(what + ": elements [" + std::to_string(element_offset) + ", " +
                         std::to_string(element_offset + range.size()) +
                         ") pass the partition's end at " + std::to_string(l.numel));
  }
  const uint64_t item = DTypeSize(l.dtype);
  Chunk c;
  c.box = Box::Whole(shape);
  c.flat_range = range;
  c.file = file;
  c.byte_offset = l.first + static_cast<uint64_t>(element_offset) * item;
  c.byte_length = static_cast<uint64_t>(range.size()) * item;
  return c;
}

using ParamList = std::vector<std::pair<std::string, Shape>>;

Result<std::vector<ParamList>> ParamShapes(const PtFile& model) {
  const PV* ps = model.root.Find("param_shapes");
  std::vector<ParamList> groups;
  if (ps == nullptr || ps->is_none()) return groups;
  const auto* items = ListItems(ps);
  if (items == nullptr) {
    // A single dict (very old DeepSpeed) counts as one group.
    if (DictEntries(ps) == nullptr) {
      return DataLossError(model.name + ": param_shapes is " + ps->DebugString() +
                           ", expected a list of dicts");
    }
  }
  std::vector<const PV*> dicts;
  if (items) for (const auto& i : *items) dicts.push_back(i.get());
  else dicts.push_back(ps);
  for (size_t g = 0; g < dicts.size(); ++g) {
    const Entries* e = DictEntries(dicts[g]);
    if (e == nullptr) {
      return DataLossError(model.name + ": param_shapes[" + std::to_string(g) + "] is " +
                           dicts[g]->DebugString() + ", expected a dict");
    }
    ParamList list;
    for (const auto& [k, v] : *e) {
      auto name = StrOf(k.get());
      auto shape = ShapeOf(v.get());
      if (!name || !shape) {
        return DataLossError(model.name + ": param_shapes[" + std::to_string(g) + "] entry " +
                             k->DebugString() + ": " + v->DebugString() +
                             " is not name: torch.Size");
      }
      FC_RETURN_IF_ERROR_WITH(CheckedNumElements(*shape).status(),
                              model.name + ": param_shapes '" + *name + "'");
      list.emplace_back(*name, *shape);
    }
    groups.push_back(std::move(list));
  }
  return groups;
}

// fragment_address(numel, start), pickled as NEWOBJ + BUILD {numel, start}.
std::optional<std::pair<int64_t, int64_t>> FragmentOf(const PV* v) {
  const PV* st = v ? v->state.get() : nullptr;
  auto numel = IntOf(st ? st->Find("numel") : nullptr);
  auto start = IntOf(st ? st->Find("start") : nullptr);
  if (!numel || !start) return std::nullopt;
  return std::make_pair(*numel, *start);
}

// param_slice_mappings[g] (when saved) must list exactly the params that intersect each
// rank's partition, with fragment_address(numel, start) as the partition math says.
Status CheckSliceMappings(const std::vector<const PtFile*>& optims,
                          const std::vector<const PV*>& osds, size_t g, const ParamList& params,
                          int64_t ps, int64_t total) {
  for (size_t r = 0; r < osds.size(); ++r) {
    const auto* all = ListItems(osds[r]->Find("param_slice_mappings"));
    if (all == nullptr) continue;  // older DeepSpeed: not saved
    const std::string where = optims[r]->name + ": param_slice_mappings[" + std::to_string(g) + "]";
    if (g >= all->size()) return DataLossError(where + " is missing");
    const Entries* e = DictEntries((*all)[g].get());
    if (e == nullptr) return DataLossError(where + " is " + (*all)[g]->DebugString());
    std::map<std::string, std::pair<int64_t, int64_t>> want;
    const int64_t left = static_cast<int64_t>(r) * ps;
    const int64_t right = std::min(left + ps, total);
    int64_t off = 0;
    for (const auto& [name, shape] : params) {
      const int64_t n = *CheckedNumElements(shape);
      const int64_t lo = std::max(off, left), hi = std::min(off + n, right);
      if (lo < hi) want[name] = {hi - lo, lo - left};
      off += n;
    }
    std::map<std::string, std::pair<int64_t, int64_t>> got;
    for (const auto& [k, v] : *e) {
      auto name = StrOf(k.get());
      auto frag = FragmentOf(v.get());
      if (!name || !frag) {
        return DataLossError(where + ": entry " + k->DebugString() + ": " + v->DebugString() +
                             " is not name: fragment_address(numel, start)");
      }
      got[*name] = *frag;
    }
    if (got != want) {
      for (const auto& [name, ns] : want) {
        auto it = got.find(name);
        if (it == got.end() || it->second != ns) {
          return DataLossError(where + ": '" + name + "' should be fragment_address(numel=" +
                               std::to_string(ns.first) + ", start=" + std::to_string(ns.second) +
                               ")" + (it == got.end() ? " but is absent"
                                                      : " but is (" + std::to_string(it->second.first) +
                                                            ", " + std::to_string(it->second.second) + ")"));
        }
      }
      return DataLossError(where + " lists params outside this rank's partition");
    }
  }
  return Status::Ok();
}

struct RankFiles {
  PtFile* model = nullptr;               // mp_rank_XX_model_states.pt (stage <= 2)
  std::map<int64_t, PtFile*> optim;      // dp -> optim file
  std::map<int64_t, PtFile*> model_z3;   // dp -> zero_pp_rank model file (stage 3)
};

// The index's tensor families, in the order the index lists them.
enum Family { kWeights, kFrozen, kBuffers, kOther, kModule, kExpAvg, kExpAvgSq, kStep, kFamilies };
// The key prefix of each family; the rest of the key is the param's name in the model.
constexpr std::string_view kFamilyPrefix[kFamilies] = {
    "", "", "", "", "module.", "optimizer.exp_avg.", "optimizer.exp_avg_sq.", "optimizer.step."};

struct Families {
  std::array<std::vector<TensorEntry>, kFamilies> tensors;
  std::map<std::string, std::string> aliases;  // shared_params: alias -> owner
};

// universal_checkpoint_info merge rules (deepspeed.md 5.5/5.6). Patterns are Python regexes
// applied with re.match (anchored at the start only); RE2 runs them in linear time and
// refuses what it cannot run (backreferences, lookaround): such a checkpoint is refused.
// Bounds on the sub-param tables (sizes and widths are dims of real tensors, the tables have
// one entry per sub-param or TP rank): sums of them stay far from int64 overflow.
constexpr int64_t kMaxSubParamSize = int64_t{1} << 40;
constexpr size_t kMaxSubParamEntries = 1 << 16;

// One entry of parameter_with_sub_params: SubparamShape(patterns, shape, partition_dim),
// saved as a dict (or the dataclass). `shape` lists per dim either a size (-1: whatever the
// element count leaves) or, at partition_dim, the sizes of the fused sub-params (a tuple);
// before UCP version 0.4 that entry may be a count of equal sub-params instead.
struct SubParamRule {
  std::vector<std::string> patterns;
  std::vector<std::unique_ptr<re2::RE2>> compiled;
  std::vector<std::vector<int64_t>> dims;  // per dim: {size} or the sub-param sizes
  std::vector<bool> tuple;                 // dims[d] was a tuple / list
  size_t partition_dim = 0;
};

struct TpRules {
  using Patterns = std::vector<std::unique_ptr<re2::RE2>>;
  Patterns replicated, average, two_sub_params, sub_params, row_parallel, vocabulary;
  std::vector<SubParamRule> sub_param_rules;
  // sub_param_shard_widths (version >= 0.4): pattern -> per sub-param, per TP rank widths.
  std::map<std::string, std::vector<std::vector<int64_t>>> shard_widths;
  double version = 0.0;  // universal_checkpoint_version
  std::optional<int64_t> original_vocab_size;
  std::string source;  // the file the rules came from

  // DeepSpeed's get_matched_sub_params_pattern: the first entry with a pattern that
  // re.match-es `name`, and that pattern.
  std::pair<const SubParamRule*, std::string> MatchSubParams(const std::string& name) const {
    for (const SubParamRule& r : sub_param_rules) {
      for (size_t i = 0; i < r.compiled.size(); ++i) {
        if (r.compiled[i]->Match(name, 0, name.size(), re2::RE2::ANCHOR_START, nullptr, 0)) {
          return {&r, r.patterns[i]};
        }
      }
    }
    return {nullptr, std::string()};
  }

  static bool Matches(const Patterns& ps, const std::string& name) {
    for (const auto& p : ps) {
      if (p->Match(name, 0, name.size(), re2::RE2::ANCHOR_START, nullptr, 0)) return true;
    }
    return false;
  }
};

Result<TpRules> ParseTpRules(const PtFile& model, const PV* info) {
  TpRules rules;
  TpRules* rules_out = &rules;
  rules.source = model.name;
  auto patterns = [&](const char* key, TpRules::Patterns* out) -> Status {
    const PV* v = info->Find(key);
    if (v == nullptr || v->is_none()) return Status::Ok();
    const auto* items = ListItems(v);
    if (items == nullptr) {
      return DataLossError(model.name + ": universal_checkpoint_info['" + key + "'] is " +
                           v->DebugString() + ", expected a list of patterns");
    }
    for (const auto& i : *items) {
      const PV* pat = i.get();
      // parameter_with_sub_params lists SubparamShape(patterns, shape, partition_dim).
      if (std::string(key) == "parameter_with_sub_params") {
        const PV* fields = DictEntries(pat) ? pat : pat->state.get();
        const auto* sub = ListItems(fields ? fields->Find("patterns") : nullptr);
        const std::string where = model.name + ": universal_checkpoint_info['" + key +
                                  "'] entry " + pat->DebugString();
        if (sub == nullptr) return DataLossError(where + " has no patterns list");
        SubParamRule rule;
        for (const auto& sp : *sub) {
          auto text = StrOf(sp.get());
          if (!text) return DataLossError(model.name + ": sub-param pattern " + sp->DebugString());
          out->push_back(std::make_unique<re2::RE2>(*text, re2::RE2::Quiet));
          rule.patterns.push_back(*text);
          rule.compiled.push_back(std::make_unique<re2::RE2>(*text, re2::RE2::Quiet));
        }
        const auto* dims = ListItems(fields->Find("shape"));
        auto pd = IntOf(fields->Find("partition_dim"));
        if (dims == nullptr || dims->empty() || !pd || *pd < 0 ||
            static_cast<size_t>(*pd) >= dims->size()) {
          return DataLossError(where + ": shape must be a non-empty tuple and partition_dim " +
                               "one of its dims");
        }
        rule.partition_dim = static_cast<size_t>(*pd);
        if (dims->size() > kMaxSubParamEntries) return DataLossError(where + ": shape too long");
        for (const auto& d : *dims) {
          std::vector<int64_t> sizes;
          if (auto n = IntOf(d.get())) {
            if (*n < -1 || *n > kMaxSubParamSize) {
              return DataLossError(where + ": shape entry " + d->DebugString());
            }
            sizes.push_back(*n);
            rule.tuple.push_back(false);
          } else if (const auto* parts = ListItems(d.get())) {
            if (parts->size() > kMaxSubParamEntries) {
              return DataLossError(where + ": too many sub-params");
            }
            for (const auto& x : *parts) {
              auto n2 = IntOf(x.get());
              if (!n2 || *n2 < 0 || *n2 > kMaxSubParamSize) {
                return DataLossError(where + ": sub-param size " + x->DebugString());
              }
              sizes.push_back(*n2);
            }
            rule.tuple.push_back(true);
          } else {
            return DataLossError(where + ": shape entry " + d->DebugString());
          }
          rule.dims.push_back(std::move(sizes));
        }
        rules_out->sub_param_rules.push_back(std::move(rule));
        continue;
      }
      auto text = StrOf(pat);
      if (!text) {
        return DataLossError(model.name + ": universal_checkpoint_info['" + key +
                             "'] entry " + pat->DebugString() + " is not a string");
      }
      out->push_back(std::make_unique<re2::RE2>(*text, re2::RE2::Quiet));
    }
    for (const auto& p : *out) {
      if (!p->ok()) {
        return UnimplementedError(model.name + ": universal_checkpoint_info['" + key +
                                  "'] pattern '" + p->pattern() + "' is not a regular " +
                                  "expression fc runs (" + p->error() + ")");
      }
    }
    return Status::Ok();
  };
  FC_RETURN_IF_ERROR(patterns("tp_replicated_parameter_patterns", &rules.replicated));
  FC_RETURN_IF_ERROR(patterns("parameter_to_average_patterns", &rules.average));
  FC_RETURN_IF_ERROR(patterns("parameter_with_2_sub_params_cat_dim_0", &rules.two_sub_params));
  FC_RETURN_IF_ERROR(patterns("parameter_with_sub_params", &rules.sub_params));
  FC_RETURN_IF_ERROR(patterns("parameter_with_row_parallelism_patterns", &rules.row_parallel));
  FC_RETURN_IF_ERROR(patterns("vocabulary_parameter_patterns", &rules.vocabulary));
  if (const PV* v = info->Find("universal_checkpoint_version"); v && !v->is_none()) {
    if (v->kind == PV::Kind::kFloat) rules.version = v->float_value;
    else if (auto n = IntOf(v)) rules.version = static_cast<double>(*n);
    else if (auto t = StrOf(v)) rules.version = std::strtod(t->c_str(), nullptr);
  }
  if (const PV* v = info->Find("sub_param_shard_widths"); v && !v->is_none()) {
    const Entries* e = DictEntries(v);
    if (e == nullptr) {
      return DataLossError(model.name + ": universal_checkpoint_info['sub_param_shard_widths'] is " +
                           v->DebugString() + ", expected a dict pattern -> widths");
    }
    for (const auto& [k, w] : *e) {
      auto pattern = StrOf(k.get());
      const auto* subs = ListItems(w.get());
      std::vector<std::vector<int64_t>> table;
      bool ok = pattern.has_value() && subs != nullptr && subs->size() <= kMaxSubParamEntries;
      for (size_t s = 0; ok && s < subs->size(); ++s) {
        const auto* ranks = ListItems((*subs)[s].get());
        if (ranks == nullptr || ranks->size() > kMaxSubParamEntries) { ok = false; break; }
        std::vector<int64_t> row;
        for (const auto& r : *ranks) {
          auto n = IntOf(r.get());
          if (!n || *n < 0 || *n > kMaxSubParamSize) { ok = false; break; }
          row.push_back(*n);
        }
        table.push_back(std::move(row));
      }
      if (!ok) {
        return DataLossError(model.name + ": universal_checkpoint_info['sub_param_shard_widths'] "
                             "entry " + k->DebugString() + ": " + w->DebugString() +
                             " is not pattern: [[width per TP rank] per sub-param]");
      }
      rules.shard_widths[*pattern] = std::move(table);
    }
  }
  if (const PV* v = info->Find("original_vocab_size"); v && !v->is_none()) {
    auto n = IntOf(v);
    if (!n || *n < 0) {
      return DataLossError(model.name + ": universal_checkpoint_info['original_vocab_size'] is " +
                           v->DebugString());
    }
    rules.original_vocab_size = n;
  }
  if (const PV* v = info->Find("autotp_unsupported_parameter_patterns"); v && !v->is_none()) {
    const Entries* e = DictEntries(v);
    if (e != nullptr && !e->empty()) {
      return UnimplementedError(model.name + ": universal_checkpoint_info lists "
                                "autotp_unsupported_parameter_patterns " + v->DebugString() +
                                " (DeepSpeed refuses to merge this checkpoint too)");
    }
  }
  return rules;
}

// The part of `c` (a chunk of a tensor of rank >= 1) that lies in rows [lo, hi) of dim 0,
// still addressing the same bytes; nullopt when nothing does.
std::optional<Chunk> RowSlice(const Chunk& c, int64_t lo, int64_t hi, size_t item) {
  const int64_t o0 = c.box.global_offset[0], s0 = c.box.local_shape[0];
  const int64_t a = std::max(lo, o0), b = std::min(hi, o0 + s0);
  if (a >= b) return std::nullopt;
  int64_t row = 1;
  for (size_t d = 1; d < c.box.local_shape.size(); ++d) row *= c.box.local_shape[d];
  Chunk out = c;
  out.xxh3_64.reset();
  out.box.global_offset[0] = a;
  out.box.local_shape[0] = b - a;
  if (c.flat_range) {
    const int64_t r0 = (a - o0) * row, r1 = (b - o0) * row;
    const int64_t g0 = std::max(c.flat_range->inclusive_min, r0);
    const int64_t g1 = std::min(c.flat_range->exclusive_max, r1);
    if (g0 >= g1) return std::nullopt;
    out.flat_range = FlatRange{g0 - r0, g1 - r0};
    out.byte_offset += static_cast<uint64_t>(g0 - c.flat_range->inclusive_min) * item;
    out.byte_length = static_cast<uint64_t>(g1 - g0) * item;
    return out;
  }
  if (c.strides.empty()) {
    out.byte_offset += static_cast<uint64_t>((a - o0) * row) * item;
    out.byte_length = static_cast<uint64_t>((b - a) * row) * item;
    return out;
  }
  out.byte_offset += static_cast<uint64_t>((a - o0) * c.strides[0]) * item;
  int64_t last = 0;
  for (size_t d = 0; d < out.box.local_shape.size(); ++d) {
    if (out.box.local_shape[d] == 0) return std::nullopt;
    last += (out.box.local_shape[d] - 1) * c.strides[d];
  }
  out.byte_length = static_cast<uint64_t>(last + 1) * item;
  return out;
}

Shape RowMajorStrides(const Shape& shape) {
  Shape s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

// Bytes from a strided block's first element to the end of its last; 0 when empty.
uint64_t StridedSpan(const Shape& local, const Shape& strides, size_t item) {
  int64_t last = 0;
  for (size_t d = 0; d < local.size(); ++d) {
    if (local[d] == 0) return 0;
    last += (local[d] - 1) * strides[d];
  }
  return static_cast<uint64_t>(last + 1) * item;
}

// A flattened-range chunk as strided blocks addressing the same bytes: the range's
// row-major run through its box cut into boxes (a partial innermost run, whole runs of the
// next dims out, ...; at most 2 per dim), each packed row-major in the file, so the box's
// row-major strides address it.
std::vector<Chunk> FlatBlocks(const Chunk& c, size_t item) {
  const Shape& local = c.box.local_shape;
  const Shape st = RowMajorStrides(local);
  const size_t rank = local.size();
  std::vector<Chunk> out;
  int64_t p = c.flat_range->inclusive_min;
  const int64_t end = c.flat_range->exclusive_max;
  while (p < end) {
    size_t j = 0;
    while (j + 1 < rank && (p % st[j] != 0 || st[j] > end - p)) ++j;
    const int64_t at_j = (p / st[j]) % local[j];
    const int64_t count = std::min(local[j] - at_j, (end - p) / st[j]);
    Chunk b = c;
    b.flat_range.reset();
    b.xxh3_64.reset();
    b.strides = st;
    int64_t rem = p;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t idx = rem / st[d];
      rem %= st[d];
      b.box.global_offset[d] = c.box.global_offset[d] + idx;
      b.box.local_shape[d] = d < j ? 1 : (d == j ? count : local[d]);
    }
    b.byte_offset = c.byte_offset + static_cast<uint64_t>(p - c.flat_range->inclusive_min) * item;
    b.byte_length = StridedSpan(b.box.local_shape, st, item);
    out.push_back(std::move(b));
    p += count * st[j];
  }
  return out;
}

// The parts of `c` lying in [lo, hi) along dim `d` of the tensor, still addressing the same
// bytes, appended to `out`. Dim 0 keeps the chunk's form (RowSlice); another dim makes it
// strided (a flattened range first becomes its strided blocks).
void AxisSlice(const Chunk& c, size_t d, int64_t lo, int64_t hi, size_t item,
               std::vector<Chunk>* out) {
  if (d == 0) {
    if (auto s = RowSlice(c, lo, hi, item)) out->push_back(std::move(*s));
    return;
  }
  const int64_t o = c.box.global_offset[d], n = c.box.local_shape[d];
  const int64_t a = std::max(lo, o), b = std::min(hi, o + n);
  if (a >= b) return;
  std::vector<Chunk> blocks;
  if (c.flat_range) {
    blocks = FlatBlocks(c, item);
  } else {
    blocks.push_back(c);
    if (c.strides.empty()) blocks.back().strides = RowMajorStrides(c.box.local_shape);
  }
  for (Chunk& s : blocks) {
    const int64_t so = s.box.global_offset[d], sn = s.box.local_shape[d];
    const int64_t x = std::max(a, so), y = std::min(b, so + sn);
    if (x >= y) continue;
    s.xxh3_64.reset();
    s.byte_offset += static_cast<uint64_t>((x - so) * s.strides[d]) * item;
    s.box.global_offset[d] = x;
    s.box.local_shape[d] = y - x;
    s.byte_length = StridedSpan(s.box.local_shape, s.strides, item);
    if (s.byte_length == 0) continue;
    out->push_back(std::move(s));
  }
}

// parameter_with_sub_params (deepspeed.md 5.5 rule 4, ds_to_universal's merge): every TP
// slice is the sub-params' per-rank pieces side by side along partition_dim; the merged
// tensor is, per sub-param, all ranks' pieces in rank order. Widths: version >= 0.4 from
// sub_param_shard_widths[matched pattern] (uneven, GQA); before, an even split (a count at
// partition_dim: that many equal sub-params). Only the chunks' boxes move (AxisSlice).
// `name`, `key`: for messages. Errors: kDataLoss when the widths or shapes disagree with the
// slices, kUnimplemented for a sub-param view whose shape is not the slices' own.
Status MergeSubParams(const TpRules& rules, const SubParamRule& rule, const std::string& pattern,
                      const std::string& key, const std::vector<TensorEntry*>& parts,
                      TensorEntry* m) {
  const size_t tp = parts.size();
  const size_t pd = rule.partition_dim;
  const std::string where = rules.source + ": parameter_with_sub_params pattern '" + pattern +
                            "' for '" + key + "'";
  for (const TensorEntry* p : parts) {
    if (p->global_shape.size() <= pd && !rule.tuple[pd]) {
      return UnimplementedError(where + ": the TP slice " + ShapeText(p->global_shape) +
                                " has no dim " + std::to_string(pd) + " to size the sub-params by");
    }
  }
  std::vector<int64_t> sizes = rule.dims[pd];
  std::vector<std::vector<int64_t>> widths;
  if (rules.version >= 0.4) {
    if (!rule.tuple[pd]) {
      return DataLossError(where + ": universal_checkpoint_version " +
                           std::to_string(rules.version) + " needs the sub-param sizes (a tuple) "
                           "at partition_dim " + std::to_string(pd));
    }
    auto it = rules.shard_widths.find(pattern);
    if (it == rules.shard_widths.end()) {
      return DataLossError(where + ": universal_checkpoint_version " +
                           std::to_string(rules.version) + " but sub_param_shard_widths has no "
                           "entry for the pattern");
    }
    widths = it->second;
  } else {
    if (!rule.tuple[pd]) {
      // A count of equal sub-params, sized from the slices.
      const int64_t count = sizes[0];
      int64_t full = 0;
      for (const TensorEntry* p : parts) full += p->global_shape[pd];
      if (count <= 0 || full % count != 0) {
        return DataLossError(where + ": " + std::to_string(count) + " sub-params do not divide "
                             "the " + std::to_string(full) + " merged entries of dim " +
                             std::to_string(pd));
      }
      sizes.assign(static_cast<size_t>(count), full / count);
    }
    for (int64_t size : sizes) {
      if (size % static_cast<int64_t>(tp) != 0) {
        return UnimplementedError(where + ": sub-param size " + std::to_string(size) +
                                  " is not divisible by the TP degree " + std::to_string(tp) +
                                  " and universal_checkpoint_version " +
                                  std::to_string(rules.version) + " < 0.4 records no "
                                  "sub_param_shard_widths: the uneven layout is unknown");
      }
      widths.emplace_back(tp, size / static_cast<int64_t>(tp));
    }
  }
  if (widths.size() != sizes.size()) {
    return DataLossError(where + ": " + std::to_string(widths.size()) + " shard width lists for " +
                         std::to_string(sizes.size()) + " sub-params");
  }
  for (size_t s = 0; s < sizes.size(); ++s) {
    int64_t sum = 0;
    for (int64_t w : widths[s]) sum += w;
    if (widths[s].size() != tp || sum != sizes[s]) {
      return DataLossError(where + ": sub-param " + std::to_string(s) + " of size " +
                           std::to_string(sizes[s]) + " has shard widths summing to " +
                           std::to_string(sum) + " over " + std::to_string(widths[s].size()) +
                           " ranks, expected " + std::to_string(tp));
    }
  }
  // Per rank: the slice must be the sub-param view with this rank's widths at pd.
  Shape merged(rule.dims.size());
  for (size_t d = 0; d < rule.dims.size(); ++d) {
    int64_t v = 0;
    for (int64_t x : rule.dims[d]) v += x;
    merged[d] = d == pd ? std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) : v;
  }
  for (size_t t = 0; t < tp; ++t) {
    const Shape& have = parts[t]->global_shape;
    Shape view = merged;
    view[pd] = 0;
    for (const auto& w : widths) view[pd] += w[t];
    int64_t known = 1, open = -1;
    for (size_t d = 0; d < view.size(); ++d) {
      if (view[d] < 0 && open < 0) {
        open = static_cast<int64_t>(d);
        continue;
      }
      auto k = CheckedMul(known, view[d]);
      if (!k || view[d] < 0) return DataLossError(where + ": shape " + ShapeText(view));
      known = *k;
    }
    const int64_t numel = *CheckedNumElements(have);
    if (open >= 0) view[static_cast<size_t>(open)] = known > 0 ? numel / known : 0;
    if (view != have) {
      const bool same_count = CheckedNumElements(view).ok() && *CheckedNumElements(view) == numel;
      const std::string text = where + ": TP rank " + std::to_string(t) + " holds " +
                               ShapeText(have) + ", the sub-param shape with its widths is " +
                               ShapeText(view);
      if (same_count) {
        return UnimplementedError(text + " (fc merges a sub-param view of the slice's own "
                                  "shape only)");
      }
      return DataLossError(text);
    }
  }
  for (size_t d = 0; d < merged.size(); ++d) {
    if (merged[d] < 0) merged[d] = parts[0]->global_shape[d];
  }
  const size_t item = DTypeSize(parts[0]->dtype);
  m->global_shape = merged;
  m->chunks.clear();
  std::vector<int64_t> local_at(tp, 0);  // next unread entry of each rank's slice along pd
  int64_t global_at = 0;                 // start of sub-param s in the merged tensor
  for (size_t s = 0; s < sizes.size(); ++s) {
    int64_t dst = global_at;
    for (size_t t = 0; t < tp; ++t) {
      const int64_t w = widths[s][t];
      const int64_t lo = local_at[t];
      std::vector<Chunk> pieces;
      for (const Chunk& c : parts[t]->chunks) AxisSlice(c, pd, lo, lo + w, item, &pieces);
      for (Chunk& c : pieces) {
        c.box.global_offset[pd] += dst - lo;
        m->chunks.push_back(std::move(c));
      }
      local_at[t] += w;
      dst += w;
    }
    global_at += sizes[s];
  }
  return Status::Ok();
}

class Reader {
 public:
  explicit Reader(DeepSpeedReadOptions options) : options_(std::move(options)) {}
  Result<CheckpointIndex> Read(const std::string& path);

 private:
  Status ReadRank(int64_t mp, RankFiles& rf);
  Status ReadZero12(const PtFile& model, const std::vector<const PtFile*>& optims,
                    const std::vector<const PV*>& osds, bool bf16_optimizer);
  Status ReadZero3(const std::vector<const PtFile*>& models,
                   const std::vector<const PtFile*>& optims, const std::vector<const PV*>& osds);
  Status ReadMoeZero12(const std::vector<const PtFile*>& optims,
                       const std::vector<const PV*>& osds, bool bf16_optimizer);
  Status AddFrozenFull(const PtFile& model);
  Status AddFrozenZero3(const std::vector<const PtFile*>& models);
  Status AddModule(const PtFile& model, bool zero3_placeholders);
  Status AddExpertFiles(const std::vector<const PtFile*>& files);
  Status AddStep(const PtFile& f, const PV* state, int64_t g, const ParamList& params);
  void SetAttr(const std::string& k, const std::string& v, const std::string& where);

  Families TakeFamilies();
  Status AddLayerFiles(const std::vector<std::pair<int64_t, const PtFile*>>& layers,
                       const std::set<std::string>& buffer_names,
                       const std::set<std::string>& known_params, Families* f);
  Result<Families> MergeTp(std::vector<Families> per_tp, const TpRules* rules);
  Status ReadUniversalParams(const std::vector<std::pair<std::string, Shape>>& order,
                             bool check_shapes, Families* f);
  // Opens dir_/rel as the index's next file.
  Result<PtFile*> Open(const std::string& rel);

  // Module buffers at TP > 1 (MergeTp): "" when the TP copies `parts` are equal (dtype,
  // shape, values), else why they are kept per rank.
  Result<std::string> BufferCopiesDiffer(const std::vector<TensorEntry*>& parts,
                                         ChunkReader& reader) const;
  // The TP copies `parts` of one tensor (equal dtype and shape) compared element by element,
  // read through the chunks the export reads (flattened ranges, strides) in pieces of
  // options_.replica_piece_bytes: the first difference from TP rank 0's copy, or nullopt.
  Result<std::optional<ReplicaDifference>> FirstReplicaDifference(
      const std::vector<TensorEntry*>& parts, ChunkReader& reader) const;
  // The kDataLoss refusal of a replicated tensor `key` whose copies differ (`rule` says
  // what made it replicated).
  Status ReplicasDiffer(const std::string& key, const std::vector<TensorEntry*>& parts,
                        const ReplicaDifference& d, const std::string& rule) const;
  // The file holding element `element` of `e` (for messages).
  std::string FileOfElement(const TensorEntry& e, int64_t element) const;

  // The user's TP rules (--source-layout) merge `parts` (one per TP rank) into `m`.
  Status MergeBySourceSplit(const std::string& name, bool step,
                            const std::vector<TensorEntry*>& parts, TensorEntry* m,
                            ChunkReader& reader) const;

  DeepSpeedReadOptions options_;
  bool pipeline_ = false;   // layer_* files hold the module weights
  bool universal_ = false;  // a Universal Checkpoint (zero/<param>/*.pt)
  bool moe_ = false;        // MoE expert files: the ZeRO files are read by ReadMoeZero12
  // MoE: every module and expert tensor's shape (the model states carry no param_shapes),
  // and per expert module (the name up to "deepspeed_experts.") its number of experts.
  std::map<std::string, Shape> moe_shapes_;
  std::map<std::string, int64_t> moe_experts_;
  bool moe_optimizer_read_ = false;
  std::vector<std::unique_ptr<PtFile>> files_;
  Builder weights_, frozen_, buffers_, other_, module_, exp_avg_, exp_avg_sq_, step_;
  std::map<std::string, std::string> aliases_;  // alias -> owner (prefixed)
  std::string module_dtype_, master_dtype_;
  CheckpointIndex index_;
  std::string dir_;
};

void Reader::SetAttr(const std::string& k, const std::string& v, const std::string& where) {
  // The first value wins; ranks disagreeing on such facts (ds_version) is not an error.
  (void)where;
  index_.attributes.emplace(k, v);
}

Status Reader::AddStep(const PtFile& f, const PV* state, int64_t g, const ParamList& params) {
  const PV* st = state ? state->Find("step") : nullptr;
  if (st == nullptr) return Status::Ok();
  if (auto i = IntOf(st)) {
    SetAttr("deepspeed.step.group" + std::to_string(g), std::to_string(*i), f.name);
    return Status::Ok();
  }
  if (st->kind == PV::Kind::kFloat) {
    SetAttr("deepspeed.step.group" + std::to_string(g), std::to_string(st->float_value), f.name);
    return Status::Ok();
  }
  FC_ASSIGN_OR_RETURN(Located l, f.Locate(st, "step of group " + std::to_string(g)));
  for (const auto& [name, shape] : params) {
    FC_RETURN_IF_ERROR(step_.Add("optimizer.step." + name, l.dtype, l.shape,
                                 WholeChunk(l, f.index), f.name));
  }
  return Status::Ok();
}

// Per rank and param group of ZeRO 1/2: the fp32 partition, exp_avg, exp_avg_sq and the
// element counts (lean: the partition without its tail padding; padded: with it).
struct RankPart {
  Located fp32;
  std::optional<Located> exp_avg, exp_avg_sq;
  int64_t lean = 0, padded = 0;
  const PV* state = nullptr;
};

// Group g of optimizer state `osd` (file f), which must list `ngroups` groups (as
// `groups_what` says).
Result<RankPart> LoadRankPart(const PtFile& f, const PV* osd, size_t g, size_t ngroups,
                              const std::string& groups_what, bool bf16_optimizer) {
  const std::string gs = std::to_string(g);
  const auto* singles = ListItems(osd->Find("single_partition_of_fp32_groups"));
  const auto* paddings = ListItems(osd->Find("group_paddings"));
  if (singles == nullptr || singles->size() != ngroups) {
    return DataLossError(f.name + ": single_partition_of_fp32_groups has " +
                         (singles ? std::to_string(singles->size()) : "no") +
                         " groups, " + groups_what + " has " + std::to_string(ngroups));
  }
  if (paddings == nullptr || paddings->size() != ngroups) {
    return DataLossError(f.name + ": group_paddings does not list " +
                         std::to_string(ngroups) + " groups");
  }
  auto pad = IntOf((*paddings)[g].get());
  if (!pad || *pad < 0) {
    return DataLossError(f.name + ": group_paddings[" + gs + "] is " +
                         (*paddings)[g]->DebugString());
  }
  RankPart p;
  FC_ASSIGN_OR_RETURN(p.fp32, f.Locate((*singles)[g].get(),
                                       "single_partition_of_fp32_groups[" + gs + "]"));
  if (p.fp32.shape.size() != 1) {
    return DataLossError(f.name + ": single_partition_of_fp32_groups[" + gs +
                         "] has shape " + ShapeText(p.fp32.shape) + ", expected 1-D");
  }
  if (bf16_optimizer) {
    // BF16_Optimizer saves the padded partition: strip group_paddings here.
    if (*pad > p.fp32.numel) {
      return DataLossError(f.name + ": group_paddings[" + gs + "] = " +
                           std::to_string(*pad) + " exceeds the partition's " +
                           std::to_string(p.fp32.numel) + " elements");
    }
    p.padded = p.fp32.numel;
    p.lean = p.fp32.numel - *pad;
  } else {
    p.lean = p.fp32.numel;
    auto padded = CheckedAdd(p.fp32.numel, *pad);
    if (!padded) return OutOfRangeError(f.name + ": group " + gs + " padding overflows");
    p.padded = *padded;
  }
  const PV* base = osd->Find("base_optimizer_state");
  if (base != nullptr && base->is_list()) {
    return UnimplementedError(f.name + ": elastic optimizer state (base_optimizer_state "
                              "is a list) is not read yet");
  }
  const PV* state = base ? FindIntKey(base->Find("state"), static_cast<int64_t>(g)) : nullptr;
  p.state = state;
  if (state != nullptr) {
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      const PV* t = state->Find(key);
      if (t == nullptr) continue;
      FC_ASSIGN_OR_RETURN(Located l, f.Locate(t, std::string("base_optimizer_state state[") +
                                                     gs + "]." + key));
      if (l.shape.size() != 1 || l.numel < p.lean) {
        return DataLossError(f.name + ": base_optimizer_state state[" + gs + "]." + key +
                             " has shape " + ShapeText(l.shape) + ", expected 1-D with at least " +
                             std::to_string(p.lean) + " elements");
      }
      (std::string(key) == "exp_avg" ? p.exp_avg : p.exp_avg_sq) = l;
    }
  }
  return p;
}

Status Reader::ReadZero12(const PtFile& model, const std::vector<const PtFile*>& optims,
                          const std::vector<const PV*>& osds, bool bf16_optimizer) {
  FC_ASSIGN_OR_RETURN(std::vector<ParamList> groups, ParamShapes(model));
  const int64_t ws = static_cast<int64_t>(optims.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string gs = std::to_string(g);
    int64_t total = 0;
    for (const auto& [n, s] : groups[g]) {
      auto sum = CheckedAdd(total, *CheckedNumElements(s));
      if (!sum) return OutOfRangeError(model.name + ": group " + gs + " overflows");
      total = *sum;
    }
    std::vector<RankPart> parts;
    for (int64_t r = 0; r < ws; ++r) {
      FC_ASSIGN_OR_RETURN(RankPart p, LoadRankPart(*optims[static_cast<size_t>(r)],
                                                   osds[static_cast<size_t>(r)], g, groups.size(),
                                                   "param_shapes of " + model.name,
                                                   bf16_optimizer));
      parts.push_back(p);
    }
    // Every rank owns `ps` elements of the aligned flat buffer; padding is at the tail only.
    const int64_t ps = parts[0].padded;
    for (int64_t r = 0; r < ws; ++r) {
      const RankPart& p = parts[static_cast<size_t>(r)];
      const int64_t left = r * ps;  // ps * ws <= sum of file sizes: no overflow
      const int64_t want = std::clamp<int64_t>(total - left, 0, ps);
      if (p.padded != ps || p.lean != want) {
        return DataLossError(optims[static_cast<size_t>(r)]->name + ": group " + gs +
                             " partition holds " + std::to_string(p.lean) + " elements + " +
                             std::to_string(p.padded - p.lean) + " padding; with " +
                             std::to_string(total) + " elements in param_shapes over " +
                             std::to_string(ws) + " ranks of " + std::to_string(ps) +
                             " it must hold " + std::to_string(want) + " + " +
                             std::to_string(ps - want));
      }
    }
    if (ps * ws < total) {
      return DataLossError(model.name + ": group " + gs + ": partitions hold " +
                           std::to_string(ps * ws) + " elements, param_shapes " +
                           std::to_string(total));
    }
    if (!parts.empty()) master_dtype_ = std::string(DTypeName(parts[0].fp32.dtype));
    FC_RETURN_IF_ERROR(CheckSliceMappings(optims, osds, g, groups[g], ps, total));
    int64_t off = 0;
    for (const auto& [name, shape] : groups[g]) {
      const int64_t n = *CheckedNumElements(shape);
      for (int64_t r = 0; r < ws; ++r) {
        const RankPart& p = parts[static_cast<size_t>(r)];
        const PtFile& f = *optims[static_cast<size_t>(r)];
        const int64_t left = r * ps;
        const int64_t lo = std::max(off, left), hi = std::min(off + n, left + p.lean);
        if (lo >= hi) continue;
        const FlatRange range{lo - off, hi - off};
        const std::string what = f.name + ": param '" + name + "'";
        FC_ASSIGN_OR_RETURN(Chunk c, FlatChunk(p.fp32, f.index, shape, range, lo - left, what));
        FC_RETURN_IF_ERROR(weights_.Add(name, p.fp32.dtype, shape, c, f.name));
        if (p.exp_avg) {
          FC_ASSIGN_OR_RETURN(c, FlatChunk(*p.exp_avg, f.index, shape, range, lo - left, what));
          FC_RETURN_IF_ERROR(exp_avg_.Add("optimizer.exp_avg." + name,
                                          p.exp_avg->dtype, shape, c, f.name));
        }
        if (p.exp_avg_sq) {
          FC_ASSIGN_OR_RETURN(c,
                              FlatChunk(*p.exp_avg_sq, f.index, shape, range, lo - left, what));
          FC_RETURN_IF_ERROR(exp_avg_sq_.Add("optimizer.exp_avg_sq." + name,
                                             p.exp_avg_sq->dtype, shape, c, f.name));
        }
      }
      off += n;
    }
    if (ws > 0) FC_RETURN_IF_ERROR(AddStep(*optims[0], parts[0].state, static_cast<int64_t>(g),
                                           groups[g]));
  }
  return AddFrozenFull(model);
}

// An expert param's name: <prefix>deepspeed_experts.<id>.<rest> (deepspeed.moe's Experts
// module); the prefix ends after "deepspeed_experts.".
struct ExpertName {
  std::string prefix, rest;  // rest starts with '.'
  int64_t id = 0;
};

std::optional<ExpertName> ParseExpertName(const std::string& name) {
  constexpr std::string_view kExperts = "deepspeed_experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return std::nullopt;
  const size_t digits = at + kExperts.size();
  size_t end = digits;
  while (end < name.size() && end - digits < 9 && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == digits || end >= name.size() || name[end] != '.') return std::nullopt;
  return ExpertName{name.substr(0, digits), name.substr(end),
                    std::stoll(name.substr(digits, end - digits))};
}

// MoE with ZeRO 1/2 or BF16_Optimizer (DeepSpeedEngine._save_moe_checkpoint +
// _save_zero_checkpoint; not in deepspeed.md: from DeepSpeed's source, stage_1_and_2.py and
// bf16_optimizer.py _configure_moe_settings (BF16_Optimizer since DeepSpeed PR #5259, 2024),
// moe/utils.py split_params_into_different_moe_groups_for_optimizer, utils/groups.py
// _create_expert_and_data_parallel). The param groups are the dense groups, then the expert
// groups (name "ep_size_<E>", moe True). A dense group is cut over all W DP ranks like any
// ZeRO group. An expert group holds only the rank's own (local) experts and is cut over its
// expert-data-parallel group: partition_count[g] = W / E. Rank R is expert-parallel rank
// R % E and expert-DP rank R / E (DeepSpeed's default), or, with
// use_data_before_expert_parallelism in ds_config, R / (W/E) and R % (W/E). The model states
// carry no param_shapes: the params, their order and offsets come from param_slice_mappings
// (required here), their shapes from the module and the expert files. Local expert k of
// expert-parallel rank e is global expert e * (experts / E) + k, the name the expert files
// use (_save_moe_checkpoint).
Status Reader::ReadMoeZero12(const std::vector<const PtFile*>& optims,
                             const std::vector<const PV*>& osds, bool bf16_optimizer) {
  const int64_t ws = static_cast<int64_t>(optims.size());
  std::optional<bool> data_before_expert;
  for (const PtFile* f : optims) {
    bool flag = false;
    const PV* cfg = f->root.Find("ds_config");
    const PV* v = cfg ? cfg->Find("use_data_before_expert_parallelism") : nullptr;
    if (v != nullptr && !v->is_none()) {
      if (v->kind != PV::Kind::kBool) {
        return DataLossError(f->name + ": ds_config use_data_before_expert_parallelism is " +
                             v->DebugString() + ", expected a bool");
      }
      flag = v->bool_value;
    }
    if (data_before_expert && *data_before_expert != flag) {
      return DataLossError(f->name + ": ds_config use_data_before_expert_parallelism differs "
                           "from " + optims[0]->name + "'s");
    }
    data_before_expert = flag;
  }
  const auto* singles0 = ListItems(osds[0]->Find("single_partition_of_fp32_groups"));
  if (singles0 == nullptr) {
    return DataLossError(optims[0]->name + ": no single_partition_of_fp32_groups list");
  }
  const size_t ngroups = singles0->size();
  // partition_count: a list per group (an int: every group over all W ranks).
  std::vector<int64_t> counts;
  for (int64_t r = 0; r < ws; ++r) {
    const PtFile& f = *optims[static_cast<size_t>(r)];
    const PV* pc = osds[static_cast<size_t>(r)]->Find("partition_count");
    std::vector<int64_t> c;
    if (auto one = IntOf(pc)) c.assign(ngroups, *one);
    if (const auto* items = ListItems(pc)) {
      for (const auto& i : *items) {
        auto v = IntOf(i.get());
        if (!v) break;
        c.push_back(*v);
      }
    }
    if (c.size() != ngroups) {
      return DataLossError(f.name + ": partition_count is " +
                           (pc ? pc->DebugString() : std::string("missing")) +
                           ", expected one count per param group (" + std::to_string(ngroups) +
                           ")");
    }
    if (r > 0 && c != counts) {
      return DataLossError(f.name + ": partition_count " + pc->DebugString() + " differs from " +
                           optims[0]->name + "'s");
    }
    counts = std::move(c);
  }
  const PV* base0 = osds[0]->Find("base_optimizer_state");
  const auto* param_groups = ListItems(base0 ? base0->Find("param_groups") : nullptr);
  int64_t max_ep = 1;
  for (size_t g = 0; g < ngroups; ++g) {
    const std::string gs = std::to_string(g);
    const int64_t count = counts[g];
    if (count <= 0 || ws % count != 0) {
      return DataLossError(optims[0]->name + ": partition_count[" + gs + "] = " +
                           std::to_string(count) + " does not divide the " + std::to_string(ws) +
                           " DP ranks' files");
    }
    const int64_t ep = ws / count;
    bool expert_group = ep > 1;
    if (param_groups != nullptr && g < param_groups->size()) {
      const PV* pg = (*param_groups)[g].get();
      const PV* moe = pg->Find("moe");
      const bool flagged = moe != nullptr && moe->kind == PV::Kind::kBool && moe->bool_value;
      if (ep > 1 && !flagged) {
        return DataLossError(optims[0]->name + ": param group " + gs + " is partitioned over " +
                             std::to_string(count) + " of " + std::to_string(ws) +
                             " ranks but is not an expert group (no moe: True)");
      }
      expert_group = expert_group || flagged;
      auto name = StrOf(pg->Find("name"));
      if (flagged && name && name->starts_with("ep_size_") &&
          *name != "ep_size_" + std::to_string(ep)) {
        return DataLossError(optims[0]->name + ": param group " + gs + " is named '" + *name +
                             "' but partition_count " + std::to_string(count) + " of " +
                             std::to_string(ws) + " ranks means ep_size " + std::to_string(ep));
      }
    }
    max_ep = std::max(max_ep, ep);
    // Local expert k of expert-parallel rank e -> global expert e * local + k.
    auto global_name = [&](const std::string& local, int64_t e,
                           const std::string& where) -> Result<std::string> {
      const std::optional<ExpertName> x = ParseExpertName(local);
      if (!expert_group || !x) return local;
      auto it = moe_experts_.find(x->prefix);
      if (it == moe_experts_.end()) {
        return DataLossError(where + ": expert param '" + local + "', but no layer_*_expert_* "
                             "file holds experts named " + x->prefix + "<id>.*");
      }
      if (it->second % ep != 0) {
        return DataLossError(where + ": " + std::to_string(it->second) + " experts of " +
                             x->prefix + "* do not split over " + std::to_string(ep) +
                             " expert-parallel ranks");
      }
      const int64_t per_rank = it->second / ep;
      if (x->id >= per_rank) {
        return DataLossError(where + ": local expert " + std::to_string(x->id) + " in '" + local +
                             "', but each of the " + std::to_string(ep) +
                             " expert-parallel ranks holds " + std::to_string(per_rank));
      }
      return x->prefix + std::to_string(e * per_rank + x->id) + x->rest;
    };
    for (int64_t e = 0; e < ep; ++e) {
      std::vector<size_t> members;  // partition j -> rank
      for (int64_t j = 0; j < count; ++j) {
        members.push_back(static_cast<size_t>(*data_before_expert ? e * count + j : e + j * ep));
      }
      std::vector<RankPart> parts;
      for (size_t m : members) {
        FC_ASSIGN_OR_RETURN(RankPart p, LoadRankPart(*optims[m], osds[m], g, ngroups,
                                                     optims[0]->name, bf16_optimizer));
        parts.push_back(p);
      }
      const int64_t ps = parts[0].padded;
      // Fragments per param: (partition j, numel, start in the partition).
      struct Fragment {
        size_t j;
        int64_t numel, start;
      };
      std::vector<std::string> order;
      std::map<std::string, std::vector<Fragment>> frags;
      for (size_t j = 0; j < members.size(); ++j) {
        const PtFile& f = *optims[members[j]];
        const std::string where = f.name + ": param_slice_mappings[" + gs + "]";
        const auto* all = ListItems(osds[members[j]]->Find("param_slice_mappings"));
        if (all == nullptr || g >= all->size()) {
          return UnimplementedError(where + " is missing: without param_shapes (a MoE "
                                    "checkpoint has none) it is what names the params of a "
                                    "partition (DeepSpeed >= 0.7 saves it)");
        }
        const Entries* entries = DictEntries((*all)[g].get());
        if (entries == nullptr) return DataLossError(where + " is " + (*all)[g]->DebugString());
        for (const auto& [k, v] : *entries) {
          auto name = StrOf(k.get());
          auto frag = FragmentOf(v.get());
          if (!name || !frag) {
            return DataLossError(where + ": entry " + k->DebugString() + ": " + v->DebugString() +
                                 " is not name: fragment_address(numel, start)");
          }
          const auto [numel, start] = *frag;
          if (numel <= 0 || start < 0 || start > parts[j].lean - numel) {
            return DataLossError(where + ": '" + *name + "' fragment_address(numel=" +
                                 std::to_string(numel) + ", start=" + std::to_string(start) +
                                 ") is outside the partition's " + std::to_string(parts[j].lean) +
                                 " elements");
          }
          auto [it, fresh] = frags.try_emplace(*name);
          if (fresh) order.push_back(*name);
          it->second.push_back({j, numel, start});
        }
      }
      // Params lie back to back from flat element 0 (flatten_dense_tensors_aligned), each
      // cut into consecutive fragments of consecutive partitions.
      int64_t off = 0;
      ParamList params;
      for (const std::string& local : order) {
        const std::vector<Fragment>& fs = frags[local];
        const PtFile& first = *optims[members[fs[0].j]];
        FC_ASSIGN_OR_RETURN(std::string name, global_name(local, e, first.name));
        int64_t at = off;
        for (const Fragment& fr : fs) {
          const int64_t pos = static_cast<int64_t>(fr.j) * ps + fr.start;
          if (pos != at) {
            return DataLossError(optims[members[fr.j]]->name + ": param_slice_mappings[" + gs +
                                 "]: '" + local + "' starts at flat element " +
                                 std::to_string(pos) + " of the group, expected " +
                                 std::to_string(at) + " (params back to back)");
          }
          at += fr.numel;
        }
        auto shape = moe_shapes_.find(name);
        if (shape == moe_shapes_.end()) {
          return DataLossError(first.name + ": param '" + name + "'" +
                               (name != local ? " (local '" + local + "')" : std::string()) +
                               " of param group " + gs +
                               " is in no module or expert file, so its shape is unknown");
        }
        const int64_t n = *CheckedNumElements(shape->second);
        if (n != at - off) {
          return DataLossError(first.name + ": param '" + name + "' has " +
                               std::to_string(at - off) + " elements in the partitions of group " +
                               gs + ", its module tensor " + ShapeText(shape->second) + " has " +
                               std::to_string(n));
        }
        for (const Fragment& fr : fs) {
          const RankPart& p = parts[fr.j];
          const PtFile& f = *optims[members[fr.j]];
          const int64_t lo = static_cast<int64_t>(fr.j) * ps + fr.start - off;
          const FlatRange range{lo, lo + fr.numel};
          const std::string what = f.name + ": param '" + name + "'";
          FC_ASSIGN_OR_RETURN(Chunk c, FlatChunk(p.fp32, f.index, shape->second, range, fr.start,
                                                 what));
          FC_RETURN_IF_ERROR(weights_.Add(name, p.fp32.dtype, shape->second, c, f.name));
          if (p.exp_avg) {
            FC_ASSIGN_OR_RETURN(c, FlatChunk(*p.exp_avg, f.index, shape->second, range, fr.start,
                                             what));
            FC_RETURN_IF_ERROR(exp_avg_.Add("optimizer.exp_avg." + name, p.exp_avg->dtype,
                                            shape->second, c, f.name));
          }
          if (p.exp_avg_sq) {
            FC_ASSIGN_OR_RETURN(c, FlatChunk(*p.exp_avg_sq, f.index, shape->second, range,
                                             fr.start, what));
            FC_RETURN_IF_ERROR(exp_avg_sq_.Add("optimizer.exp_avg_sq." + name,
                                               p.exp_avg_sq->dtype, shape->second, c, f.name));
          }
        }
        params.emplace_back(name, shape->second);
        off = at;
      }
      for (size_t j = 0; j < members.size(); ++j) {
        const int64_t want = std::clamp<int64_t>(off - static_cast<int64_t>(j) * ps, 0, ps);
        if (parts[j].padded != ps || parts[j].lean != want) {
          return DataLossError(optims[members[j]]->name + ": group " + gs + " partition " +
                               std::to_string(j) + " holds " + std::to_string(parts[j].lean) +
                               " elements + " + std::to_string(parts[j].padded - parts[j].lean) +
                               " padding; its params' " + std::to_string(off) +
                               " elements over " + std::to_string(count) + " partitions of " +
                               std::to_string(ps) + " need " + std::to_string(want) + " + " +
                               std::to_string(ps - want));
        }
      }
      master_dtype_ = std::string(DTypeName(parts[0].fp32.dtype));
      FC_RETURN_IF_ERROR(AddStep(*optims[members[0]], parts[0].state, static_cast<int64_t>(g),
                                 params));
    }
  }
  moe_optimizer_read_ = true;
  index_.attributes["deepspeed.ep_degree"] = std::to_string(max_ep);
  index_.attributes["deepspeed.moe_topology"] =
      *data_before_expert
          ? "data before expert (use_data_before_expert_parallelism): rank R is expert-parallel "
            "rank R / (dp / ep)"
          : "expert before data (DeepSpeed's default): rank R is expert-parallel rank R % ep";
  return Status::Ok();
}

// Frozen params (stage 2): full tensors in frozen_param_fragments.
Status Reader::AddFrozenFull(const PtFile& model) {
  const Entries* fshapes = DictEntries(model.root.Find("frozen_param_shapes"));
  const PV* frags = model.root.Find("frozen_param_fragments");
  if (fshapes != nullptr) {
    for (const auto& [k, v] : *fshapes) {
      auto name = StrOf(k.get());
      auto shape = ShapeOf(v.get());
      if (!name || !shape) {
        return DataLossError(model.name + ": frozen_param_shapes entry " + k->DebugString() +
                             " is not name: torch.Size");
      }
      FC_ASSIGN_OR_RETURN(Located l, model.Locate(frags ? frags->Find(*name) : nullptr,
                                                  "frozen_param_fragments['" + *name + "']"));
      if (l.shape != *shape) {
        return DataLossError(model.name + ": frozen_param_fragments['" + *name + "'] has shape " +
                             ShapeText(l.shape) + ", frozen_param_shapes says " +
                             ShapeText(*shape));
      }
      FC_RETURN_IF_ERROR(frozen_.Add(*name, l.dtype, l.shape,
                                     WholeChunk(l, model.index), model.name));
    }
  }
  return Status::Ok();
}

Status Reader::ReadZero3(const std::vector<const PtFile*>& models,
                         const std::vector<const PtFile*>& optims,
                         const std::vector<const PV*>& osds) {
  const int64_t ws = static_cast<int64_t>(optims.size());
  FC_ASSIGN_OR_RETURN(std::vector<ParamList> groups, ParamShapes(*models[0]));
  for (size_t k = 0; k < groups.size(); ++k) {
    const std::string ks = std::to_string(k);
    // Per-param partition size and offset inside the sub-group's flat buffer.
    std::vector<int64_t> pss, offs;
    int64_t sum = 0;
    for (const auto& [n, s] : groups[k]) {
      const int64_t numel = *CheckedNumElements(s);
      const int64_t ps = numel / ws + (numel % ws != 0 ? 1 : 0);
      offs.push_back(sum);
      pss.push_back(ps);
      auto next = CheckedAdd(sum, ps);
      if (!next) return OutOfRangeError(models[0]->name + ": sub-group " + ks + " overflows");
      sum = *next;
    }
    for (int64_t r = 0; r < ws; ++r) {
      const PtFile& f = *optims[static_cast<size_t>(r)];
      const PV* osd = osds[static_cast<size_t>(r)];
      const auto* flats = ListItems(osd->Find("fp32_flat_groups"));
      if (flats == nullptr || flats->size() != groups.size()) {
        return DataLossError(f.name + ": fp32_flat_groups has " +
                             (flats ? std::to_string(flats->size()) : "no") +
                             " sub-groups, param_shapes has " + std::to_string(groups.size()));
      }
      std::vector<std::pair<Builder*, std::optional<Located>>> sources;
      FC_ASSIGN_OR_RETURN(Located fp32,
                          f.Locate((*flats)[k].get(), "fp32_flat_groups[" + ks + "]"));
      master_dtype_ = std::string(DTypeName(fp32.dtype));
      const PV* inner = osd->Find("optimizer_state_dict");
      const PV* state = inner ? FindIntKey(inner->Find("state"), static_cast<int64_t>(k)) : nullptr;
      std::optional<Located> ea, eas;
      if (state != nullptr) {
        if (const PV* t = state->Find("exp_avg")) {
          FC_ASSIGN_OR_RETURN(ea, f.Locate(t, "optimizer_state_dict state[" + ks + "].exp_avg"));
        }
        if (const PV* t = state->Find("exp_avg_sq")) {
          FC_ASSIGN_OR_RETURN(eas,
                              f.Locate(t, "optimizer_state_dict state[" + ks + "].exp_avg_sq"));
        }
      }
      for (const auto& [what, l] : {std::pair<std::string, const Located*>{"fp32_flat_groups", &fp32},
                                    {"exp_avg", ea ? &*ea : nullptr},
                                    {"exp_avg_sq", eas ? &*eas : nullptr}}) {
        if (l != nullptr && (l->shape.size() != 1 || l->numel != sum)) {
          return DataLossError(f.name + ": " + what + " of sub-group " + ks + " has shape " +
                               ShapeText(l->shape) + ", expected [" + std::to_string(sum) +
                               "] (per-param ceil(numel/" + std::to_string(ws) + ") pieces)");
        }
      }
      for (size_t i = 0; i < groups[k].size(); ++i) {
        const auto& [name, shape] = groups[k][i];
        const int64_t n = *CheckedNumElements(shape);
        const int64_t ps = pss[i];
        const int64_t real = std::clamp<int64_t>(n - r * ps, 0, ps);
        if (real == 0) continue;
        const FlatRange range{r * ps, r * ps + real};
        const std::string what = f.name + ": param '" + name + "'";
        FC_ASSIGN_OR_RETURN(Chunk c, FlatChunk(fp32, f.index, shape, range, offs[i], what));
        FC_RETURN_IF_ERROR(weights_.Add(name, fp32.dtype, shape, c, f.name));
        if (ea) {
          FC_ASSIGN_OR_RETURN(c, FlatChunk(*ea, f.index, shape, range, offs[i], what));
          FC_RETURN_IF_ERROR(exp_avg_.Add("optimizer.exp_avg." + name, ea->dtype,
                                          shape, c, f.name));
        }
        if (eas) {
          FC_ASSIGN_OR_RETURN(c, FlatChunk(*eas, f.index, shape, range, offs[i], what));
          FC_RETURN_IF_ERROR(exp_avg_sq_.Add("optimizer.exp_avg_sq." + name,
                                             eas->dtype, shape, c, f.name));
        }
      }
      if (r == 0) FC_RETURN_IF_ERROR(AddStep(f, state, static_cast<int64_t>(k), groups[k]));
    }
  }
  return AddFrozenZero3(models);
}

// ZeRO-3 frozen params: each rank's model states hold its ceil-div partition (padded).
Status Reader::AddFrozenZero3(const std::vector<const PtFile*>& models) {
  const int64_t ws = static_cast<int64_t>(models.size());
  const Entries* fshapes = DictEntries(models[0]->root.Find("frozen_param_shapes"));
  if (fshapes != nullptr) {
    for (const auto& [key, v] : *fshapes) {
      auto name = StrOf(key.get());
      auto shape = ShapeOf(v.get());
      if (!name || !shape) {
        return DataLossError(models[0]->name + ": frozen_param_shapes entry " +
                             key->DebugString() + " is not name: torch.Size");
      }
      const int64_t n = *CheckedNumElements(*shape);
      const int64_t ps = n / ws + (n % ws != 0 ? 1 : 0);
      for (int64_t r = 0; r < ws; ++r) {
        const PtFile& m = *models[static_cast<size_t>(r)];
        const PV* frags = m.root.Find("frozen_param_fragments");
        FC_ASSIGN_OR_RETURN(Located l, m.Locate(frags ? frags->Find(*name) : nullptr,
                                                "frozen_param_fragments['" + *name + "']"));
        if (l.shape.size() != 1 || l.numel != ps) {
          return DataLossError(m.name + ": frozen_param_fragments['" + *name + "'] has shape " +
                               ShapeText(l.shape) + ", expected [" + std::to_string(ps) + "]");
        }
        const int64_t real = std::clamp<int64_t>(n - r * ps, 0, ps);
        if (real == 0) continue;
        FC_ASSIGN_OR_RETURN(Chunk c, FlatChunk(l, m.index, *shape, FlatRange{r * ps, r * ps + real},
                                               0, m.name + ": frozen '" + *name + "'"));
        FC_RETURN_IF_ERROR(frozen_.Add(*name, l.dtype, *shape, c, m.name));
      }
    }
  }
  return Status::Ok();
}

// module tensors, buffers, the remaining module tensors and tied aliases.
Status Reader::AddModule(const PtFile& model, bool zero3_placeholders) {
  const PV* module = model.root.Find("module");
  const Entries* entries = DictEntries(module);
  if (module != nullptr && !module->is_none() && entries == nullptr) {
    return DataLossError(model.name + ": module is " + module->DebugString() +
                         ", expected a dict of tensors");
  }
  if (module == nullptr || module->is_none()) {
    if (!pipeline_) {
      return DataLossError(model.name + ": module is None, but there are no pipeline layer "
                           "files (layer_XX-model_YY-model_states.pt) holding the weights");
    }
  }
  std::set<std::string> buffer_names;
  if (const auto* b = ListItems(model.root.Find("buffer_names"))) {
    for (const auto& i : *b) {
      if (auto s = StrOf(i.get())) buffer_names.insert(*s);
    }
  }
  for (const auto& [k, v] : entries ? *entries : Entries()) {
    auto name = StrOf(k.get());
    if (!name) return DataLossError(model.name + ": module key " + k->DebugString());
    if (v->is_none()) continue;
    FC_ASSIGN_OR_RETURN(Located l, model.Locate(v.get(), "module['" + *name + "']"));
    if (zero3_placeholders && l.numel == 0 && !buffer_names.count(*name)) continue;
    if (module_dtype_.empty() && !buffer_names.count(*name)) {
      module_dtype_ = std::string(DTypeName(l.dtype));
    }
    Chunk c = WholeChunk(l, model.index);
    FC_RETURN_IF_ERROR(module_.Add("module." + *name, l.dtype, l.shape, c, model.name));
    const std::string key = *name;
    if (buffer_names.count(*name)) {
      FC_RETURN_IF_ERROR(buffers_.Add(key, l.dtype, l.shape, c, model.name));
    } else if (!weights_.Has(key) && !frozen_.Has(key)) {
      FC_RETURN_IF_ERROR(other_.Add(key, l.dtype, l.shape, c, model.name));
    }
  }
  if (const Entries* shared = DictEntries(model.root.Find("shared_params"))) {
    for (const auto& [k, v] : *shared) {
      auto alias = StrOf(k.get());
      auto owner = StrOf(v.get());
      if (!alias || !owner) {
        return DataLossError(model.name + ": shared_params entry " + k->DebugString() + ": " +
                             v->DebugString() + " is not alias: owner");
      }
      aliases_[*alias] = *owner;
    }
  }
  return Status::Ok();
}

// MoE expert files: each a state dict of one expert's params under their full names (the
// global expert id in the name), 16-bit like the module weights.
Status Reader::AddExpertFiles(const std::vector<const PtFile*>& files) {
  for (const PtFile* f : files) {
    const Entries* entries = DictEntries(&f->root);
    if (entries == nullptr) {
      return DataLossError(f->name + ": holds " + f->root.DebugString() +
                           ", expected the expert's state dict");
    }
    for (const auto& [k, v] : *entries) {
      auto name = StrOf(k.get());
      if (!name) return DataLossError(f->name + ": state dict key " + k->DebugString());
      if (v->is_none()) continue;
      FC_ASSIGN_OR_RETURN(Located l, f->Locate(v.get(), "['" + *name + "']"));
      if (module_.Has("module." + *name)) {
        return DataLossError(f->name + ": '" + *name + "' is also in another model states or "
                             "expert file");
      }
      if (module_dtype_.empty()) module_dtype_ = std::string(DTypeName(l.dtype));
      const Chunk c = WholeChunk(l, f->index);
      FC_RETURN_IF_ERROR(module_.Add("module." + *name, l.dtype, l.shape, c, f->name));
      if (!weights_.Has(*name) && !frozen_.Has(*name)) {
        FC_RETURN_IF_ERROR(other_.Add(*name, l.dtype, l.shape, c, f->name));
      }
    }
  }
  return Status::Ok();
}

Status Reader::ReadRank(int64_t mp, RankFiles& rf) {
  std::vector<const PtFile*> optims;
  for (const auto& [dp, f] : rf.optim) {
    if (dp != static_cast<int64_t>(optims.size())) {
      return NotFoundError(dir_ + ": optimizer file of DP rank " + std::to_string(optims.size()) +
                           " for mp_rank_" + (mp < 10 ? "0" : "") + std::to_string(mp) +
                           " is missing");
    }
    optims.push_back(f);
  }
  std::vector<const PV*> osds;
  for (const PtFile* f : optims) {
    const PV* osd = f->root.Find("optimizer_state_dict");
    if (osd == nullptr || DictEntries(osd) == nullptr) {
      return DataLossError(f->name + ": no optimizer_state_dict dict");
    }
    osds.push_back(osd);
    if (auto v = StrOf(f->root.Find("ds_version"))) SetAttr("deepspeed.ds_version", *v, f->name);
  }
  std::string variant = "none";
  int64_t stage = 0;
  if (!osds.empty()) {
    const PV* osd = osds[0];
    if (osd->Find("fp32_flat_groups") != nullptr) {
      variant = "zero3";
      stage = 3;
    } else if (const PV* zs = osd->Find("zero_stage")) {
      auto s = IntOf(zs);
      if (!s || *s < 0 || *s > 3) {
        return DataLossError(optims[0]->name + ": zero_stage is " + zs->DebugString());
      }
      variant = "zero";
      stage = *s;
    } else if (osd->Find("single_partition_of_fp32_groups") != nullptr) {
      variant = "bf16_optimizer";
      stage = 1;
    } else {
      return UnimplementedError(optims[0]->name + ": optimizer_state_dict is neither ZeRO "
                                "(zero_stage / fp32_flat_groups) nor BF16_Optimizer");
    }
    if (moe_) {
      if (variant == "zero3") {
        // ZeRO-3 with MoE: not known how its expert groups lie in the files; the module and
        // expert weights are read, the optimizer files are not.
        SetAttr("deepspeed.optimizer", "not read (MoE)", optims[0]->name);
        SetAttr("deepspeed.zero_stage", "not read (MoE)", optims[0]->name);
        if (rf.model == nullptr) {
          return UnimplementedError(optims[0]->name + ": MoE checkpoint with a " + variant +
                                    " optimizer and no mp_rank_XX_model_states.pt: not read");
        }
        return AddModule(*rf.model, false);
      }
      if (rf.model == nullptr) {
        return NotFoundError(dir_ + ": mp_rank_00_model_states.pt is missing");
      }
      SetAttr("deepspeed.zero_stage", std::to_string(stage), optims[0]->name);
      SetAttr("deepspeed.optimizer", variant, optims[0]->name);
      SetAttr("deepspeed.dp_degree", std::to_string(optims.size()), optims[0]->name);
      FC_RETURN_IF_ERROR(ReadMoeZero12(optims, osds, variant == "bf16_optimizer"));
      return AddModule(*rf.model, false);
    }
    for (size_t r = 0; r < osds.size(); ++r) {
      const PV* pc = osds[r]->Find("partition_count");
      std::optional<int64_t> count = IntOf(pc);
      if (!count && pc != nullptr && ListItems(pc) != nullptr) {
        for (const auto& i : *ListItems(pc)) {
          auto c = IntOf(i.get());
          if (!c) break;
          if (count && *count != *c) {
            // deepspeed.md gives only that expert groups have their own DP size: not which
            // file holds which partition of such a group, nor the expert params' names
            // across expert-parallel ranks (param_shapes is DP rank 0's). Not guessed.
            return UnimplementedError(
                optims[r]->name + ": partition_count differs per param group (" +
                pc->DebugString() + ": MoE expert groups partitioned over their own DP size); "
                "how such a group's partitions lie in the optimizer files is not known to fc, "
                "so this checkpoint is not read");
          }
          count = c;
        }
      }
      if (!count || *count != static_cast<int64_t>(osds.size())) {
        return DataLossError(optims[r]->name + ": partition_count is " +
                             (pc ? pc->DebugString() : std::string("missing")) + " but there are " +
                             std::to_string(osds.size()) + " optimizer files for this TP rank");
      }
    }
  }
  SetAttr("deepspeed.zero_stage", std::to_string(stage), "mp rank " + std::to_string(mp));
  SetAttr("deepspeed.optimizer", variant, "mp rank " + std::to_string(mp));
  SetAttr("deepspeed.dp_degree", std::to_string(std::max<size_t>(1, optims.size())), "");
  if (variant == "zero3") {
    std::vector<const PtFile*> models;
    for (const auto& [dp, f] : rf.model_z3) {
      if (dp != static_cast<int64_t>(models.size())) {
        return NotFoundError(dir_ + ": ZeRO-3 model states of DP rank " +
                             std::to_string(models.size()) + " are missing");
      }
      models.push_back(f);
    }
    if (models.size() != optims.size()) {
      return NotFoundError(dir_ + ": " + std::to_string(models.size()) +
                           " ZeRO-3 model state files for " + std::to_string(optims.size()) +
                           " optimizer files");
    }
    FC_RETURN_IF_ERROR(ReadZero3(models, optims, osds));
    return AddModule(*models[0], /*zero3_placeholders=*/true);
  }
  if (universal_ && rf.model == nullptr && !rf.model_z3.empty()) {
    // A stage-3 UCP keeps the per-rank model states (frozen fragments, buffers); the
    // trainable params are in zero/<param>/.
    std::vector<const PtFile*> models;
    for (const auto& [dp, f] : rf.model_z3) {
      if (dp != static_cast<int64_t>(models.size())) {
        return NotFoundError(dir_ + ": ZeRO-3 model states of DP rank " +
                             std::to_string(models.size()) + " are missing");
      }
      models.push_back(f);
    }
    FC_RETURN_IF_ERROR(AddFrozenZero3(models));
    return AddModule(*models[0], /*zero3_placeholders=*/true);
  }
  if (rf.model == nullptr && !rf.model_z3.empty()) {
    return NotFoundError(dir_ + ": ZeRO-3 model states without their *_optim_states.pt files "
                         "(the ZeRO-3 weights live only in the optimizer partitions)");
  }
  if (rf.model == nullptr) {
    return NotFoundError(dir_ + ": mp_rank_" + std::string(mp < 10 ? "0" : "") +
                         std::to_string(mp) + "_model_states.pt is missing");
  }
  if (!optims.empty()) {
    FC_RETURN_IF_ERROR(ReadZero12(*rf.model, optims, osds, variant == "bf16_optimizer"));
  } else if (universal_) {
    FC_RETURN_IF_ERROR(AddFrozenFull(*rf.model));
  }
  return AddModule(*rf.model, false);
}

Families Reader::TakeFamilies() {
  Families f;
  Builder* builders[kFamilies] = {&weights_, &frozen_,  &buffers_,    &other_,
                                  &module_,  &exp_avg_, &exp_avg_sq_, &step_};
  for (size_t i = 0; i < kFamilies; ++i) f.tensors[i] = builders[i]->Take();
  f.aliases = std::move(aliases_);
  aliases_.clear();
  return f;
}

std::string MpName(int64_t mp) {
  return std::string("mp_rank_") + (mp < 10 ? "0" : "") + std::to_string(mp);
}

// Pipeline stages hold disjoint layers, except tied modules (DeepSpeed's
// pipeline_replicated_parameter_patterns), which every stage using them trains and saves:
// the first stage's copy is kept, as ds_to_universal does.
Status UnionStage(Families&& from, const std::string& where, Families* into) {
  for (size_t i = 0; i < kFamilies; ++i) {
    std::map<std::string, size_t> pos;
    for (size_t j = 0; j < into->tensors[i].size(); ++j) pos[into->tensors[i][j].key] = j;
    for (TensorEntry& t : from.tensors[i]) {
      auto it = pos.find(t.key);
      if (it != pos.end()) {
        const TensorEntry& have = into->tensors[i][it->second];
        if (have.dtype != t.dtype || have.global_shape != t.global_shape) {
          return DataLossError(where + ": tensor '" + t.key + "' is " +
                               std::string(DTypeName(t.dtype)) + " " + ShapeText(t.global_shape) +
                               " here but " + std::string(DTypeName(have.dtype)) + " " +
                               ShapeText(have.global_shape) + " in an earlier pipeline stage");
        }
        continue;
      }
      pos[t.key] = into->tensors[i].size();
      into->tensors[i].push_back(std::move(t));
    }
  }
  for (auto& [alias, owner] : from.aliases) into->aliases.emplace(alias, owner);
  return Status::Ok();
}

Status Reader::AddLayerFiles(const std::vector<std::pair<int64_t, const PtFile*>>& layers,
                             const std::set<std::string>& buffer_names,
                             const std::set<std::string>& known_params, Families* f) {
  // Trainable and frozen names the optimizer files know; a UCP's come from param_shapes
  // (known_params), its zero/<param> files being read later.
  std::set<std::string> params = known_params;
  for (Family i : {kWeights, kFrozen}) {
    for (const TensorEntry& t : f->tensors[i]) params.insert(t.key);
  }
  std::map<std::string, size_t> module_pos;
  std::set<std::string> buffers, others;
  for (const TensorEntry& t : f->tensors[kModule]) module_pos[t.key] = 0;
  for (const TensorEntry& t : f->tensors[kBuffers]) buffers.insert(t.key);
  for (const TensorEntry& t : f->tensors[kOther]) others.insert(t.key);
  for (const auto& [layer, file] : layers) {
    const Entries* entries = DictEntries(&file->root);
    if (entries == nullptr) {
      return DataLossError(file->name + ": holds " + file->root.DebugString() +
                           ", expected the layer's state dict");
    }
    for (const auto& [k, v] : *entries) {
      auto local = StrOf(k.get());
      if (!local) return DataLossError(file->name + ": state dict key " + k->DebugString());
      if (v->is_none()) continue;
      // PipelineModule names a layer's params "<layer index>.<local name>"; a tied module
      // (TiedLayerSpec without forward_fn) is saved under every layer index using it, and
      // its params are named "tied_modules.<key>.<local name>".
      std::string name = std::to_string(layer) + "." + *local;
      if (!params.empty() && !params.count(name) && !buffer_names.count(name)) {
        std::string found;
        int hits = 0;
        for (const std::string& p : params) {
          if (!p.starts_with("tied_modules.") || !p.ends_with("." + *local)) continue;
          const std::string key = p.substr(13, p.size() - 13 - local->size() - 1);
          if (!key.empty() && key.find('.') == std::string::npos) {
            found = p;
            ++hits;
          }
        }
        if (hits == 1) name = found;
      }
      FC_ASSIGN_OR_RETURN(Located l, file->Locate(v.get(), "['" + *local + "']"));
      TensorEntry t;
      t.key = "module." + name;
      t.dtype = l.dtype;
      t.global_shape = l.shape;
      t.chunks.push_back(WholeChunk(l, file->index));
      if (auto it = module_pos.find(t.key); it != module_pos.end()) {
        // A tied module saved again by a later layer index: the first copy is kept.
        const TensorEntry& have = f->tensors[kModule][it->second];
        if (have.dtype != t.dtype || have.global_shape != t.global_shape) {
          return DataLossError(file->name + ": '" + *local + "' (" + name + ") is " +
                               std::string(DTypeName(t.dtype)) + " " + ShapeText(t.global_shape) +
                               ", an earlier layer file has " + std::string(DTypeName(have.dtype)) +
                               " " + ShapeText(have.global_shape));
        }
        continue;
      }
      module_pos[t.key] = f->tensors[kModule].size();
      if (module_dtype_.empty() && !buffer_names.count(name)) {
        module_dtype_ = std::string(DTypeName(l.dtype));
      }
      TensorEntry plain = t;
      plain.key = name;
      f->tensors[kModule].push_back(std::move(t));
      if (buffer_names.count(name)) {
        if (buffers.insert(name).second) f->tensors[kBuffers].push_back(std::move(plain));
      } else if (!params.count(name) && others.insert(name).second) {
        f->tensors[kOther].push_back(std::move(plain));
      }
    }
  }
  return Status::Ok();
}

Result<Families> Reader::MergeTp(std::vector<Families> per_tp, const TpRules* rules) {
  const int64_t tp = static_cast<int64_t>(per_tp.size());
  if (tp == 1) return std::move(per_tp[0]);
  Families out;
  // Reads the TP copies that are compared (replicated tensors, buffers); the files are the
  // index's so far.
  ChunkReader reader(index_, ChunkReaderOptions{.verify_checksums = false});
  // Module buffers (buffer_names) that no rule splits: one tensor when their TP copies are
  // equal, else per rank (see below): name -> "" (equal) or why not.
  std::map<std::string, std::string> buffer_verdict;
  auto note_per_rank = [&] {
    std::string per_rank;
    for (const auto& [name, why] : buffer_verdict) {
      if (!why.empty()) per_rank += (per_rank.empty() ? "" : "; ") + name + " (" + why + ")";
    }
    if (!per_rank.empty()) index_.attributes["deepspeed.tp_buffers_per_rank"] = per_rank;
  };
  // One buffer's TP copies (`parts`, family i): one tensor (TP rank 0's) when equal, else one
  // per rank, <family prefix>mp_rank_YY.<name>.
  auto add_buffer = [&](size_t i, const std::string& name,
                        const std::vector<TensorEntry*>& parts) -> Status {
    auto [v, fresh] = buffer_verdict.emplace(name, std::string());
    if (fresh) {
      FC_ASSIGN_OR_RETURN(v->second, BufferCopiesDiffer(parts, reader));
    }
    if (v->second.empty()) {
      out.tensors[i].push_back(std::move(*parts[0]));  // equal copies: TP rank 0's
      return Status::Ok();
    }
    for (int64_t t = 0; t < tp; ++t) {
      TensorEntry e = *parts[static_cast<size_t>(t)];
      e.key = std::string(kFamilyPrefix[i]) + MpName(t) + "." + name;
      out.tensors[i].push_back(std::move(e));
    }
    return Status::Ok();
  };
  if (options_.tp_axis) {
    // The user's rules say how every tensor merges; universal_checkpoint_info is not used.
    // A buffer the rules give no axis follows the buffer rule below (each TP rank loads its
    // own buffers): its copies are not refused when they differ, they stay per rank.
    std::set<std::string> buffer_names;
    for (const Families& f : per_tp) {
      for (const TensorEntry& e : f.tensors[kBuffers]) buffer_names.insert(e.key);
    }
    for (size_t i = 0; i < kFamilies; ++i) {
      std::vector<std::map<std::string, TensorEntry*>> by_rank(static_cast<size_t>(tp));
      for (int64_t t = 0; t < tp; ++t) {
        for (TensorEntry& e : per_tp[static_cast<size_t>(t)].tensors[i]) {
          by_rank[static_cast<size_t>(t)][e.key] = &e;
        }
        if (by_rank[static_cast<size_t>(t)].size() != per_tp[0].tensors[i].size()) {
          return DataLossError(dir_ + ": TP rank " + std::to_string(t) + " holds " +
                               std::to_string(by_rank[static_cast<size_t>(t)].size()) +
                               " tensors of a kind where TP rank 0 holds " +
                               std::to_string(per_tp[0].tensors[i].size()));
        }
      }
      for (const TensorEntry& e0 : per_tp[0].tensors[i]) {
        std::vector<TensorEntry*> parts;
        for (int64_t t = 0; t < tp; ++t) {
          auto it = by_rank[static_cast<size_t>(t)].find(e0.key);
          if (it == by_rank[static_cast<size_t>(t)].end()) {
            return DataLossError(dir_ + ": tensor '" + e0.key + "' of TP rank 0 is absent from "
                                 "TP rank " + std::to_string(t));
          }
          parts.push_back(it->second);
        }
        const std::string name = e0.key.substr(kFamilyPrefix[i].size());
        if ((i == kBuffers || i == kModule) && buffer_names.count(name) &&
            !options_.tp_axis(name)) {
          FC_RETURN_IF_ERROR(add_buffer(i, name, parts));
          continue;
        }
        TensorEntry m;
        FC_RETURN_IF_ERROR(MergeBySourceSplit(name, i == kStep, parts, &m, reader));
        out.tensors[i].push_back(std::move(m));
      }
    }
    out.aliases = per_tp[0].aliases;
    note_per_rank();
    return out;
  }
  if (rules == nullptr) {
    for (int64_t t = 0; t < tp; ++t) {
      const std::string pre = MpName(t) + ".";
      for (size_t i = 0; i < kFamilies; ++i) {
        for (TensorEntry& e : per_tp[static_cast<size_t>(t)].tensors[i]) {
          e.key = pre + e.key;
          out.tensors[i].push_back(std::move(e));
        }
      }
      for (const auto& [a, o] : per_tp[static_cast<size_t>(t)].aliases) {
        out.aliases[pre + a] = pre + o;
      }
    }
    return out;
  }
  std::set<std::string> unmerged;
  // Module buffers (buffer_names): in no optimizer group, so universal_checkpoint_info's
  // default (concatenate along dim 0) is not theirs: ds_to_universal merges only the params
  // of param_shapes (for other module entries it saves the first mp_rank file's copy) and
  // each TP rank loads its own buffers from its model states. A buffer that an explicit
  // pattern matches follows it; any other is one tensor when its TP copies are equal and
  // stays per rank (deepspeed.tp_buffers_per_rank) when they differ.
  std::set<std::string> buffer_names;
  for (const Families& f : per_tp) {
    for (const TensorEntry& e : f.tensors[kBuffers]) buffer_names.insert(e.key);
  }
  for (size_t i = 0; i < kFamilies; ++i) {
    std::vector<std::map<std::string, TensorEntry*>> by_rank(static_cast<size_t>(tp));
    for (int64_t t = 0; t < tp; ++t) {
      for (TensorEntry& e : per_tp[static_cast<size_t>(t)].tensors[i]) {
        by_rank[static_cast<size_t>(t)][e.key] = &e;
      }
      for (const auto& [k, e] : by_rank[static_cast<size_t>(t)]) {
        if (!by_rank[0].count(k) && t > 0) {
          return DataLossError(dir_ + ": tensor '" + k + "' of TP rank " + std::to_string(t) +
                               " is absent from TP rank 0");
        }
      }
    }
    for (const TensorEntry& e0 : per_tp[0].tensors[i]) {
      std::vector<TensorEntry*> parts;
      for (int64_t t = 0; t < tp; ++t) {
        auto it = by_rank[static_cast<size_t>(t)].find(e0.key);
        if (it == by_rank[static_cast<size_t>(t)].end()) {
          return DataLossError(dir_ + ": tensor '" + e0.key + "' of TP rank 0 is absent from TP "
                               "rank " + std::to_string(t));
        }
        parts.push_back(it->second);
      }
      const std::string name = e0.key.substr(kFamilyPrefix[i].size());
      // A buffer matching tp_replicated_parameter_patterns (DeepSpeed's first rule) takes
      // this rule too: ds_to_universal never compares buffers (it saves the first mp_rank
      // file's), so copies that differ stay per rank rather than being refused.
      if ((i == kBuffers || i == kModule) && buffer_names.count(name) &&
          (TpRules::Matches(rules->replicated, name) ||
           (!TpRules::Matches(rules->average, name) &&
            !TpRules::Matches(rules->two_sub_params, name) &&
            !TpRules::Matches(rules->sub_params, name) &&
            !TpRules::Matches(rules->row_parallel, name) &&
            !TpRules::Matches(rules->vocabulary, name)))) {
        FC_RETURN_IF_ERROR(add_buffer(i, name, parts));
        continue;
      }
      for (size_t t = 1; t < parts.size(); ++t) {
        const TensorEntry& e = *parts[t];
        if (e.dtype != e0.dtype || e.global_shape.size() != e0.global_shape.size()) {
          return DataLossError(dir_ + ": tensor '" + e0.key + "' is " +
                               std::string(DTypeName(e0.dtype)) + " " + ShapeText(e0.global_shape) +
                               " on TP rank 0 but " + std::string(DTypeName(e.dtype)) + " " +
                               ShapeText(e.global_shape) + " on TP rank " + std::to_string(t));
        }
      }
      auto differs_on = [&](size_t except_dim) -> int64_t {
        for (size_t t = 1; t < parts.size(); ++t) {
          for (size_t d = 0; d < e0.global_shape.size(); ++d) {
            if (d != except_dim && parts[t]->global_shape[d] != e0.global_shape[d]) {
              return static_cast<int64_t>(t);
            }
          }
        }
        return 0;
      };
      auto shape_error = [&](int64_t t, const std::string& rule) {
        return DataLossError(dir_ + ": TP slices of '" + e0.key + "' (" + rule + ") are " +
                             ShapeText(e0.global_shape) + " on TP rank 0 and " +
                             ShapeText(parts[static_cast<size_t>(t)]->global_shape) +
                             " on TP rank " + std::to_string(t));
      };
      if (i == kStep || TpRules::Matches(rules->replicated, name)) {
        // Replicated across TP (layernorms, the step): TP rank 0's copy, once every other
        // copy is found equal to it (ds_to_universal's merge_tp_slices asserts the same of
        // fp32, exp_avg and exp_avg_sq; fc also compares the 16-bit module weights it
        // exports). The step is TP rank 0's without a comparison, as in ds_to_universal.
        if (int64_t t = differs_on(SIZE_MAX)) return shape_error(t, "replicated");
        if (i != kStep) {
          FC_ASSIGN_OR_RETURN(std::optional<ReplicaDifference> d,
                              FirstReplicaDifference(parts, reader));
          if (d) return ReplicasDiffer(e0.key, parts, *d, "tp_replicated_parameter_patterns");
        }
        out.tensors[i].push_back(std::move(*parts[0]));
        continue;
      }
      std::string why;
      const auto [sub_rule, sub_pattern] = TpRules::Matches(rules->two_sub_params, name)
                                               ? std::pair<const SubParamRule*, std::string>()
                                               : rules->MatchSubParams(name);  // DeepSpeed's order
      if (TpRules::Matches(rules->average, name)) {
        why = "parameter_to_average_patterns: the merged value is the mean of the TP copies, "
              "which fc does not compute";
      } else if (e0.global_shape.empty()) {
        why = "a 0-d tensor matching no replicated pattern cannot be concatenated";
      }
      if (!why.empty()) {
        unmerged.insert(name + " (" + why + ")");
        for (int64_t t = 0; t < tp; ++t) {
          TensorEntry e = *parts[static_cast<size_t>(t)];
          e.key = MpName(t) + "." + e.key;
          out.tensors[i].push_back(std::move(e));
        }
        continue;
      }
      const size_t item = DTypeSize(e0.dtype);
      TensorEntry m;
      m.key = e0.key;
      m.dtype = e0.dtype;
      m.global_shape = e0.global_shape;
      if (sub_rule != nullptr) {
        FC_RETURN_IF_ERROR(MergeSubParams(*rules, *sub_rule, sub_pattern, e0.key, parts, &m));
      } else if (TpRules::Matches(rules->two_sub_params, name)) {
        // Each slice is torch.chunk(slice, 2, dim 0): its first ceil(rows/2) rows belong to
        // sub-param 0; the merged tensor is all first halves, then all second halves.
        if (int64_t t = differs_on(0)) return shape_error(t, "2 sub-params along dim 0");
        int64_t first_total = 0, rows_total = 0;
        for (const TensorEntry* p : parts) {
          first_total += (p->global_shape[0] + 1) / 2;
          rows_total += p->global_shape[0];
        }
        int64_t first = 0, second = first_total;
        for (const TensorEntry* p : parts) {
          const int64_t rows = p->global_shape[0], half = (rows + 1) / 2;
          for (const Chunk& c : p->chunks) {
            if (auto s = RowSlice(c, 0, half, item)) {
              s->box.global_offset[0] += first;
              m.chunks.push_back(std::move(*s));
            }
            if (auto s = RowSlice(c, half, rows, item)) {
              s->box.global_offset[0] += second - half;
              m.chunks.push_back(std::move(*s));
            }
          }
          first += half;
          second += rows - half;
        }
        m.global_shape[0] = rows_total;
      } else {
        const size_t d = TpRules::Matches(rules->row_parallel, name) ? 1 : 0;
        if (d >= e0.global_shape.size()) {
          return DataLossError(dir_ + ": '" + e0.key + "' has shape " + ShapeText(e0.global_shape) +
                               ", its TP slices cannot be concatenated along dim " +
                               std::to_string(d) + " (row-parallel pattern in " + rules->source +
                               ")");
        }
        if (int64_t t = differs_on(d)) {
          return shape_error(t, "concatenated along dim " + std::to_string(d));
        }
        int64_t off = 0;
        for (const TensorEntry* p : parts) {
          for (const Chunk& c : p->chunks) {
            Chunk s = c;
            s.box.global_offset[d] += off;
            m.chunks.push_back(std::move(s));
          }
          off += p->global_shape[d];
        }
        m.global_shape[d] = off;
      }
      if (TpRules::Matches(rules->vocabulary, name)) {
        // Vocabulary padding rows (the tail of the last TP slices) are dropped.
        if (!rules->original_vocab_size) {
          return DataLossError(rules->source + ": vocabulary_parameter_patterns matches '" +
                               name + "' but universal_checkpoint_info has no original_vocab_size");
        }
        const int64_t vocab = *rules->original_vocab_size;
        if (vocab > m.global_shape[0]) {
          return DataLossError(rules->source + ": original_vocab_size " + std::to_string(vocab) +
                               " exceeds the " + std::to_string(m.global_shape[0]) +
                               " merged rows of '" + e0.key + "'");
        }
        std::vector<Chunk> kept;
        for (const Chunk& c : m.chunks) {
          if (auto s = RowSlice(c, 0, vocab, item)) kept.push_back(std::move(*s));
        }
        m.chunks = std::move(kept);
        m.global_shape[0] = vocab;
      }
      out.tensors[i].push_back(std::move(m));
    }
  }
  out.aliases = per_tp[0].aliases;
  if (!unmerged.empty()) {
    std::string s;
    for (const std::string& u : unmerged) s += (s.empty() ? "" : "; ") + u;
    index_.attributes["deepspeed.tp_unmerged"] = s;
  }
  note_per_rank();
  return out;
}

Result<std::optional<ReplicaDifference>> Reader::FirstReplicaDifference(
    const std::vector<TensorEntry*>& parts, ChunkReader& reader) const {
  const TensorEntry& e0 = *parts[0];
  const Shape& shape = e0.global_shape;
  const uint64_t item = DTypeSize(e0.dtype);
  FC_ASSIGN_OR_RETURN(const int64_t n, CheckedNumElements(shape));
  if (n == 0 || parts.size() < 2) return std::optional<ReplicaDifference>();
  // Pieces of options_.replica_piece_bytes per copy (at least one element); a strided copy
  // is read whole by CopyChunkRegion anyway, so its span is the piece then.
  uint64_t budget = std::max<uint64_t>(options_.replica_piece_bytes, item);
  for (const TensorEntry* p : parts) {
    for (const Chunk& c : p->chunks) {
      if (!c.strides.empty()) budget = std::max(budget, c.byte_length);
    }
  }
  // A piece: one index of each dim before k, a run of `rows` indices of dim k, all of the
  // dims after it (`inner` elements per index of dim k): row-major contiguous in the tensor.
  const size_t rank = shape.size();
  size_t k = 0;
  int64_t inner = 1, rows = 1;
  if (rank > 0) {
    std::vector<int64_t> after(rank, 1);  // products of trailing dims, at most n
    for (size_t d = rank - 1; d-- > 0;) after[d] = after[d + 1] * shape[d + 1];
    while (k + 1 < rank && static_cast<uint64_t>(after[k]) * item > budget) ++k;
    inner = after[k];
    rows = std::clamp<int64_t>(
        static_cast<int64_t>(budget / (static_cast<uint64_t>(inner) * item)), 1, shape[k]);
  }
  const size_t piece_bytes = static_cast<size_t>(static_cast<uint64_t>(rows * inner) * item);
  std::vector<std::byte> want(piece_bytes), got(piece_bytes);
  std::vector<int64_t> outer(k, 0);
  for (bool more = true; more;) {
    for (int64_t lo = 0; lo < (rank > 0 ? shape[k] : 1); lo += rows) {
      Box box = Box::Whole(shape);
      int64_t count = 1;
      if (rank > 0) {
        for (size_t d = 0; d < k; ++d) {
          box.global_offset[d] = outer[d];
          box.local_shape[d] = 1;
        }
        box.global_offset[k] = lo;
        box.local_shape[k] = std::min(rows, shape[k] - lo);
        count = box.local_shape[k] * inner;
      }
      const int64_t first = rank > 0 ? Ravel(box.global_offset, shape) : 0;
      const size_t bytes = static_cast<size_t>(static_cast<uint64_t>(count) * item);
      auto fill = [&](const TensorEntry& e, std::vector<std::byte>& buf) -> Status {
        std::fill(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(bytes), std::byte{0});
        for (const Chunk& c : e.chunks) {
          FC_RETURN_IF_ERROR(reader.CopyChunkRegion(e, c, box, buf.data(), box));
        }
        return Status::Ok();
      };
      FC_RETURN_IF_ERROR(fill(e0, want));
      for (size_t t = 1; t < parts.size(); ++t) {
        FC_RETURN_IF_ERROR(fill(*parts[t], got));
        if (std::memcmp(want.data(), got.data(), bytes) == 0) continue;
        for (int64_t j = 0; j < count; ++j) {
          const std::byte* a = want.data() + static_cast<size_t>(j) * item;
          const std::byte* b = got.data() + static_cast<size_t>(j) * item;
          if (SameElement(e0.dtype, a, b)) continue;
          return std::optional(ReplicaDifference{t, first + j, ElementText(e0.dtype, a),
                                                 ElementText(e0.dtype, b)});
        }
      }
    }
    more = false;
    for (size_t d = k; d-- > 0;) {
      if (++outer[d] < shape[d]) {
        more = true;
        break;
      }
      outer[d] = 0;
    }
  }
  return std::optional<ReplicaDifference>();
}

std::string Reader::FileOfElement(const TensorEntry& e, int64_t element) const {
  const Shape at = e.global_shape.empty() ? Shape() : Unravel(element, e.global_shape);
  for (const Chunk& c : e.chunks) {
    if (c.box.rank() != at.size() || c.file >= files_.size()) continue;
    Shape local(at.size());
    bool inside = true;
    for (size_t d = 0; d < at.size() && inside; ++d) {
      local[d] = at[d] - c.box.global_offset[d];
      inside = local[d] >= 0 && local[d] < c.box.local_shape[d];
    }
    if (!inside) continue;
    if (c.flat_range) {
      const int64_t f = local.empty() ? 0 : Ravel(local, c.box.local_shape);
      if (f < c.flat_range->inclusive_min || f >= c.flat_range->exclusive_max) continue;
    }
    return files_[c.file]->name;
  }
  return "no chunk";
}

Status Reader::ReplicasDiffer(const std::string& key, const std::vector<TensorEntry*>& parts,
                              const ReplicaDifference& d, const std::string& rule) const {
  const TensorEntry& e0 = *parts[0];
  std::string where = "element " + std::to_string(d.element);
  if (e0.global_shape.size() > 1) where += " (index " + ShapeText(Unravel(d.element, e0.global_shape)) + ")";
  const std::string t = std::to_string(d.rank);
  return DataLossError(
      dir_ + ": '" + key + "' (" + std::string(DTypeName(e0.dtype)) + " " +
      ShapeText(e0.global_shape) + ") is replicated across TP (" + rule +
      "), but its TP copies differ: " + where + " is " + d.value0 + " on TP rank 0 (" +
      FileOfElement(e0, d.element) + ") and " + d.value + " on TP rank " + t + " (" +
      FileOfElement(*parts[d.rank], d.element) + "); fc exports one copy only" +
      (options_.tp_axis ? std::string(" (give it an axis if it is split across TP)")
                        : std::string(", and DeepSpeed's ds_to_universal refuses such a checkpoint "
                                      "too (merge_tp_slices asserts the TP slices of a "
                                      "replicated param equal)")));
}

Result<std::string> Reader::BufferCopiesDiffer(const std::vector<TensorEntry*>& parts,
                                               ChunkReader& reader) const {
  const TensorEntry& e0 = *parts[0];
  for (size_t t = 1; t < parts.size(); ++t) {
    const TensorEntry& e = *parts[t];
    if (e.dtype != e0.dtype || e.global_shape != e0.global_shape) {
      return std::string(DTypeName(e0.dtype)) + " " + ShapeText(e0.global_shape) +
             " on TP rank 0, " + std::string(DTypeName(e.dtype)) + " " +
             ShapeText(e.global_shape) + " on TP rank " + std::to_string(t);
    }
  }
  FC_ASSIGN_OR_RETURN(std::optional<ReplicaDifference> d, FirstReplicaDifference(parts, reader));
  if (!d) return std::string();
  return "values differ between TP rank 0 and TP rank " + std::to_string(d->rank) +
         ": element " + std::to_string(d->element) + " is " + d->value0 + " and " + d->value;
}

Status Reader::MergeBySourceSplit(const std::string& name, bool step,
                                  const std::vector<TensorEntry*>& parts, TensorEntry* m,
                                  ChunkReader& reader) const {
  const TensorEntry& e0 = *parts[0];
  *m = e0;
  for (size_t t = 1; t < parts.size(); ++t) {
    if (parts[t]->dtype != e0.dtype || parts[t]->global_shape.size() != e0.global_shape.size()) {
      return DataLossError(dir_ + ": tensor '" + e0.key + "' is " + std::string(DTypeName(e0.dtype)) +
                           " " + ShapeText(e0.global_shape) + " on TP rank 0 but " +
                           std::string(DTypeName(parts[t]->dtype)) + " " +
                           ShapeText(parts[t]->global_shape) + " on TP rank " + std::to_string(t));
    }
  }
  const std::optional<int64_t> axis = step ? std::nullopt : options_.tp_axis(name);
  const size_t d = axis ? static_cast<size_t>(*axis) : SIZE_MAX;
  if (axis && (*axis < 0 || d >= e0.global_shape.size())) {
    return InvalidArgumentError(options_.tp_axis_origin + ": tensor_parallel axis " +
                                std::to_string(*axis) + " is out of range for '" + e0.key + "' " +
                                ShapeText(e0.global_shape) + " (" + dir_ + ")");
  }
  for (size_t t = 1; t < parts.size(); ++t) {
    for (size_t k = 0; k < e0.global_shape.size(); ++k) {
      if (k != d && parts[t]->global_shape[k] != e0.global_shape[k]) {
        return DataLossError(dir_ + ": TP slices of '" + e0.key + "' (" +
                             (axis ? "concatenated along dim " + std::to_string(d) : "replicated") +
                             " by " + options_.tp_axis_origin + ") are " + ShapeText(e0.global_shape) +
                             " on TP rank 0 and " + ShapeText(parts[t]->global_shape) +
                             " on TP rank " + std::to_string(t));
      }
    }
  }
  if (!axis) {
    // Replicated: TP rank 0's copy, once every copy is found equal to it (the step, which
    // ds_to_universal takes from TP rank 0 too, is not compared).
    if (step) return Status::Ok();
    FC_ASSIGN_OR_RETURN(std::optional<ReplicaDifference> d, FirstReplicaDifference(parts, reader));
    if (d) {
      return ReplicasDiffer(e0.key, parts, *d,
                            "no tensor_parallel axis for it in " + options_.tp_axis_origin);
    }
    return Status::Ok();
  }
  m->chunks.clear();
  int64_t off = 0;
  for (const TensorEntry* p : parts) {
    for (const Chunk& c : p->chunks) {
      Chunk s = c;
      s.box.global_offset[d] += off;
      m->chunks.push_back(std::move(s));
    }
    const std::optional<int64_t> next = CheckedAdd(off, p->global_shape[d]);
    if (!next) {
      return DataLossError(dir_ + ": TP slices of '" + e0.key + "' overflow dim " +
                           std::to_string(d) + " when concatenated");
    }
    off = *next;
  }
  m->global_shape[d] = off;
  return Status::Ok();
}

bool IsUniversalDir(const std::string& dir) {
  return IsDirectory(dir + "/zero") &&
         (PathExists(dir + "/zero/optimizer_state.pt") || HasStateFiles(dir));
}

Status Reader::ReadUniversalParams(const std::vector<std::pair<std::string, Shape>>& order,
                                   bool check_shapes, Families* f) {
  const std::string zdir = dir_ + "/zero";
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(zdir));
  std::set<std::string> dirs;
  for (const std::string& n : names) {
    if (IsDirectory(zdir + "/" + n)) dirs.insert(n);
  }
  std::vector<std::pair<std::string, std::optional<Shape>>> params;
  for (const auto& [name, shape] : order) {
    if (!dirs.erase(name)) {
      return NotFoundError(zdir + "/" + name + "/ is missing (param_shapes lists '" + name + "')");
    }
    params.emplace_back(name, shape);
  }
  for (const std::string& n : dirs) params.emplace_back(n, std::nullopt);
  static constexpr std::pair<const char*, Family> kStates[] = {
      {"fp32", kWeights}, {"exp_avg", kExpAvg}, {"exp_avg_sq", kExpAvgSq}, {"step", kStep}};
  for (const auto& [name, known] : params) {
    std::optional<Shape> fp32_shape;
    for (const auto& [state, family] : kStates) {
      const std::string rel = "zero/" + name + "/" + state + ".pt";
      if (!PathExists(dir_ + "/" + rel)) {
        if (family == kWeights) return NotFoundError(dir_ + "/" + rel + " is missing");
        continue;
      }
      FC_ASSIGN_OR_RETURN(const PtFile* pt, Open(rel));
      // ds_to_universal saves {'param': tensor, 'cat_dim', ...} (stage <= 2) or the raw
      // flat tensor (stage 3); step.pt holds the raw step (int or 0-d tensor).
      const PV* v = &pt->root;
      if (DictEntries(v) != nullptr) {
        v = v->Find("param");
        if (v == nullptr) return DataLossError(rel + ": a dict without 'param'");
      }
      if (family == kStep) {
        if (auto i = IntOf(v)) {
          SetAttr("deepspeed.step", std::to_string(*i), rel);
          continue;
        }
        if (v->kind == PV::Kind::kFloat) {
          SetAttr("deepspeed.step", std::to_string(v->float_value), rel);
          continue;
        }
      }
      FC_ASSIGN_OR_RETURN(Located l, pt->Locate(v, "param"));
      Shape shape = l.shape;
      Chunk c = WholeChunk(l, pt->index);
      if (family != kStep && known && check_shapes && l.shape != *known) {
        if (l.shape.size() != 1 || l.numel != *CheckedNumElements(*known)) {
          return DataLossError(rel + ": param has shape " + ShapeText(l.shape) +
                               ", param_shapes says " + ShapeText(*known));
        }
        shape = *known;  // the stage-3 raw form: the flat param
        FC_ASSIGN_OR_RETURN(c, FlatChunk(l, pt->index, shape, FlatRange{0, l.numel}, 0, rel));
      }
      if (family == kWeights) {
        fp32_shape = shape;
        master_dtype_ = std::string(DTypeName(l.dtype));
      } else if (family != kStep && shape != *fp32_shape) {
        return DataLossError(rel + ": shape " + ShapeText(shape) + ", fp32.pt has " +
                             ShapeText(*fp32_shape));
      }
      TensorEntry t;
      t.key = std::string(kFamilyPrefix[family]) + name;
      t.dtype = l.dtype;
      t.global_shape = shape;
      t.chunks.push_back(std::move(c));
      f->tensors[family].push_back(std::move(t));
    }
  }
  return Status::Ok();
}

Result<PtFile*> Reader::Open(const std::string& rel) {
  const uint32_t idx = static_cast<uint32_t>(files_.size());
  FC_ASSIGN_OR_RETURN(std::unique_ptr<PtFile> pt, OpenPt(dir_, rel, idx));
  index_.files.push_back(FileInfo{rel, pt->file->size()});
  files_.push_back(std::move(pt));
  return files_.back().get();
}

Result<CheckpointIndex> Reader::Read(const std::string& path) {
  if (!IsDirectory(path)) return NotFoundError(path + ": not a directory");
  std::string dir = path;
  std::string tag;
  if (!HasStateFiles(path) && !IsUniversalDir(path)) {
    // A save dir: `latest` names the tag; a dir holding only a UCP: `latest_universal`.
    FC_ASSIGN_OR_RETURN(std::optional<std::string> latest, LatestTag(path, "latest"));
    if (!latest) {
      FC_ASSIGN_OR_RETURN(latest, LatestTag(path, "latest_universal"));
    }
    if (latest) {
      dir = path + "/" + *latest;
      tag = *latest;
      if (!IsDirectory(dir)) {
        return NotFoundError(path + ": the latest file names tag '" + *latest + "', but " + dir +
                             " is not a directory");
      }
    }
  }
  if (tag.empty()) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.find_last_of('/');
    tag = slash == std::string::npos ? p : p.substr(slash + 1);
  }
  dir_ = dir;
  universal_ = IsUniversalDir(dir);
  index_.format = CheckpointFormat::kDeepSpeed;
  index_.root = dir;
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  std::sort(names.begin(), names.end());
  std::map<int64_t, RankFiles> ranks;
  std::map<int64_t, std::vector<std::pair<int64_t, const PtFile*>>> layers;  // TP rank ->
  std::map<int64_t, std::vector<const PtFile*>> experts;                        // mp rank ->
  // MoE (expert files present): the module and expert weights are read; the ZeRO files too
  // (ReadMoeZero12) when there is one model-parallel rank and no pipeline, the layout
  // DeepSpeed's MoE checkpoints are known in (expert groups partitioned over their own
  // expert-data-parallel ranks, no param_shapes; zero_to_fp32 cannot read them). The
  // expp_rank_* files hold {'optimizer': None} under ZeRO and are never read.
  bool moe = false, moe_single = true;
  for (const std::string& n : names) {
    const NameInfo info = ClassifyName(n);
    moe = moe || info.kind == FileKind::kExpert;
    if (info.kind == FileKind::kPipelineLayer ||
        ((info.kind == FileKind::kModelMp || info.kind == FileKind::kOptim ||
          info.kind == FileKind::kExpert) && info.mp != 0)) {
      moe_single = false;
    }
  }
  moe_ = moe && moe_single;
  int64_t skipped_optim = 0;
  for (const std::string& n : names) {
    const NameInfo info = ClassifyName(n);
    if (info.kind == FileKind::kOther) continue;
    if (info.kind == FileKind::kExpertOptim || (moe && !moe_ && info.kind == FileKind::kOptim)) {
      ++skipped_optim;
      continue;
    }
    FC_ASSIGN_OR_RETURN(PtFile* raw, Open(n));
    if (info.kind == FileKind::kExpert) {
      experts[info.mp].push_back(raw);
      continue;
    }
    if (info.kind == FileKind::kPipelineLayer) {
      layers[info.mp].emplace_back(info.layer, raw);
      continue;
    }
    RankFiles& rf = ranks[info.mp];
    if (info.kind == FileKind::kModelMp) rf.model = raw;
    else if (info.kind == FileKind::kModelZero3) rf.model_z3[info.dp] = raw;
    else if (!rf.optim.emplace(info.dp, raw).second) {
      return DataLossError(dir + ": two optimizer files for DP rank " + std::to_string(info.dp) +
                           " and mp rank " + std::to_string(info.mp) + " (" + n + ")");
    }
  }
  if (ranks.empty()) {
    // Expert, pipeline layer or MoE optimizer files alone: the save's own model states file
    // is what is missing, not the checkpoint.
    if (!experts.empty() || !layers.empty() || skipped_optim > 0) {
      return NotFoundError(dir + ": mp_rank_00_model_states.pt is missing (the dir holds " +
                           (experts.empty() ? layers.empty() ? "MoE optimizer" : "pipeline layer"
                                            : "expert") +
                           " files of a DeepSpeed save, but no mp_rank_XX_model_states.pt or "
                           "*_optim_states.pt)");
    }
    return NotFoundError(dir + ": no DeepSpeed *_model_states.pt / *_optim_states.pt files");
  }
  pipeline_ = !layers.empty();
  const int64_t mps = static_cast<int64_t>(ranks.size());
  if (ranks.rbegin()->first != mps - 1) {
    return NotFoundError(dir + ": files of mp_rank " + std::to_string(mps - 1) +
                         " expected, found mp_rank up to " + std::to_string(ranks.rbegin()->first));
  }
  auto model_of = [](const RankFiles& rf) -> const PtFile* {
    return rf.model ? rf.model : (rf.model_z3.empty() ? nullptr : rf.model_z3.begin()->second);
  };
  const PtFile* first_model = model_of(ranks.begin()->second);
  // Degrees (deepspeed.md section 1): TP = the number of layer file TP ranks for a pipeline,
  // else checkpoint_parallel_dimensions, else one TP rank per mp_rank; the mp_rank files of
  // a pipeline are ordered stage-major (pp0_tp0, pp0_tp1, ...).
  std::optional<int64_t> dims_pp, dims_tp;
  if (first_model != nullptr) {
    if (const PV* dims = first_model->root.Find("checkpoint_parallel_dimensions")) {
      dims_pp = IntOf(dims->Find("pp_degree"));
      dims_tp = IntOf(dims->Find("tp_degree"));
    }
  }
  int64_t tp = mps;
  if (pipeline_) {
    tp = static_cast<int64_t>(layers.size());
    if (layers.rbegin()->first != tp - 1) {
      return NotFoundError(dir + ": pipeline layer files of TP rank " + std::to_string(tp - 1) +
                           " expected, found model_" + std::to_string(layers.rbegin()->first));
    }
  } else if (dims_tp && *dims_tp >= 1) {
    tp = *dims_tp;
  }
  if (mps % tp != 0) {
    return DataLossError(dir + ": " + std::to_string(mps) + " mp_rank files do not split into " +
                         std::to_string(tp) + " TP ranks per pipeline stage");
  }
  const int64_t pp = mps / tp;
  if (dims_pp && dims_tp && (*dims_pp != pp || *dims_tp != tp)) {
    return DataLossError(first_model->name + ": checkpoint_parallel_dimensions says pp " +
                         std::to_string(*dims_pp) + " x tp " + std::to_string(*dims_tp) +
                         ", the files are pp " + std::to_string(pp) + " x tp " +
                         std::to_string(tp));
  }
  if (pp > 1 && !pipeline_ && !universal_) {
    return DataLossError(dir + ": pipeline degree " + std::to_string(pp) +
                         " but no layer_XX-model_YY-model_states.pt files");
  }
  if (universal_ && PathExists(dir + "/zero/optimizer_state.pt")) {
    FC_ASSIGN_OR_RETURN(const PtFile* os, Open("zero/optimizer_state.pt"));
    std::string stage = "unknown";
    if (os->root.Find("fp32_flat_groups") != nullptr) stage = "3";
    else if (auto s = IntOf(os->root.Find("zero_stage"))) stage = std::to_string(*s);
    else if (os->root.Find("group_paddings") != nullptr) stage = "1";  // BF16_Optimizer
    SetAttr("deepspeed.zero_stage", stage, os->name);
    if (auto pc = IntOf(os->root.Find("partition_count"))) {
      SetAttr("deepspeed.dp_degree", std::to_string(*pc), os->name);
    }
  }
  if (universal_) SetAttr("deepspeed.optimizer", "universal", dir);
  if (skipped_optim > 0 && !moe) {
    return UnimplementedError(dir + ": expp_rank_*_optim_states.pt (MoE optimizer) without "
                              "layer_*_expert_* files");
  }
  if (moe_) {
    // Shapes of the module and expert tensors, and the number of experts of each expert
    // module, for ReadMoeZero12.
    auto add_shapes = [&](const PtFile& f, const Entries* entries) -> Status {
      for (const auto& [k, v] : entries ? *entries : Entries()) {
        auto name = StrOf(k.get());
        if (!name || v->is_none()) continue;
        FC_ASSIGN_OR_RETURN(Located l, f.Locate(v.get(), "['" + *name + "']"));
        moe_shapes_[*name] = l.shape;
      }
      return Status::Ok();
    };
    if (const PtFile* m = ranks.begin()->second.model) {
      FC_RETURN_IF_ERROR(add_shapes(*m, DictEntries(m->root.Find("module"))));
    }
    std::map<std::string, std::set<int64_t>> ids;
    for (const PtFile* f : experts[0]) {
      FC_RETURN_IF_ERROR(add_shapes(*f, DictEntries(&f->root)));
      for (const auto& [k, v] : DictEntries(&f->root) ? *DictEntries(&f->root) : Entries()) {
        auto name = StrOf(k.get());
        if (auto x = name ? ParseExpertName(*name) : std::nullopt) ids[x->prefix].insert(x->id);
      }
    }
    for (const auto& [prefix, set] : ids) {
      const int64_t n = static_cast<int64_t>(set.size());
      if (*set.rbegin() != n - 1) {
        return NotFoundError(dir + ": the expert files hold " + std::to_string(n) +
                             " experts of " + prefix + "* but the highest id is " +
                             std::to_string(*set.rbegin()) + " (an expert file is missing)");
      }
      moe_experts_[prefix] = n;
    }
  }
  if (moe && (!moe_ || ranks.begin()->second.optim.empty())) {
    SetAttr("deepspeed.optimizer", "not read (MoE)", dir);
    SetAttr("deepspeed.zero_stage", "not read (MoE)", dir);
  }
  if (moe) {
    if (auto dp = IntOf(first_model ? first_model->root.Find("dp_world_size") : nullptr)) {
      SetAttr("deepspeed.dp_degree", std::to_string(*dp), first_model->name);
    }
  }

  std::vector<Families> per_tp(static_cast<size_t>(tp));
  std::vector<std::set<std::string>> buffer_names(static_cast<size_t>(tp));
  std::vector<std::pair<std::string, Shape>> order;  // UCP: params in param_shapes order
  std::set<std::string> ordered;
  bool ucp_info = false;
  for (auto& [mp, rf] : ranks) {
    FC_RETURN_IF_ERROR(ReadRank(mp, rf));
    if (auto e = experts.find(mp); e != experts.end()) {
      FC_RETURN_IF_ERROR(AddExpertFiles(e->second));
    }
    const int64_t t = mp % tp;
    FC_RETURN_IF_ERROR(UnionStage(TakeFamilies(),
                                  dir + " pipeline stage " + std::to_string(mp / tp) + " (" +
                                      MpName(mp) + ")",
                                  &per_tp[static_cast<size_t>(t)]));
    const PtFile* m = model_of(rf);
    if (m == nullptr) continue;
    if (const PV* u = m->root.Find("universal_checkpoint_info"); u && !u->is_none()) {
      ucp_info = true;
    }
    if (auto v = StrOf(m->root.Find("ds_version"))) SetAttr("deepspeed.ds_version", *v, m->name);
    if (const auto* b = ListItems(m->root.Find("buffer_names"))) {
      for (const auto& i : *b) {
        if (auto s = StrOf(i.get())) buffer_names[static_cast<size_t>(t)].insert(*s);
      }
    }
    if (universal_) {
      FC_ASSIGN_OR_RETURN(std::vector<ParamList> groups, ParamShapes(*m));
      for (const ParamList& g : groups) {
        for (const auto& [name, shape] : g) {
          if (ordered.insert(name).second) order.emplace_back(name, shape);
        }
      }
    }
  }
  if (moe) {
    size_t n = 0;
    for (const auto& [mp, fs] : experts) n += fs.size();
    index_.attributes["deepspeed.moe"] =
        std::to_string(n) + " expert files read (16-bit weights); " +
        (moe_optimizer_read_ ? "optimizer states read from the zero_pp_rank files"
                             : "optimizer files not read");
  }
  for (auto& [t, ls] : layers) {
    std::sort(ls.begin(), ls.end());
    FC_RETURN_IF_ERROR(AddLayerFiles(ls, buffer_names[static_cast<size_t>(t)], ordered,
                                     &per_tp[static_cast<size_t>(t)]));
  }
  std::optional<TpRules> rules;
  if (tp > 1 && first_model != nullptr) {
    const PV* info = first_model->root.Find("universal_checkpoint_info");
    if (info != nullptr && DictEntries(info) != nullptr) {
      FC_ASSIGN_OR_RETURN(rules, ParseTpRules(*first_model, info));
    }
  }
  FC_ASSIGN_OR_RETURN(Families all, MergeTp(std::move(per_tp), rules ? &*rules : nullptr));
  if (universal_) {
    Families u;
    FC_RETURN_IF_ERROR(ReadUniversalParams(order, tp == 1, &u));
    // ds_to_universal (0.19) also writes zero/<name>/fp32.pt, module value as float32, for
    // module entries without optimizer state (frozen params, buffers, tied aliases), which
    // the copied model states hold too: those keep the model states' copy (as stored).
    std::set<std::string> module_only;
    for (size_t fam : {kFrozen, kBuffers}) {
      for (const TensorEntry& t : all.tensors[fam]) {
        module_only.insert(t.key);
        // TP copies kept per rank (mp_rank_YY.<name>): ds_to_universal wrote TP rank 0's
        if (t.key.starts_with("mp_rank_") && t.key.find('.') != std::string::npos) {
          module_only.insert(t.key.substr(t.key.find('.') + 1));
        }
      }
    }
    for (const auto& [alias, owner] : all.aliases) module_only.insert(alias);
    std::set<std::string> with_state;
    for (const TensorEntry& t : u.tensors[kExpAvg]) {
      with_state.insert(t.key.substr(std::string_view(kFamilyPrefix[kExpAvg]).size()));
    }
    std::erase_if(u.tensors[kWeights], [&](const TensorEntry& t) {
      return module_only.count(t.key) > 0 && with_state.count(t.key) == 0;
    });
    std::set<std::string> have;
    for (const TensorEntry& t : u.tensors[kWeights]) have.insert(t.key);
    std::erase_if(all.tensors[kOther], [&](const TensorEntry& t) { return have.count(t.key) > 0; });
    for (size_t i = 0; i < kFamilies; ++i) {
      for (TensorEntry& t : u.tensors[i]) all.tensors[i].push_back(std::move(t));
    }
  }
  std::set<std::string> opaque;
  for (const auto& f : files_) CollectUnknownGlobals(f->root, AllowedGlobal, &opaque);
  if (!opaque.empty()) {
    std::string s;
    for (const std::string& g : opaque) s += (s.empty() ? "" : ", ") + g;
    index_.attributes["deepspeed.opaque_globals"] = s;
  }
  index_.attributes["deepspeed.tag"] = tag;
  index_.attributes["deepspeed.tp_degree"] = std::to_string(tp);
  index_.attributes["deepspeed.pp_degree"] = std::to_string(pp);
  index_.attributes["deepspeed.universal_checkpoint_info"] = ucp_info ? "present" : "absent";
  if (tp > 1) {
    index_.attributes["deepspeed.tp_merge"] =
        options_.tp_axis ? "tensor_parallel rules of " + options_.tp_axis_origin
        : rules          ? "universal_checkpoint_info"
                         : "none (per-rank names mp_rank_XX.<name>)";
  }
  if (!module_dtype_.empty()) index_.attributes["deepspeed.module_dtype"] = module_dtype_;
  if (!master_dtype_.empty()) index_.attributes["deepspeed.master_dtype"] = master_dtype_;

  // Tied aliases get the owner's chunks (weights only; module.* has both names already).
  std::vector<TensorEntry> out;
  for (Family i : {kWeights, kFrozen, kBuffers, kOther}) {
    for (TensorEntry& t : all.tensors[i]) out.push_back(std::move(t));
  }
  std::set<std::string> have;
  for (const TensorEntry& t : out) have.insert(t.key);
  for (const auto& alias_owner : all.aliases) {
    // Named references, not structured bindings: clang 14 (the fuzz build) cannot capture
    // those in the lambdas below.
    const std::string& alias = alias_owner.first;
    const std::string& owner = alias_owner.second;
    if (have.count(alias)) {
      // The alias came in as an "other" module tensor; point it at the owner's weights.
      auto a = std::find_if(out.begin(), out.end(), [&](const TensorEntry& t) { return t.key == alias; });
      auto o = std::find_if(out.begin(), out.end(), [&](const TensorEntry& t) { return t.key == owner; });
      if (o != out.end() && a != out.end()) {
        TensorEntry copy = *o;
        copy.key = alias;
        *a = std::move(copy);
      }
      continue;
    }
    auto o = std::find_if(out.begin(), out.end(), [&](const TensorEntry& t) { return t.key == owner; });
    if (o == out.end()) continue;
    TensorEntry copy = *o;
    copy.key = alias;
    out.push_back(std::move(copy));
    have.insert(alias);
  }
  for (Family i : {kModule, kExpAvg, kExpAvgSq, kStep}) {
    for (TensorEntry& t : all.tensors[i]) out.push_back(std::move(t));
  }
  // Every element of every tensor is covered exactly once by construction, except when a
  // file lies (e.g. a param listed twice); count elements to catch that.
  for (const TensorEntry& t : out) {
    int64_t covered = 0;
    for (const Chunk& c : t.chunks) covered += c.stored_elements();
    const int64_t want = *CheckedNumElements(t.global_shape);
    if (covered != want) {
      return DataLossError(dir + ": tensor '" + t.key + "' has " + std::to_string(covered) +
                           " elements in its chunks, shape " + ShapeText(t.global_shape) +
                           " needs " + std::to_string(want) +
                           " (a param listed twice in param_shapes?)");
    }
  }
  index_.tensors = std::move(out);
  return std::move(index_);
}

}  // namespace

bool IsDeepSpeedCheckpointDir(const std::string& dir) {
  if (!IsDirectory(dir)) return false;
  if (HasStateFiles(dir)) return true;
  if (IsUniversalDir(dir)) return true;
  for (const char* file : {"latest", "latest_universal"}) {
    auto latest = LatestTag(dir, file);
    if (latest.ok() && latest->has_value() && HasStateFiles(dir + "/" + **latest)) return true;
  }
  return false;
}

Result<CheckpointIndex> ReadDeepSpeedCheckpoint(const std::string& path,
                                                DeepSpeedReadOptions options) {
  Reader reader(std::move(options));
  return reader.Read(path);
}

Result<PickleValue> ReadDeepSpeedPickle(const std::string& path) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<PtFile> pt, OpenPt(Dirname(path), Basename(path), 0));
  return std::move(pt->root);
}

Result<DeepSpeedPtFile> ReadDeepSpeedPtFile(const std::string& path) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<PtFile> pt, OpenPt(Dirname(path), Basename(path), 0));
  DeepSpeedPtFile out;
  out.legacy = pt->legacy;
  out.size = pt->file->size();
  if (pt->legacy) {
    out.storages = std::move(pt->legacy_storages);
  } else {
    const std::string data = pt->archive.prefix + "/data/";
    for (const ZipEntry& e : pt->archive.zip.entries) {
      if (e.name.starts_with(data) && e.method == 0) {
        out.storages[e.name.substr(data.size())] = {e.data_offset, e.compressed_size};
      }
    }
  }
  out.root = std::move(pt->root);
  return out;
}

Result<DeepSpeedWeights> ParseDeepSpeedWeights(std::string_view name) {
  if (name == "fp32" || name == "master") return DeepSpeedWeights::kFp32;
  if (name == "module" || name == "16bit") return DeepSpeedWeights::kModule;
  return InvalidArgumentError("unknown --weights '" + std::string(name) +
                              "' (expected fp32 or module)");
}

Status SelectDeepSpeedWeights(DeepSpeedWeights weights, CheckpointIndex* index) {
  if (index->format != CheckpointFormat::kDeepSpeed) {
    return InvalidArgumentError("--weights applies to DeepSpeed checkpoints only (input is " +
                                std::string(CheckpointFormatName(index->format)) + ")");
  }
  auto tp = index->attributes.find("deepspeed.tp_degree");
  auto merge = index->attributes.find("deepspeed.tp_merge");
  if (tp != index->attributes.end() && tp->second != "1" &&
      (merge == index->attributes.end() ||
       (merge->second != "universal_checkpoint_info" &&
        !merge->second.starts_with("tensor_parallel rules of ")))) {
    return UnimplementedError(
        index->root + ": DeepSpeed checkpoint with tensor parallelism (tp_degree " + tp->second +
        ") but no universal_checkpoint_info in its model states: nothing says how the TP "
        "shards concatenate (column/row parallel, vocabulary padding, replicated params); "
        "export refused. fc-inspect shows the per-rank tensors (mp_rank_XX.<name>); "
        "--source-layout FILE (a layout file's tensor_parallel rules) says how to merge them");
  }
  auto optimizer = index->attributes.find("deepspeed.optimizer");
  if (optimizer != index->attributes.end() && optimizer->second == "not read (MoE)" &&
      weights == DeepSpeedWeights::kFp32) {
    return UnimplementedError(index->root + ": MoE DeepSpeed checkpoint: fc reads its 16-bit "
                              "module and expert weights only (its optimizer files, which hold "
                              "the fp32 master weights, are not read); export with --weights "
                              "module");
  }
  if (auto u = index->attributes.find("deepspeed.tp_unmerged"); u != index->attributes.end()) {
    return UnimplementedError(index->root + ": DeepSpeed TP shards that fc does not merge: " +
                              u->second + "; export refused (fc-inspect shows them as "
                              "mp_rank_XX.<name>)");
  }
  FoldPrefixedTensors(index, "module.", weights == DeepSpeedWeights::kModule);
  return Status::Ok();
}

}  // namespace fc
