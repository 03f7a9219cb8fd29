// ReadDeepSpeedCheckpoint: DeepSpeed save/tag dirs -> CheckpointIndex.
// Layout, names and contract: include/fc/format/deepspeed.h; file facts:
// shared/reference/deepspeed.md.
//
// Every file is a torch.save zip; its data.pkl is parsed into a value tree (nothing runs)
// and the tensors are located inside their storage records. The ZeRO flat partitions are
// never copied: each param's piece of a partition becomes a flattened-range chunk pointing
// at the partition's bytes, so padding (tail padding for ZeRO-1/2 and BF16_Optimizer,
// per-param ceil-div padding for ZeRO-3) is simply never addressed.
#include "fc/format/deepspeed.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "fc/core/checked_math.h"
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

// --- File names ------------------------------------------------------------------------

bool ParseUint(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 9) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

enum class FileKind { kModelMp, kModelZero3, kOptim, kPipelineLayer, kExpert, kOther };

struct NameInfo {
  FileKind kind = FileKind::kOther;
  int64_t dp = 0, mp = 0;
};

// mp_rank_XX_model_states.pt | [bf16_|fp16_]zero_pp_rank_N_mp_rank_XX_{model,optim}_states.pt
NameInfo ClassifyName(std::string_view n) {
  NameInfo info;
  if (n.starts_with("layer_") && n.ends_with(".pt")) {
    info.kind = n.find("_expert_") != std::string_view::npos ? FileKind::kExpert
                                                             : FileKind::kPipelineLayer;
    return info;
  }
  if (n.starts_with("expp_rank_") && n.ends_with(".pt")) {
    info.kind = FileKind::kExpert;
    return info;
  }
  bool model = false;
  if (n.ends_with("_model_states.pt")) {
    model = true;
    n.remove_suffix(16);
  } else if (n.ends_with("_optim_states.pt")) {
    n.remove_suffix(16);
  } else {
    return info;
  }
  if (n.starts_with("bf16_")) n.remove_prefix(5);
  else if (n.starts_with("fp16_")) n.remove_prefix(5);
  bool zero = false;
  if (n.starts_with("zero_pp_rank_")) {
    n.remove_prefix(13);
    const size_t us = n.find('_');
    if (us == std::string_view::npos || !ParseUint(n.substr(0, us), &info.dp)) return info;
    n.remove_prefix(us + 1);
    zero = true;
  }
  if (!n.starts_with("mp_rank_") || !ParseUint(n.substr(8), &info.mp)) return info;
  if (model) info.kind = zero ? FileKind::kModelZero3 : FileKind::kModelMp;
  else if (zero) info.kind = FileKind::kOptim;
  return info;
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

// The tag named by <dir>/latest, if that file exists and names a plain subdirectory.
Result<std::optional<std::string>> LatestTag(const std::string& dir) {
  const std::string latest = dir + "/latest";
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

void CollectOpaqueGlobals(const PV& root, std::set<std::string>* out) {
  std::unordered_set<const PV*> seen;
  std::vector<const PV*> stack = {&root};
  while (!stack.empty()) {
    const PV* v = stack.back();
    stack.pop_back();
    if (v == nullptr || !seen.insert(v).second) continue;
    if (v->kind == PV::Kind::kGlobal && !AllowedGlobal(v->str, v->name)) {
      out->insert(v->str + "." + v->name);
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

  Result<Located> Locate(const PV* v, const std::string& what) const {
    if (v == nullptr) return DataLossError(name + ": " + what + " is missing");
    auto ref = DecodeTorchTensor(*v);
    if (!ref.ok()) return ref.status().With(name + ": " + what);
    const ZipEntry* e = archive.FindRecord("data/" + ref->storage_key);
    if (e == nullptr) {
      return DataLossError(name + ": " + what + ": storage record 'data/" + ref->storage_key +
                           "' is missing");
    }
    if (e->method != 0) {
      return UnimplementedError(name + ": " + what + ": storage record '" + e->name +
                                "' is compressed");
    }
    if (e->compressed_size != ref->storage_bytes) {
      return DataLossError(name + ": " + what + ": storage record '" + e->name + "' has " +
                           std::to_string(e->compressed_size) + " bytes, data.pkl says " +
                           std::to_string(ref->storage_bytes));
    }
    if (e->data_exclusive_max() > file->size()) {
      return DataLossError(name + ": " + what + ": storage record '" + e->name +
                           "' passes the end of the file");
    }
    Located l;
    l.dtype = ref->dtype;
    l.shape = ref->shape;
    l.strides = ref->strides;
    l.contiguous = ref->IsRowMajorContiguous();
    FC_ASSIGN_OR_RETURN(l.numel, CheckedNumElements(l.shape).With(name + ": " + what));
    // In range: DecodeTorchTensor checked that the view fits the storage.
    l.first = e->data_offset + static_cast<uint64_t>(ref->storage_offset) * DTypeSize(l.dtype);
    l.span = ref->ViewSpanBytes();
    return l;
  }
};

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
        return UnimplementedError(name + ": legacy (non-zip) torch.save file "
                                  "(checkpoint_serialization: false); fc reads only the zip "
                                  "format");
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
  std::vector<TensorEntry> Take() { return std::move(tensors_); }

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
      const PV* st = v ? v->state.get() : nullptr;
      auto numel = IntOf(st ? st->Find("numel") : nullptr);
      auto start = IntOf(st ? st->Find("start") : nullptr);
      if (!name || !numel || !start) {
        return DataLossError(where + ": entry " + k->DebugString() + ": " + v->DebugString() +
                             " is not name: fragment_address(numel, start)");
      }
      got[*name] = {*numel, *start};
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

class Reader {
 public:
  Result<CheckpointIndex> Read(const std::string& path);

 private:
  Status ReadRank(int64_t mp, RankFiles& rf);
  Status ReadZero12(const PtFile& model, const std::vector<const PtFile*>& optims,
                    const std::vector<const PV*>& osds, bool bf16_optimizer);
  Status ReadZero3(const std::vector<const PtFile*>& models,
                   const std::vector<const PtFile*>& optims, const std::vector<const PV*>& osds);
  Status AddModule(const PtFile& model, bool zero3_placeholders);
  Status AddStep(const PtFile& f, const PV* state, int64_t g, const ParamList& params);
  void SetAttr(const std::string& k, const std::string& v, const std::string& where);

  std::string prefix_;  // "mp_rank_XX." when tp > 1
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
    FC_RETURN_IF_ERROR(step_.Add(prefix_ + "optimizer.step." + name, l.dtype, l.shape,
                                 WholeChunk(l, f.index), f.name));
  }
  return Status::Ok();
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
    // Per rank: fp32 partition, exp_avg, exp_avg_sq and the element counts.
    struct RankPart {
      Located fp32;
      std::optional<Located> exp_avg, exp_avg_sq;
      int64_t lean = 0, padded = 0;
      const PV* state = nullptr;
    };
    std::vector<RankPart> parts(static_cast<size_t>(ws));
    for (int64_t r = 0; r < ws; ++r) {
      const PtFile& f = *optims[static_cast<size_t>(r)];
      const PV* osd = osds[static_cast<size_t>(r)];
      const auto* singles = ListItems(osd->Find("single_partition_of_fp32_groups"));
      const auto* paddings = ListItems(osd->Find("group_paddings"));
      if (singles == nullptr || singles->size() != groups.size()) {
        return DataLossError(f.name + ": single_partition_of_fp32_groups has " +
                             (singles ? std::to_string(singles->size()) : "no") +
                             " groups, param_shapes of " + model.name + " has " +
                             std::to_string(groups.size()));
      }
      if (paddings == nullptr || paddings->size() != groups.size()) {
        return DataLossError(f.name + ": group_paddings does not list " +
                             std::to_string(groups.size()) + " groups");
      }
      auto pad = IntOf((*paddings)[g].get());
      if (!pad || *pad < 0) {
        return DataLossError(f.name + ": group_paddings[" + gs + "] is " +
                             (*paddings)[g]->DebugString());
      }
      RankPart& p = parts[static_cast<size_t>(r)];
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
        FC_RETURN_IF_ERROR(weights_.Add(prefix_ + name, p.fp32.dtype, shape, c, f.name));
        if (p.exp_avg) {
          FC_ASSIGN_OR_RETURN(c, FlatChunk(*p.exp_avg, f.index, shape, range, lo - left, what));
          FC_RETURN_IF_ERROR(exp_avg_.Add(prefix_ + "optimizer.exp_avg." + name,
                                          p.exp_avg->dtype, shape, c, f.name));
        }
        if (p.exp_avg_sq) {
          FC_ASSIGN_OR_RETURN(c,
                              FlatChunk(*p.exp_avg_sq, f.index, shape, range, lo - left, what));
          FC_RETURN_IF_ERROR(exp_avg_sq_.Add(prefix_ + "optimizer.exp_avg_sq." + name,
                                             p.exp_avg_sq->dtype, shape, c, f.name));
        }
      }
      off += n;
    }
    if (ws > 0) FC_RETURN_IF_ERROR(AddStep(*optims[0], parts[0].state, static_cast<int64_t>(g),
                                           groups[g]));
  }
  // Frozen params (stage 2): full tensors in frozen_param_fragments.
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
      FC_RETURN_IF_ERROR(frozen_.Add(prefix_ + *name, l.dtype, l.shape,
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
        FC_RETURN_IF_ERROR(weights_.Add(prefix_ + name, fp32.dtype, shape, c, f.name));
        if (ea) {
          FC_ASSIGN_OR_RETURN(c, FlatChunk(*ea, f.index, shape, range, offs[i], what));
          FC_RETURN_IF_ERROR(exp_avg_.Add(prefix_ + "optimizer.exp_avg." + name, ea->dtype,
                                          shape, c, f.name));
        }
        if (eas) {
          FC_ASSIGN_OR_RETURN(c, FlatChunk(*eas, f.index, shape, range, offs[i], what));
          FC_RETURN_IF_ERROR(exp_avg_sq_.Add(prefix_ + "optimizer.exp_avg_sq." + name,
                                             eas->dtype, shape, c, f.name));
        }
      }
      if (r == 0) FC_RETURN_IF_ERROR(AddStep(f, state, static_cast<int64_t>(k), groups[k]));
    }
  }
  // Frozen params: each rank's model states hold its ceil-div partition (padded).
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
        FC_RETURN_IF_ERROR(frozen_.Add(prefix_ + *name, l.dtype, *shape, c, m.name));
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
    return UnimplementedError(model.name + ": module is None (pipeline checkpoint: weights in "
                              "layer_* files, not read yet)");
  }
  std::set<std::string> buffer_names;
  if (const auto* b = ListItems(model.root.Find("buffer_names"))) {
    for (const auto& i : *b) {
      if (auto s = StrOf(i.get())) buffer_names.insert(*s);
    }
  }
  for (const auto& [k, v] : *entries) {
    auto name = StrOf(k.get());
    if (!name) return DataLossError(model.name + ": module key " + k->DebugString());
    if (v->is_none()) continue;
    FC_ASSIGN_OR_RETURN(Located l, model.Locate(v.get(), "module['" + *name + "']"));
    if (zero3_placeholders && l.numel == 0 && !buffer_names.count(*name)) continue;
    if (module_dtype_.empty() && !buffer_names.count(*name)) {
      module_dtype_ = std::string(DTypeName(l.dtype));
    }
    Chunk c = WholeChunk(l, model.index);
    FC_RETURN_IF_ERROR(module_.Add(prefix_ + "module." + *name, l.dtype, l.shape, c, model.name));
    const std::string key = prefix_ + *name;
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
      aliases_[prefix_ + *alias] = prefix_ + *owner;
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
    for (size_t r = 0; r < osds.size(); ++r) {
      const PV* pc = osds[r]->Find("partition_count");
      std::optional<int64_t> count = IntOf(pc);
      if (!count && pc != nullptr && ListItems(pc) != nullptr) {
        for (const auto& i : *ListItems(pc)) {
          auto c = IntOf(i.get());
          if (!c) break;
          if (count && *count != *c) {
            return UnimplementedError(optims[r]->name + ": partition_count differs per group (" +
                                      pc->DebugString() + "; MoE expert groups), not read yet");
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
  }
  return AddModule(*rf.model, false);
}

Result<CheckpointIndex> Reader::Read(const std::string& path) {
  if (!IsDirectory(path)) return NotFoundError(path + ": not a directory");
  std::string dir = path;
  std::string tag;
  FC_ASSIGN_OR_RETURN(std::optional<std::string> latest, LatestTag(path));
  if (latest && !HasStateFiles(path)) {
    dir = path + "/" + *latest;
    tag = *latest;
    if (!IsDirectory(dir)) {
      return NotFoundError(path + "/latest names tag '" + *latest + "', but " + dir +
                           " is not a directory");
    }
  } else {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.find_last_of('/');
    tag = slash == std::string::npos ? p : p.substr(slash + 1);
  }
  dir_ = dir;
  index_.format = CheckpointFormat::kDeepSpeed;
  index_.root = dir;
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  std::sort(names.begin(), names.end());
  std::map<int64_t, RankFiles> ranks;
  std::vector<std::unique_ptr<PtFile>> files;
  for (const std::string& n : names) {
    const NameInfo info = ClassifyName(n);
    if (info.kind == FileKind::kPipelineLayer) {
      return UnimplementedError(dir + "/" + n + ": pipeline-parallel layer files "
                                "(layer_XX-model_YY-model_states.pt) are not read yet");
    }
    if (info.kind == FileKind::kExpert) {
      return UnimplementedError(dir + "/" + n + ": MoE expert files are not read yet");
    }
    if (info.kind == FileKind::kOther) continue;
    const uint32_t idx = static_cast<uint32_t>(files.size());
    FC_ASSIGN_OR_RETURN(std::unique_ptr<PtFile> pt, OpenPt(dir, n, idx));
    index_.files.push_back(FileInfo{n, pt->file->size()});
    RankFiles& rf = ranks[info.mp];
    PtFile* raw = pt.get();
    files.push_back(std::move(pt));
    if (info.kind == FileKind::kModelMp) rf.model = raw;
    else if (info.kind == FileKind::kModelZero3) rf.model_z3[info.dp] = raw;
    else if (!rf.optim.emplace(info.dp, raw).second) {
      return DataLossError(dir + ": two optimizer files for DP rank " + std::to_string(info.dp) +
                           " and mp rank " + std::to_string(info.mp) + " (" + n + ")");
    }
  }
  if (ranks.empty()) {
    return NotFoundError(dir + ": no DeepSpeed *_model_states.pt / *_optim_states.pt files");
  }
  const int64_t tp = static_cast<int64_t>(ranks.size());
  if (ranks.rbegin()->first != tp - 1) {
    return NotFoundError(dir + ": files of mp_rank " + std::to_string(tp - 1) +
                         " expected, found mp_rank up to " + std::to_string(ranks.rbegin()->first));
  }
  bool ucp_info = false;
  for (auto& [mp, rf] : ranks) {
    if (tp > 1) {
      prefix_ = std::string("mp_rank_") + (mp < 10 ? "0" : "") + std::to_string(mp) + ".";
    }
    FC_RETURN_IF_ERROR(ReadRank(mp, rf));
    const PtFile* m = rf.model ? rf.model : (rf.model_z3.empty() ? nullptr : rf.model_z3.begin()->second);
    if (m != nullptr) {
      if (const PV* u = m->root.Find("universal_checkpoint_info"); u && !u->is_none()) ucp_info = true;
      if (auto v = StrOf(m->root.Find("ds_version"))) SetAttr("deepspeed.ds_version", *v, m->name);
      if (const PV* dims = m->root.Find("checkpoint_parallel_dimensions")) {
        if (auto pp = IntOf(dims->Find("pp_degree")); pp && *pp != 1) {
          return UnimplementedError(m->name + ": pp_degree " + std::to_string(*pp) +
                                    " (pipeline parallelism) is not read yet");
        }
      }
    }
  }
  std::set<std::string> opaque;
  for (const auto& f : files) CollectOpaqueGlobals(f->root, &opaque);
  if (!opaque.empty()) {
    std::string s;
    for (const std::string& g : opaque) s += (s.empty() ? "" : ", ") + g;
    index_.attributes["deepspeed.opaque_globals"] = s;
  }
  index_.attributes["deepspeed.tag"] = tag;
  index_.attributes["deepspeed.tp_degree"] = std::to_string(tp);
  index_.attributes["deepspeed.pp_degree"] = "1";
  index_.attributes["deepspeed.universal_checkpoint_info"] = ucp_info ? "present" : "absent";
  if (!module_dtype_.empty()) index_.attributes["deepspeed.module_dtype"] = module_dtype_;
  if (!master_dtype_.empty()) index_.attributes["deepspeed.master_dtype"] = master_dtype_;

  // Tied aliases get the owner's chunks (weights only; module.* has both names already).
  std::vector<TensorEntry> out;
  for (Builder* b : {&weights_, &frozen_, &buffers_, &other_}) {
    for (TensorEntry& t : b->Take()) out.push_back(std::move(t));
  }
  std::set<std::string> have;
  for (const TensorEntry& t : out) have.insert(t.key);
  for (const auto& [alias, owner] : aliases_) {
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
  for (Builder* b : {&module_, &exp_avg_, &exp_avg_sq_, &step_}) {
    for (TensorEntry& t : b->Take()) out.push_back(std::move(t));
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
  auto latest = LatestTag(dir);
  return latest.ok() && latest->has_value() && HasStateFiles(dir + "/" + **latest);
}

Result<CheckpointIndex> ReadDeepSpeedCheckpoint(const std::string& path) {
  Reader reader;
  return reader.Read(path);
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
  if (tp != index->attributes.end() && tp->second != "1") {
    return UnimplementedError(
        index->root + ": DeepSpeed checkpoint with tensor parallelism (tp_degree " + tp->second +
        "): fc does not merge TP shards yet (needs universal_checkpoint_info rules); export "
        "refused. fc-inspect shows the per-rank tensors (mp_rank_XX.<name>)");
  }
  constexpr std::string_view kModule = "module.";
  std::map<std::string, size_t> module_pos;
  for (size_t i = 0; i < index->tensors.size(); ++i) {
    if (index->tensors[i].key.starts_with(kModule)) {
      module_pos[index->tensors[i].key.substr(kModule.size())] = i;
    }
  }
  std::vector<TensorEntry> out;
  for (TensorEntry& t : index->tensors) {
    if (t.key.starts_with(kModule)) continue;
    if (weights == DeepSpeedWeights::kModule) {
      auto it = module_pos.find(t.key);
      if (it != module_pos.end()) {
        TensorEntry m = index->tensors[it->second];
        m.key = t.key;
        out.push_back(std::move(m));
        continue;
      }
    }
    out.push_back(std::move(t));
  }
  index->tensors = std::move(out);
  return Status::Ok();
}

}  // namespace fc
