// A DeepSpeed checkpoint at another DP size. Contract: include/fc/format/deepspeed_writer.h;
// the partitioning rule: shared/reference/deepspeed.md 3.1.
//
// Why every file is re-pickled from the source's value tree rather than built from scratch:
// the model states and optimizer files carry keys fc has no reason to understand (client
// state, ds_config, loss scaler objects, Megatron args); re-emitting the parsed tree keeps
// them as they were, and only the DP-dependent values are replaced by new nodes. Tensors
// the rewrite does not touch (module weights, steps, frozen fragments) keep their storage
// records byte for byte, re-keyed in order of appearance.
//
// Why the new partitions are described as element ranges of the old ones: the flat buffer
// of a param group is the same sequence of elements at every DP size (params concatenated
// in param_shapes order, zero tail padding to a multiple of 2*dp); only where it is cut
// changes. A new partition is therefore a few ranges of old partitions plus zeros, which the
// caller's plan reads in place.
#include "fc/format/deepspeed_writer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "fc/codec/pickle_build.h"
#include "fc/codec/pickle_reemit.h"
#include "fc/codec/pickle_writer.h"
#include "fc/core/checked_math.h"
#include "fc/format/deepspeed.h"
#include "fc/format/torch_save.h"
#include "fc/io/file.h"
#include "src/format/deepspeed/names.h"

namespace fc {
namespace {

using deepspeed_internal::MpName;

using internal_torch::PickleWriter;
using PV = PickleValue;
using K = PickleValue::Kind;

// ---------------------------------------------------------------------------------------
PV::Ptr Node(PV v) { return std::make_shared<const PV>(std::move(v)); }

// A copy of `from` (a dict, or a call/object with entries) with the entries for which
// `replace` returns a node replaced by it.
PV::Ptr ReplaceEntries(const PV& from,
                       const std::function<PV::Ptr(const std::string&, const PV::Ptr&)>& replace) {
  PV copy = from;
  for (auto& [k, v] : copy.entries) {
    if (!k->is_str()) continue;
    if (PV::Ptr n = replace(k->str, v)) v = std::move(n);
  }
  return Node(std::move(copy));
}

// ---------------------------------------------------------------------------------------
// Source files.

struct SourceFile {
  std::string path;  // absolute
  uint32_t index = 0;  // in DsRepartition::source.files
  uint64_t size = 0;
  PickleValue root;
  // Storage key -> [offset, + bytes) in the file (zip record or legacy raw storage).
  std::map<std::string, std::pair<uint64_t, uint64_t>> storages;
};

Result<SourceFile> OpenSource(const std::string& dir, const std::string& name) {
  SourceFile sf;
  sf.path = JoinPath(dir, name);
  FC_ASSIGN_OR_RETURN(DeepSpeedPtFile pt, ReadDeepSpeedPtFile(sf.path));
  sf.size = pt.size;
  sf.root = std::move(pt.root);
  sf.storages = std::move(pt.storages);
  return sf;
}

// The data of storage `key`: [offset, + bytes).
Result<std::pair<uint64_t, uint64_t>> StorageRecord(const SourceFile& sf, const std::string& key) {
  auto it = sf.storages.find(key);
  if (it == sf.storages.end()) {
    return DataLossError(sf.path + ": storage '" + key + "' is not in the file (or compressed)");
  }
  const auto [offset, bytes] = it->second;
  const std::optional<uint64_t> end = CheckedAddU(offset, bytes);
  if (!end || *end > sf.size) {
    return DataLossError(sf.path + ": storage '" + key + "' passes the file's end");
  }
  return it->second;
}

// Builds one output archive: the pickle of a tree whose storages are re-keyed, tensors the
// rewrite creates (placeholders) emitted with their new storages.
class ArchiveBuilder {
 public:
  explicit ArchiveBuilder(std::string path) { spec_.path = std::move(path); }

  // A new 1-D tensor of `view` elements over a new storage of record.elements elements.
  // `storage_class`: the GLOBAL torch.<X>Storage to name (taken from the source tensor).
  PV::Ptr NewTensor(DsRecord record, int64_t view, PV::Ptr storage_class) {
    PV::Ptr node = Node(PV());
    placeholders_[node.get()] = {spec_.records.size(), view, std::move(storage_class)};
    spec_.records.push_back(std::move(record));
    return node;
  }

  // Emits `root`; persistent ids of `source` become copied records.
  Result<DsArchiveSpec> Finish(const PV& root, const SourceFile& source) {
    PickleWriter w(2);
    PickleEmitHook hook = [&](PickleWriter& pw, const PV& v) -> std::optional<Status> {
      if (auto it = placeholders_.find(&v); it != placeholders_.end()) {
        EmitNewTensor(pw, it->second);
        return Status::Ok();
      }
      if (v.kind != K::kPersId) return std::nullopt;
      return EmitSourceStorage(pw, v, source);
    };
    FC_RETURN_IF_ERROR(EmitPickleValue(w, root, spec_.path, hook));
    spec_.pickle = w.Finish();
    return std::move(spec_);
  }

 private:
  struct Placeholder {
    size_t record = 0;
    int64_t view = 0;
    PV::Ptr storage_class;
  };

  void EmitNewTensor(PickleWriter& w, const Placeholder& p) {
    const DsRecord& r = spec_.records[p.record];
    w.Global("torch._utils", "_rebuild_tensor_v2");
    w.Mark();
    w.Mark();  // the persistent id
    w.Str("storage").Memoize();
    w.Global(p.storage_class->str, p.storage_class->name);
    w.Str(std::to_string(p.record)).Memoize();
    w.Str("cpu").Memoize();
    w.Int(r.elements);
    w.TupleOf(5).Memoize();
    w.BinPersId();
    w.Int(0);  // storage_offset
    w.Int(p.view).TupleOf(1).Memoize();
    w.Int(1).TupleOf(1).Memoize();
    w.Bool(false);  // requires_grad
    w.Global("collections", "OrderedDict").EmptyTuple().Reduce().Memoize();
    w.TupleOf(6).Memoize();
    w.Reduce().Memoize();
  }

  // ('storage', class, key, location, numel) with the key renumbered; BINPERSID.
  Status EmitSourceStorage(PickleWriter& w, const PV& v, const SourceFile& source) {
    const PV* pid = v.callee.get();
    // Legacy files add a sixth item, view_metadata (None); the zip form has five.
    if (pid == nullptr || !pid->is_tuple() || pid->items.size() < 5 || pid->items.size() > 6 ||
        !pid->items[2]->is_str() || (pid->items.size() == 6 && !pid->items[5]->is_none())) {
      return DataLossError(source.path + ": persistent id " + v.DebugString(80) +
                           " is not a torch storage");
    }
    const std::string& key = pid->items[2]->str;
    auto it = keys_.find(key);
    if (it == keys_.end()) {
      FC_ASSIGN_OR_RETURN(auto rec, StorageRecord(source, key));
      DsRecord r;
      r.kind = DsRecord::Kind::kCopy;
      r.bytes = rec.second;
      r.copy_from = source.path;
      r.copy_offset = rec.first;
      it = keys_.emplace(key, spec_.records.size()).first;
      spec_.records.push_back(std::move(r));
    }
    PV copy = *pid;
    copy.items.resize(5);
    copy.items[2] = PickleStr(std::to_string(it->second));
    FC_RETURN_IF_ERROR(EmitPickleValue(w, copy, source.path));
    w.BinPersId();
    return Status::Ok();
  }

  DsArchiveSpec spec_;
  std::map<const PV*, Placeholder> placeholders_;
  std::map<std::string, size_t> keys_;  // source storage key -> record
};

// ---------------------------------------------------------------------------------------
// The partition math (deepspeed.md 3.1).

int64_t PaddedLength(int64_t orig, int64_t dp) {
  const int64_t align = 2 * dp;
  return (orig + align - 1) / align * align;
}

// Real (non-padding) elements of rank r's partition.
int64_t LeanLength(int64_t orig, int64_t ps, int64_t r) {
  return std::clamp<int64_t>(orig - r * ps, 0, ps);
}

// numel of a torch.Size / tuple value.
Result<int64_t> ShapeNumel(const PV& v, const std::string& where) {
  const PV* t = &v;
  if (v.kind == K::kCall && v.args && v.args->is_tuple() && v.args->items.size() == 1) {
    t = v.args->items[0].get();
  }
  if (!t->is_tuple() && !t->is_list()) {
    return DataLossError(where + ": shape " + v.DebugString(60) + " is not a torch.Size");
  }
  int64_t n = 1;
  for (const PV::Ptr& d : t->items) {
    if (!d->is_int() || d->int_value < 0) {
      return DataLossError(where + ": shape " + v.DebugString(60) + " has a bad extent");
    }
    auto m = CheckedMul(n, d->int_value);
    if (!m) return OutOfRangeError(where + ": shape " + v.DebugString(60) + " overflows");
    n = *m;
  }
  return n;
}

// One source partition tensor, located.
struct Located {
  TorchTensorRef ref;
  uint64_t first = 0;  // absolute offset of element 0
};

Result<Located> LocateTensor(const SourceFile& sf, const PV* v, const std::string& what) {
  if (v == nullptr) return DataLossError(sf.path + ": " + what + " is missing");
  auto ref = DecodeTorchTensor(*v);
  if (!ref.ok()) return ref.status().With(sf.path + ": " + what);
  if (ref->shape.size() != 1) {
    return DataLossError(sf.path + ": " + what + " has " + std::to_string(ref->shape.size()) +
                         " dimensions, a flat partition has 1");
  }
  FC_ASSIGN_OR_RETURN(auto rec, StorageRecord(sf, ref->storage_key));
  if (rec.second != ref->storage_bytes) {
    return DataLossError(sf.path + ": " + what + ": storage record holds " +
                         std::to_string(rec.second) + " bytes, the pickle says " +
                         std::to_string(ref->storage_bytes));
  }
  Located l;
  l.first = rec.first + static_cast<uint64_t>(ref->storage_offset) * DTypeSize(ref->dtype);
  l.ref = std::move(*ref);
  return l;
}

// The GLOBAL torch.<X>Storage of the first persistent id inside a tensor value (typed
// storages only: a new storage's numel counts elements).
Result<PV::Ptr> StorageClassOf(const PV& v, const std::string& where) {
  if (v.kind == K::kPersId) {
    const PV* pid = v.callee.get();
    if (pid && pid->is_tuple() && pid->items.size() >= 5 && pid->items[1]->kind == K::kGlobal &&
        pid->items[1]->name.ends_with("Storage") && pid->items[1]->name != "UntypedStorage") {
      return pid->items[1];
    }
    return UnimplementedError(where + ": storage " + v.DebugString(80) +
                              " is not a typed torch storage");
  }
  for (const PV::Ptr& p : {v.callee, v.args}) {
    if (p) {
      auto r = StorageClassOf(*p, where);
      if (r.ok() || r.status().code() != StatusCode::kNotFound) return r;
    }
  }
  for (const PV::Ptr& p : v.items) {
    auto r = StorageClassOf(*p, where);
    if (r.ok() || r.status().code() != StatusCode::kNotFound) return r;
  }
  return NotFoundError(where + ": no storage");
}

struct GroupSource {
  int64_t orig = 0;                        // real elements of the flat buffer
  std::vector<std::pair<std::string, int64_t>> params;  // param_shapes order: name, numel
  PV::Ptr storage_class;                   // the fp32 partition's torch.<X>Storage global
  PV::Ptr state_storage_class;             // exp_avg's
  DType dtype = DType::kFloat32;           // master dtype
  DType state_dtype = DType::kFloat32;
  // Source tensor index per (old rank) for fp32, exp_avg, exp_avg_sq (lean parts).
  std::vector<int64_t> fp32, exp_avg, exp_avg_sq;
};

class Repartitioner {
 public:
  explicit Repartitioner(DsRepartition& job) : job_(job) {}

  // Adds a source tensor: the first `elements` of a located 1-D tensor.
  int64_t AddSource(const std::string& key, const SourceFile& sf, const Located& l,
                    int64_t elements) {
    TensorEntry t;
    t.key = key;
    t.dtype = l.ref.dtype;
    t.global_shape = {elements};
    Chunk c;
    c.box = Box::Whole(t.global_shape);
    c.file = sf.index;
    c.byte_offset = l.first;
    c.byte_length = static_cast<uint64_t>(elements) * DTypeSize(l.ref.dtype);
    if (elements > 1 && l.ref.strides[0] != 1) c.strides = {l.ref.strides[0]};
    if (!c.strides.empty()) {
      c.byte_length = (static_cast<uint64_t>(elements - 1) * l.ref.strides[0] + 1) *
                      DTypeSize(l.ref.dtype);
    }
    t.chunks.push_back(std::move(c));
    job_.source.tensors.push_back(std::move(t));
    return static_cast<int64_t>(job_.source.tensors.size() - 1);
  }

  uint32_t AddFile(SourceFile& sf) {
    sf.index = static_cast<uint32_t>(job_.source.files.size());
    job_.source.files.push_back({Basename(sf.path), sf.size});
    return sf.index;
  }

  // The record of new rank r's partition of one state of a group: `storage` elements
  // (the padded partition) from the old ranks' lean parts, zeros after the real ones.
  DsRecord Partition(const GroupSource& g, const std::vector<int64_t>& sources, DType dtype,
                     int64_t r, const std::string& name) const {
    return PartitionOver(g, sources, dtype, job_.source_dp, job_.dp, r, name);
  }

  // The same for a group cut over `old_count` partitions before and `new_count` after
  // (MoE expert groups: the expert-data-parallel sizes); r is the new partition.
  static DsRecord PartitionOver(const GroupSource& g, const std::vector<int64_t>& sources,
                                DType dtype, int64_t old_count, int64_t new_count, int64_t r,
                                const std::string& name) {
    const int64_t ps_new = PaddedLength(g.orig, new_count) / new_count;
    const int64_t ps_old = PaddedLength(g.orig, old_count) / old_count;
    DsRecord rec;
    rec.kind = DsRecord::Kind::kStream;
    rec.dtype = dtype;
    rec.elements = ps_new;
    rec.bytes = static_cast<uint64_t>(ps_new) * DTypeSize(dtype);
    rec.name = name;
    const int64_t begin = r * ps_new, end = begin + ps_new;
    for (int64_t o = 0; o < old_count; ++o) {
      const int64_t lo = std::max(begin, o * ps_old);
      const int64_t hi = std::min(end, o * ps_old + LeanLength(g.orig, ps_old, o));
      if (lo < hi) rec.parts.push_back({sources[o], lo - o * ps_old, lo - begin, hi - lo});
    }
    const int64_t lean = LeanLength(g.orig, ps_new, r);
    if (lean < ps_new) rec.parts.push_back({-1, 0, lean, ps_new - lean});
    return rec;
  }

 private:
  DsRepartition& job_;
};

// param_slice_mappings[g] of new rank r: OrderedDict name -> fragment_address(numel, start).
PV::Ptr SliceMappings(const GroupSource& g, int64_t ps, int64_t r, const PV::Ptr& fragment_cls) {
  std::vector<std::pair<std::string, PV::Ptr>> entries;
  const int64_t left = r * ps;
  int64_t off = 0;
  for (const auto& [name, n] : g.params) {
    const int64_t lo = std::max(off, left), hi = std::min(off + n, left + ps);
    if (lo < hi) {
      PV frag;
      frag.kind = K::kObject;
      frag.callee = fragment_cls;
      frag.args = PickleTuple({});
      frag.state = PickleDict({{"numel", PickleInt(hi - lo)}, {"start", PickleInt(lo - left)}});
      entries.emplace_back(name, Node(std::move(frag)));
    }
    off += n;
  }
  return PickleOrderedDict(std::move(entries));
}

Result<std::string> ResolveTagDir(const std::string& input, std::string* save_dir) {
  const std::string in = StripTrailingSlashes(input);
  const std::string latest = JoinPath(in, "latest");
  if (PathExists(latest) && !IsDirectory(latest)) {
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(latest, 4096));
    std::string tag(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) {
      tag.pop_back();
    }
    *save_dir = in;
    return JoinPath(in, tag);
  }
  if (PathExists(JoinPath(in, "latest_universal")) || IsDirectory(JoinPath(in, "zero"))) {
    return UnimplementedError(in + ": a Universal Checkpoint is loaded at any DP size "
                              "(load_universal); --output-format deepspeed re-partitions "
                              "ZeRO checkpoints only");
  }
  const std::string parent = Dirname(in);
  if (!parent.empty() && PathExists(JoinPath(parent, "zero_to_fp32.py"))) *save_dir = parent;
  return in;
}

// XX of "mp_rank_XX_model_states.pt" (two or more digits), or -1.
int64_t MpRankOf(const std::string& n) {
  const std::string head = "mp_rank_", tail = "_model_states.pt";
  if (!n.starts_with(head) || !n.ends_with(tail) || n.size() < head.size() + tail.size() + 2 ||
      n.size() > head.size() + tail.size() + 9) {
    return -1;
  }
  int64_t v = 0;
  for (size_t i = head.size(); i < n.size() - tail.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(n[i]))) return -1;
    v = v * 10 + (n[i] - '0');
  }
  return v;
}

// Parses "<prefix>zero_pp_rank_<R>_mp_rank_<XX><suffix>" (suffix: "_optim_states.pt" or,
// ZeRO-3, "_model_states.pt").
bool ParseRankName(const std::string& n, const std::string& suffix, std::string* prefix,
                   int64_t* r, int64_t* m) {
  const std::string mid = "zero_pp_rank_";
  const size_t at = n.find(mid);
  if (at == std::string::npos || !n.ends_with(suffix)) return false;
  *prefix = n.substr(0, at);
  if (*prefix != "" && *prefix != "bf16_" && *prefix != "fp16_") return false;
  size_t i = at + mid.size();
  auto number = [&](int64_t* out) {
    const size_t start = i;
    int64_t v = 0;
    while (i < n.size() && n[i] >= '0' && n[i] <= '9' && i - start < 9) v = v * 10 + (n[i++] - '0');
    *out = v;
    return i > start;
  };
  if (!number(r)) return false;
  if (n.compare(i, 9, "_mp_rank_") != 0) return false;
  i += 9;
  if (!number(m)) return false;
  return n.compare(i, std::string::npos, suffix) == 0;
}


void AddZeroToFp32(DsRepartition& job, const std::string& save_dir) {
  if (save_dir.empty()) return;
  const std::string script = JoinPath(save_dir, "zero_to_fp32.py");
  if (PathExists(script) && !IsDirectory(script)) job.copies.emplace_back(script, "zero_to_fp32.py");
}

// ZeRO-3 (deepspeed.md 4.1): every param is split on its own, ceil(numel / dp) elements per
// rank with the padding at the tail; a sub-group's flat tensor is its params' slices
// concatenated. A new slice is a few ranges of old slices plus zeros.
struct Zero3Param {
  std::string name;
  int64_t numel = 0;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Appends to `rec` the parts of param `p` of new rank r: its new slice at `dst_at`, from the
// old ranks' slices at `src_at[o]` of sources[o].
void AddZero3Parts(DsRecord& rec, int64_t numel, int64_t old_dp, int64_t new_dp, int64_t r,
                   const std::vector<int64_t>& sources, const std::vector<int64_t>& src_at,
                   int64_t dst_at) {
  const int64_t ps_old = CeilDiv(numel, old_dp), ps_new = CeilDiv(numel, new_dp);
  const int64_t begin = r * ps_new, real = std::clamp<int64_t>(numel - begin, 0, ps_new);
  for (int64_t o = 0; o < old_dp; ++o) {
    const int64_t lo = std::max(begin, o * ps_old);
    const int64_t hi = std::min(begin + real, o * ps_old + std::clamp<int64_t>(numel - o * ps_old, 0, ps_old));
    if (lo < hi) {
      rec.parts.push_back({sources[o], src_at[o] + lo - o * ps_old, dst_at + lo - begin, hi - lo});
    }
  }
  if (real < ps_new) rec.parts.push_back({-1, 0, dst_at + real, ps_new - real});
}

// DeepSpeed's _create_fp16_sub_groups for one param group: the param counts of its
// sub-groups (params taken in order until their slices reach sub_group_size).
std::vector<size_t> SubGroupSplit(const std::vector<int64_t>& numels, int64_t dp, double size) {
  double total = 0;
  for (int64_t n : numels) total += static_cast<double>(CeilDiv(n, dp));
  if (size >= total) return {numels.size()};
  std::vector<size_t> out;
  size_t count = 0;
  double local = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    ++count;
    local += static_cast<double>(CeilDiv(numels[i], dp));
    if (local >= size || i + 1 == numels.size()) {
      out.push_back(count);
      count = 0;
      local = 0;
    }
  }
  return out;
}

// Refuses a re-partition after which DeepSpeed would group the params into other
// sub-groups: when the config's sub_group_size (default 1e9) gives the source's split at the
// source DP size but another one at the new size. A source the rule does not reproduce (or
// without the facts to check) keeps its split.
Status CheckSubGroups(const std::vector<std::vector<Zero3Param>>& groups, const PV& model,
                      const PV& optim, int64_t old_dp, int64_t dp, const std::string& where) {
  double size = 1e9;
  if (const PV* cfg = model.Find("ds_config"); cfg && cfg->is_dict()) {
    if (const PV* z = cfg->Find("zero_optimization"); z && z->is_dict()) {
      if (const PV* v = z->Find("sub_group_size")) {
        if (v->is_int()) size = static_cast<double>(v->int_value);
        if (v->kind == K::kFloat) size = v->float_value;
      }
    }
  }
  const PV* osd = optim.Find("optimizer_state_dict");
  const PV* inner = osd ? osd->Find("optimizer_state_dict") : nullptr;
  const PV* pgs = inner ? inner->Find("param_groups") : nullptr;
  if (pgs == nullptr || !pgs->is_list()) return Status::Ok();
  for (size_t j = 0; j < pgs->items.size(); ++j) {
    const PV* ids = pgs->items[j]->Find("params");
    if (ids == nullptr || !ids->is_list()) return Status::Ok();
    std::vector<int64_t> numels;
    std::vector<size_t> split;
    for (const PV::Ptr& id : ids->items) {
      if (!id->is_int() || id->int_value < 0 ||
          id->int_value >= static_cast<int64_t>(groups.size())) {
        return Status::Ok();
      }
      const std::vector<Zero3Param>& g = groups[static_cast<size_t>(id->int_value)];
      split.push_back(g.size());
      for (const Zero3Param& p : g) numels.push_back(p.numel);
    }
    if (numels.empty()) continue;
    const std::vector<size_t> at_old = SubGroupSplit(numels, old_dp, size);
    const std::vector<size_t> at_new = SubGroupSplit(numels, dp, size);
    if (at_old == split && at_new != at_old) {
      return UnimplementedError(
          where + ": param group " + std::to_string(j) + ": sub_group_size " +
          std::to_string(static_cast<int64_t>(size)) + " splits its params into " +
          std::to_string(at_old.size()) + " sub-group(s) at dp " + std::to_string(old_dp) +
          " but " + std::to_string(at_new.size()) + " at dp " + std::to_string(dp) +
          ", with other boundaries: DeepSpeed would regroup them; fc keeps the source's "
          "sub-groups and does not regroup");
    }
  }
  return Status::Ok();
}

DsRecord StreamRecord(DType dtype, int64_t elements, std::string name) {
  DsRecord rec;
  rec.kind = DsRecord::Kind::kStream;
  rec.dtype = dtype;
  rec.elements = elements;
  rec.bytes = static_cast<uint64_t>(elements) * DTypeSize(dtype);
  rec.name = std::move(name);
  return rec;
}

// An optimizer's `state` dict {group: {exp_avg, exp_avg_sq, step, ...}} with each group's
// exp_avg / exp_avg_sq replaced by moment(g, squared); keys outside 0..groups-1 (the callers
// checked there are none) and the other entries kept.
template <typename Moment>
PV::Ptr WithMoments(const PV& state, size_t groups, Moment moment) {
  PV copy = state;
  for (auto& [gk, gv] : copy.entries) {
    if (!gk->is_int() || gk->int_value < 0 || gk->int_value >= static_cast<int64_t>(groups)) {
      continue;
    }
    const size_t g = static_cast<size_t>(gk->int_value);
    gv = ReplaceEntries(*gv, [&](const std::string& sk, const PV::Ptr&) -> PV::Ptr {
      if (sk == "exp_avg") return moment(g, false);
      if (sk == "exp_avg_sq") return moment(g, true);
      return nullptr;
    });
  }
  return Node(std::move(copy));
}

Status PlanZero3(DsRepartition& job,
                 const std::map<int64_t, std::map<int64_t, std::string>>& model3,
                 const std::map<int64_t, std::map<int64_t, std::string>>& optim,
                 const std::string& model_prefix, const std::string& prefix) {
  job.variant = "zero3";
  job.mp = static_cast<int64_t>(model3.size());
  if (model3.rbegin()->first != job.mp - 1) {
    return NotFoundError(job.tag_dir + ": model-parallel ranks are not 0.." +
                         std::to_string(job.mp - 1));
  }
  Repartitioner rp(job);
  const int64_t dp = job.dp;
  for (const auto& [m, models] : model3) {
    auto oit = optim.find(m);
    if (oit == optim.end() || oit->second.size() != models.size()) {
      return NotFoundError(job.tag_dir + ": " + MpName(m) + ": " + std::to_string(models.size()) +
                           " ZeRO-3 model-states files but " +
                           std::to_string(oit == optim.end() ? 0 : oit->second.size()) +
                           " optimizer files");
    }
    const int64_t old_dp = static_cast<int64_t>(models.size());
    if (models.rbegin()->first != old_dp - 1 || oit->second.rbegin()->first != old_dp - 1) {
      return NotFoundError(job.tag_dir + ": DP ranks of " + MpName(m) + " are not 0.." +
                           std::to_string(old_dp - 1));
    }
    if (job.source_dp != 0 && job.source_dp != old_dp) {
      return DataLossError(job.tag_dir + ": " + MpName(m) + " has " + std::to_string(old_dp) +
                           " DP ranks, " + MpName(0) + " " + std::to_string(job.source_dp));
    }
    job.source_dp = old_dp;
    std::vector<SourceFile> mfiles, ofiles;
    for (const auto& [r, name] : models) {
      FC_ASSIGN_OR_RETURN(SourceFile sf, OpenSource(job.tag_dir, name));
      rp.AddFile(sf);
      if (!sf.root.is_dict()) return DataLossError(sf.path + ": not a dict");
      mfiles.push_back(std::move(sf));
    }
    for (const auto& [r, name] : oit->second) {
      FC_ASSIGN_OR_RETURN(SourceFile sf, OpenSource(job.tag_dir, name));
      rp.AddFile(sf);
      ofiles.push_back(std::move(sf));
    }
    const SourceFile& model0 = mfiles.front();
    // Sub-groups (param_shapes order) and frozen params.
    const PV* shapes = model0.root.Find("param_shapes");
    if (shapes == nullptr || !shapes->is_list()) {
      return DataLossError(model0.path + ": no param_shapes list");
    }
    std::vector<std::vector<Zero3Param>> groups(shapes->items.size());
    for (size_t k = 0; k < groups.size(); ++k) {
      for (const auto& [key, v] : shapes->items[k]->entries) {
        if (!key->is_str()) return DataLossError(model0.path + ": param_shapes key not a string");
        FC_ASSIGN_OR_RETURN(int64_t n, ShapeNumel(*v, model0.path + ": param_shapes['" + key->str + "']"));
        groups[k].push_back({key->str, n});
      }
    }
    std::vector<Zero3Param> frozen;
    if (const PV* fs = model0.root.Find("frozen_param_shapes"); fs && !fs->is_none()) {
      for (const auto& [key, v] : fs->entries) {
        if (!key->is_str()) {
          return DataLossError(model0.path + ": frozen_param_shapes key not a string");
        }
        FC_ASSIGN_OR_RETURN(int64_t n, ShapeNumel(*v, model0.path + ": frozen_param_shapes['" + key->str + "']"));
        frozen.push_back({key->str, n});
      }
    }
    FC_RETURN_IF_ERROR(CheckSubGroups(groups, model0.root, ofiles.front().root, old_dp, dp,
                                      ofiles.front().path));
    // Frozen fragments: per param, per old rank, the located fragment.
    std::vector<std::vector<int64_t>> frozen_src(frozen.size());
    std::vector<PV::Ptr> frozen_cls(frozen.size());
    std::vector<DType> frozen_dtype(frozen.size());
    for (int64_t o = 0; o < old_dp; ++o) {
      const SourceFile& sf = mfiles[o];
      const PV* frags = sf.root.Find("frozen_param_fragments");
      for (size_t i = 0; i < frozen.size(); ++i) {
        const std::string what = "frozen_param_fragments['" + frozen[i].name + "']";
        const PV* t = frags ? frags->Find(frozen[i].name) : nullptr;
        FC_ASSIGN_OR_RETURN(Located l, LocateTensor(sf, t, what));
        const int64_t ps = CeilDiv(frozen[i].numel, old_dp);
        if (l.ref.shape[0] != ps) {
          return DataLossError(sf.path + ": " + what + " has " + std::to_string(l.ref.shape[0]) +
                               " elements, ceil(" + std::to_string(frozen[i].numel) + " / " +
                               std::to_string(old_dp) + ") is " + std::to_string(ps));
        }
        if (o == 0) {
          frozen_dtype[i] = l.ref.dtype;
          FC_ASSIGN_OR_RETURN(frozen_cls[i], StorageClassOf(*t, sf.path + ": " + what));
        } else if (l.ref.dtype != frozen_dtype[i]) {
          return DataLossError(sf.path + ": " + what + " dtype differs by rank");
        }
        frozen_src[i].push_back(rp.AddSource(MpName(m) + ".rank" + std::to_string(o) + ".frozen." +
                                                 frozen[i].name, sf, l, ps));
      }
    }
    // Optimizer partitions: per sub-group, per state (fp32, exp_avg, exp_avg_sq), per old rank.
    const size_t K = groups.size();
    std::vector<std::array<std::vector<int64_t>, 3>> src(K);
    std::vector<std::array<PV::Ptr, 3>> cls(K);
    std::vector<std::array<DType, 3>> dtypes(K);
    static constexpr const char* kStates[] = {"fp32", "exp_avg", "exp_avg_sq"};
    for (int64_t o = 0; o < old_dp; ++o) {
      const SourceFile& sf = ofiles[o];
      const PV* osd = sf.root.Find("optimizer_state_dict");
      if (osd == nullptr || !osd->is_dict()) return DataLossError(sf.path + ": no optimizer_state_dict");
      const PV* flat = osd->Find("fp32_flat_groups");
      const PV* inner = osd->Find("optimizer_state_dict");
      const PV* state = inner ? inner->Find("state") : nullptr;
      const PV* pc = osd->Find("partition_count");
      if (osd->Find("ds_zero_partition_groups")) {
        return UnimplementedError(sf.path + ": AutoEP ZeRO-3 partition groups: not re-partitioned");
      }
      if (pc == nullptr || !pc->is_int() || pc->int_value != old_dp) {
        return DataLossError(sf.path + ": partition_count " + (pc ? pc->DebugString(40) : std::string("missing")) +
                             " but " + std::to_string(old_dp) + " DP rank files for " + MpName(m));
      }
      if (flat == nullptr || !flat->is_list() || flat->items.size() != K) {
        return DataLossError(sf.path + ": fp32_flat_groups is not a list of " + std::to_string(K) +
                             " (param_shapes sub-groups)");
      }
      if (state == nullptr || !state->is_dict() || state->entries.size() != K) {
        return DataLossError(sf.path + ": optimizer_state_dict.state does not hold " +
                             std::to_string(K) + " sub-groups");
      }
      for (const auto& [key, st] : state->entries) {
        if (!key->is_int() || key->int_value < 0 || key->int_value >= static_cast<int64_t>(K) ||
            !st->is_dict()) {
          return DataLossError(sf.path + ": optimizer_state_dict.state key " + key->DebugString(20) +
                               " is not a sub-group index");
        }
        const size_t k = static_cast<size_t>(key->int_value);
        if (src[k][0].size() != static_cast<size_t>(o)) {
          return DataLossError(sf.path + ": optimizer_state_dict.state holds sub-group " +
                               std::to_string(k) + " twice");
        }
        int64_t length = 0;
        for (const Zero3Param& p : groups[k]) length += CeilDiv(p.numel, old_dp);
        const PV* values[3] = {flat->items[k].get(), st->Find("exp_avg"), st->Find("exp_avg_sq")};
        for (int s = 0; s < 3; ++s) {
          const std::string what = s == 0 ? "fp32_flat_groups[" + std::to_string(k) + "]"
                                          : "optimizer_state_dict.state[" + std::to_string(k) +
                                                "]." + kStates[s];
          FC_ASSIGN_OR_RETURN(Located l, LocateTensor(sf, values[s], what));
          if (l.ref.shape[0] != length) {
            return DataLossError(sf.path + ": " + what + " has " + std::to_string(l.ref.shape[0]) +
                                 " elements, its params' slices " + std::to_string(length));
          }
          if (o == 0) {
            dtypes[k][s] = l.ref.dtype;
            FC_ASSIGN_OR_RETURN(cls[k][s], StorageClassOf(*values[s], sf.path + ": " + what));
          } else if (l.ref.dtype != dtypes[k][s]) {
            return DataLossError(sf.path + ": " + what + " dtype differs by rank");
          }
          src[k][s].push_back(rp.AddSource(MpName(m) + ".rank" + std::to_string(o) + ".subgroup" +
                                               std::to_string(k) + "." + kStates[s], sf, l, length));
        }
      }
    }
    // The new ranks' files, from DP rank 0's trees.
    for (int64_t r = 0; r < dp; ++r) {
      const std::string rank = "zero_pp_rank_" + std::to_string(r) + "_" + MpName(m);
      const std::string label = MpName(m) + " rank " + std::to_string(r);
      // Model states: dp_world_size, frozen_param_fragments.
      ArchiveBuilder mout(JoinPath(job.tag, model_prefix + rank + "_model_states.pt"));
      PV frags;
      bool has_frags = false;
      if (const PV* f0 = model0.root.Find("frozen_param_fragments"); f0 && !f0->is_none()) {
        frags = *f0;
        has_frags = true;
        frags.entries.clear();
        for (size_t i = 0; i < frozen.size(); ++i) {
          const int64_t ps = CeilDiv(frozen[i].numel, dp);
          DsRecord rec = StreamRecord(frozen_dtype[i], ps, label + " frozen " + frozen[i].name);
          std::vector<int64_t> zeros(static_cast<size_t>(old_dp), 0);
          AddZero3Parts(rec, frozen[i].numel, old_dp, dp, r, frozen_src[i], zeros, 0);
          frags.entries.emplace_back(PickleStr(frozen[i].name),
                                     mout.NewTensor(std::move(rec), ps, frozen_cls[i]));
        }
      }
      PV::Ptr mroot = ReplaceEntries(model0.root, [&](const std::string& k, const PV::Ptr&) -> PV::Ptr {
        if (k == "dp_world_size") return PickleInt(dp);
        if (k == "frozen_param_fragments" && has_frags) return Node(frags);
        return nullptr;
      });
      FC_ASSIGN_OR_RETURN(DsArchiveSpec mspec, mout.Finish(*mroot, model0));
      job.archives.push_back(std::move(mspec));
      // Optimizer states: partition_count, fp32_flat_groups, exp_avg, exp_avg_sq.
      ArchiveBuilder out(JoinPath(job.tag, prefix + rank + "_optim_states.pt"));
      std::vector<std::array<PV::Ptr, 3>> made(K);
      for (size_t k = 0; k < K; ++k) {
        std::vector<int64_t> old_at(static_cast<size_t>(old_dp), 0);
        int64_t length = 0;
        for (const Zero3Param& p : groups[k]) length += CeilDiv(p.numel, dp);
        for (int s = 0; s < 3; ++s) {
          DsRecord rec = StreamRecord(dtypes[k][s], length,
                                      label + " sub-group " + std::to_string(k) + " " + kStates[s]);
          int64_t dst_at = 0;
          std::fill(old_at.begin(), old_at.end(), 0);
          for (const Zero3Param& p : groups[k]) {
            AddZero3Parts(rec, p.numel, old_dp, dp, r, src[k][s], old_at, dst_at);
            dst_at += CeilDiv(p.numel, dp);
            for (int64_t& a : old_at) a += CeilDiv(p.numel, old_dp);
          }
          made[k][s] = out.NewTensor(std::move(rec), length, cls[k][s]);
        }
      }
      const SourceFile& opt0 = ofiles.front();
      const PV* osd0 = opt0.root.Find("optimizer_state_dict");
      PV::Ptr new_osd = ReplaceEntries(*osd0, [&](const std::string& k, const PV::Ptr& v) -> PV::Ptr {
        if (k == "partition_count") return PickleInt(dp);
        if (k == "fp32_flat_groups") {
          PV list = *v;
          for (size_t g = 0; g < K; ++g) list.items[g] = made[g][0];
          return Node(std::move(list));
        }
        if (k != "optimizer_state_dict") return nullptr;
        return ReplaceEntries(*v, [&](const std::string& ik, const PV::Ptr& iv) -> PV::Ptr {
          if (ik != "state") return nullptr;
          return WithMoments(*iv, made.size(), [&](size_t g, bool sq) { return made[g][sq ? 2 : 1]; });
        });
      });
      PV::Ptr root = ReplaceEntries(opt0.root, [&](const std::string& k, const PV::Ptr&) {
        return k == "optimizer_state_dict" ? new_osd : PV::Ptr();
      });
      FC_ASSIGN_OR_RETURN(DsArchiveSpec spec, out.Finish(*root, opt0));
      job.archives.push_back(std::move(spec));
    }
  }
  return Status::Ok();
}
// The model states: dp_world_size replaced, everything else kept.
Status AddModelStates(DsRepartition& job, const std::string& model_name,
                      const SourceFile& model) {
  ArchiveBuilder model_out(JoinPath(job.tag, model_name));
  PV::Ptr model_root = ReplaceEntries(model.root, [&](const std::string& k, const PV::Ptr&) {
    return k == "dp_world_size" ? PickleInt(job.dp) : PV::Ptr();
  });
  FC_ASSIGN_OR_RETURN(DsArchiveSpec model_spec, model_out.Finish(*model_root, model));
  job.archives.push_back(std::move(model_spec));
  return Status::Ok();
}

// round_robin_gradients orders each group's params by k % dp (deepspeed.md 3.1 step 2): at
// another DP size the flat buffer holds them in another order.
Status CheckNoRoundRobin(const SourceFile& model) {
  // (MoE model states carry no ds_config; the optimizer files' copy is checked too.)
  if (const PV* cfg = model.root.Find("ds_config"); cfg && cfg->is_dict()) {
    const PV* z = cfg->Find("zero_optimization");
    const PV* rr = z && z->is_dict() ? z->Find("round_robin_gradients") : nullptr;
    if (rr && rr->kind == K::kBool && rr->bool_value) {
      return UnimplementedError(model.path + ": ds_config round_robin_gradients: the flat "
                                "buffers' param order depends on the DP size; not "
                                "re-partitioned");
    }
  }
  return Status::Ok();
}

// A new DP rank's ZeRO 1/2 optimizer file: source DP rank 0's tree with the partitions, the
// padding and partition counts, the slice mappings and each group's exp_avg / exp_avg_sq
// replaced (tensors placed in `out` by the caller); every other key kept.
Status AddOptimStates(DsRepartition& job, ArchiveBuilder out, const SourceFile& rank0,
                      PV::Ptr singles, PV::Ptr paddings, PV::Ptr partition_count,
                      PV::Ptr mappings, const std::vector<PV::Ptr>& ea,
                      const std::vector<PV::Ptr>& eas) {
  const PV* osd0 = rank0.root.Find("optimizer_state_dict");
  PV::Ptr new_osd = ReplaceEntries(*osd0, [&](const std::string& k, const PV::Ptr& v) -> PV::Ptr {
    if (k == "single_partition_of_fp32_groups") return singles;
    if (k == "group_paddings") return paddings;
    if (k == "partition_count") return partition_count;
    if (k == "param_slice_mappings") return mappings;
    if (k != "base_optimizer_state") return nullptr;
    return ReplaceEntries(*v, [&](const std::string& bk, const PV::Ptr& bv) -> PV::Ptr {
      if (bk != "state") return nullptr;
      return WithMoments(*bv, ea.size(), [&](size_t g, bool sq) { return sq ? eas[g] : ea[g]; });
    });
  });
  PV::Ptr root = ReplaceEntries(rank0.root, [&](const std::string& k, const PV::Ptr&) {
    return k == "optimizer_state_dict" ? new_osd : PV::Ptr();
  });
  FC_ASSIGN_OR_RETURN(DsArchiveSpec spec, out.Finish(*root, rank0));
  job.archives.push_back(std::move(spec));
  return Status::Ok();
}

// One old rank's partition of group g as plan sources: its fp32 partition (`lean` real
// elements; saved padded to `ps` by BF16_Optimizer, stripped otherwise) and the exp_avg /
// exp_avg_sq of `state` (padded to `ps`). The first rank (first) sets the group's dtypes and
// storage classes; the others must agree.
Status AddPartitionSources(Repartitioner& rp, const SourceFile& sf, const PV& single,
                           const PV& state, size_t g, int64_t ps, int64_t lean, bool bf16,
                           bool first, const std::string& key, GroupSource* gs) {
  const std::string where = "group " + std::to_string(g);
  FC_ASSIGN_OR_RETURN(Located fp32, LocateTensor(sf, &single, "single_partition_of_fp32_groups[" +
                                                                  std::to_string(g) + "]"));
  const int64_t want = bf16 ? ps : lean;
  if (fp32.ref.shape[0] != want) {
    return DataLossError(sf.path + ": single_partition_of_fp32_groups[" + std::to_string(g) +
                         "] has " + std::to_string(fp32.ref.shape[0]) +
                         " elements, the partition rule gives " + std::to_string(want) +
                         (bf16 ? " (BF16_Optimizer: padded)" : " (padding stripped)"));
  }
  if (first) {
    gs->dtype = fp32.ref.dtype;
    FC_ASSIGN_OR_RETURN(gs->storage_class, StorageClassOf(single, sf.path + ": " + where));
  }
  if (fp32.ref.dtype != gs->dtype) {
    return DataLossError(sf.path + ": " + where + " fp32 partition dtype differs by rank");
  }
  gs->fp32.push_back(rp.AddSource(key + "fp32", sf, fp32, lean));
  for (const char* s : {"exp_avg", "exp_avg_sq"}) {
    FC_ASSIGN_OR_RETURN(Located t, LocateTensor(sf, state.Find(s),
                                               "base_optimizer_state.state[" +
                                                   std::to_string(g) + "]." + s));
    if (t.ref.shape[0] != ps) {
      return DataLossError(sf.path + ": base_optimizer_state.state[" + std::to_string(g) +
                           "]." + s + " has " + std::to_string(t.ref.shape[0]) +
                           " elements, the padded partition " + std::to_string(ps));
    }
    if (first && s == std::string("exp_avg")) {
      gs->state_dtype = t.ref.dtype;
      FC_ASSIGN_OR_RETURN(gs->state_storage_class,
                          StorageClassOf(*state.Find(s), sf.path + ": " + where));
    }
    if (t.ref.dtype != gs->state_dtype) {
      return DataLossError(sf.path + ": " + where + " " + s + " dtype differs by rank");
    }
    (s == std::string("exp_avg") ? gs->exp_avg : gs->exp_avg_sq)
        .push_back(rp.AddSource(key + s, sf, t, lean));
  }
  return Status::Ok();
}

// Stage 1/2 and BF16_Optimizer: the files of model-parallel rank m at job.dp. optim_ranks:
// its DP rank files (nullptr: no optimizer files; the model states only).
Status PlanZero12(DsRepartition& job, Repartitioner& rp, int64_t m,
                  const std::string& model_name,
                  const std::map<int64_t, std::string>* optim_ranks,
                  const std::string& prefix) {
  const int64_t dp = job.dp;
  FC_ASSIGN_OR_RETURN(SourceFile model, OpenSource(job.tag_dir, model_name));
  rp.AddFile(model);
  if (!model.root.is_dict()) return DataLossError(model.path + ": not a dict");
  const PV* dpws = model.root.Find("dp_world_size");
  if (optim_ranks == nullptr) {
    job.source_dp = dpws && dpws->is_int() ? dpws->int_value : 0;
  }
  if (model.root.Find("ds_autoep_layers") || model.root.Find("autoep_layers")) {
    return UnimplementedError(model.path + ": AutoEP (MoE) checkpoint: not re-partitioned");
  }
  FC_RETURN_IF_ERROR(AddModelStates(job, model_name, model));
  if (optim_ranks == nullptr) return Status::Ok();
  FC_RETURN_IF_ERROR(CheckNoRoundRobin(model));
  // The groups: param_shapes of the model states.
  const PV* shapes = model.root.Find("param_shapes");
  if (shapes == nullptr || !shapes->is_list()) {
    return DataLossError(model.path + ": no param_shapes list (needed to lay out the flat "
                         "partitions)");
  }
  std::vector<GroupSource> groups(shapes->items.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& [k, v] : shapes->items[g]->entries) {
      if (!k->is_str()) return DataLossError(model.path + ": param_shapes key not a string");
      FC_ASSIGN_OR_RETURN(int64_t n, ShapeNumel(*v, model.path + ": param_shapes['" + k->str + "']"));
      groups[g].params.emplace_back(k->str, n);
      auto sum = CheckedAdd(groups[g].orig, n);
      if (!sum) return OutOfRangeError(model.path + ": param_shapes group size overflows");
      groups[g].orig = *sum;
    }
  }

  // The source DP ranks.
  const std::map<int64_t, std::string>& ranks = *optim_ranks;
  const int64_t source_dp = static_cast<int64_t>(ranks.size());
  if (ranks.rbegin()->first != source_dp - 1) {
    return NotFoundError(job.tag_dir + ": DP ranks of " + MpName(m) + " are not 0.." +
                         std::to_string(source_dp - 1) + " (" + ranks.rbegin()->second + ")");
  }
  if (job.source_dp != 0 && job.source_dp != source_dp) {
    return DataLossError(job.tag_dir + ": " + MpName(m) + " has " + std::to_string(source_dp) +
                         " DP ranks, " + MpName(0) + " " + std::to_string(job.source_dp));
  }
  job.source_dp = source_dp;
  std::vector<SourceFile> files;
  PV::Ptr fragment_cls;
  bool bf16 = false;
  bool count_list = false;  // partition_count saved as a list (one per group): kept a list
  for (const auto& [r, name] : ranks) {
    FC_ASSIGN_OR_RETURN(SourceFile sf, OpenSource(job.tag_dir, name));
    rp.AddFile(sf);
    const PV* osd = sf.root.Find("optimizer_state_dict");
    if (osd == nullptr || !osd->is_dict()) {
      return DataLossError(sf.path + ": no optimizer_state_dict dict");
    }
    if (osd->Find("fp32_flat_groups")) {
      return UnimplementedError(sf.path + ": ZeRO stage 3 (fp32_flat_groups): "
                                "--output-format deepspeed re-partitions stage 1/2 and "
                                "BF16_Optimizer checkpoints");
    }
    // partition_count: DeepSpeed 0.19's ZeRO 1/2 and BF16_Optimizer save a list, one count
    // per param group (zero_to_fp32 takes its max); older saves an int. A list whose every
    // count is the DP size is a dense checkpoint; other counts are MoE expert groups.
    const PV* pc = osd->Find("partition_count");
    const bool pc_list = pc != nullptr && (pc->is_list() || pc->is_tuple());
    if (pc_list) {
      bool dense = pc->items.size() == groups.size();
      for (const PV::Ptr& i : pc->items) {
        dense = dense && i->is_int() && i->int_value == source_dp;
      }
      if (!dense) {
        return UnimplementedError(sf.path + ": partition_count " + pc->DebugString(60) +
                                  " is not " + std::to_string(source_dp) + " for each of the " +
                                  std::to_string(groups.size()) + " param groups (MoE expert "
                                  "groups with their own DP size): not re-partitioned");
      }
    } else if (pc == nullptr || !pc->is_int() || pc->int_value != source_dp) {
      return DataLossError(sf.path + ": partition_count " +
                           (pc ? pc->DebugString(40) : std::string("missing")) + " but " +
                           std::to_string(source_dp) + " DP rank files for " + MpName(m));
    }
    if (r == 0) count_list = pc_list;
    if (pc_list != count_list) {
      return DataLossError(sf.path + ": partition_count is a list in some DP ranks' files only");
    }
    const bool this_bf16 = osd->Find("zero_stage") == nullptr;
    if (r == 0) bf16 = this_bf16;
    if (this_bf16 != bf16) {
      return DataLossError(sf.path + ": zero_stage present in some DP ranks' files only");
    }
    const PV* base = osd->Find("base_optimizer_state");
    if (base == nullptr || !base->is_dict() || osd->Find("base_optimizer_state_step")) {
      return UnimplementedError(sf.path + ": elastic (or missing) base_optimizer_state: "
                                "not re-partitioned");
    }
    const PV* single = osd->Find("single_partition_of_fp32_groups");
    const PV* state = base->Find("state");
    const PV* paddings = osd->Find("group_paddings");
    if (single == nullptr || !single->is_list() || single->items.size() != groups.size()) {
      return DataLossError(sf.path + ": single_partition_of_fp32_groups is not a list of " +
                           std::to_string(groups.size()) + " (param_shapes groups of " +
                           model_name + ")");
    }
    if (state == nullptr || !state->is_dict() || state->entries.size() != groups.size()) {
      return DataLossError(sf.path + ": base_optimizer_state.state does not hold " +
                           std::to_string(groups.size()) + " groups");
    }
    if (paddings == nullptr || !paddings->is_list() ||
        paddings->items.size() != groups.size()) {
      return DataLossError(sf.path + ": group_paddings is not a list of " +
                           std::to_string(groups.size()));
    }
    if (const PV* maps = osd->Find("param_slice_mappings"); maps && !fragment_cls) {
      for (const PV::Ptr& gm : maps->items) {
        for (const auto& [k, v] : gm->entries) {
          if (v->kind == K::kObject && v->callee) fragment_cls = v->callee;
        }
      }
    }
    for (const auto& [k, st] : state->entries) {
      if (!k->is_int() || k->int_value < 0 ||
          k->int_value >= static_cast<int64_t>(groups.size()) || !st->is_dict()) {
        return DataLossError(sf.path + ": base_optimizer_state.state key " +
                             k->DebugString(20) + " is not a group index");
      }
      const int64_t g = k->int_value;
      if (groups[g].fp32.size() != static_cast<size_t>(r)) {
        return DataLossError(sf.path + ": base_optimizer_state.state holds group " +
                             std::to_string(g) + " twice");
      }
      GroupSource& gs = groups[g];
      const int64_t ps = PaddedLength(gs.orig, source_dp) / source_dp;
      const int64_t lean = LeanLength(gs.orig, ps, r);
      const std::string where = "group " + std::to_string(g);
      const PV* pad = paddings->items[g].get();
      if (!pad->is_int() || pad->int_value != ps - lean) {
        return DataLossError(sf.path + ": group_paddings[" + std::to_string(g) + "] is " +
                             pad->DebugString(20) + ", the padding rule gives " +
                             std::to_string(ps - lean) + " (" + std::to_string(gs.orig) +
                             " elements over " + std::to_string(source_dp) + " ranks)");
      }
      FC_RETURN_IF_ERROR(AddPartitionSources(
          rp, sf, *single->items[g], *st, g, ps, lean, bf16, r == 0,
          MpName(m) + ".rank" + std::to_string(r) + ".group" + std::to_string(g) + ".", &gs));
    }
    files.push_back(std::move(sf));
  }
  job.variant = bf16 ? "bf16_optimizer" : "zero";
  if (!fragment_cls) fragment_cls = PickleGlobal("deepspeed.utils.tensor_fragment", "fragment_address");

  // The new DP ranks' files, from DP rank 0's tree.
  const SourceFile& rank0 = files.front();
  for (int64_t r = 0; r < dp; ++r) {
    const std::string name = prefix + "zero_pp_rank_" + std::to_string(r) + "_" + MpName(m) +
                             "_optim_states.pt";
    ArchiveBuilder out(JoinPath(job.tag, name));
    PV singles, paddings, mappings;
    singles.kind = paddings.kind = mappings.kind = K::kList;
    std::vector<PV::Ptr> ea(groups.size()), eas(groups.size());
    const std::string label = MpName(m) + " rank " + std::to_string(r) + " group ";
    for (size_t g = 0; g < groups.size(); ++g) {
      const GroupSource& gs = groups[g];
      const int64_t ps = PaddedLength(gs.orig, dp) / dp;
      const int64_t lean = LeanLength(gs.orig, ps, r);
      const std::string gl = label + std::to_string(g);
      singles.items.push_back(out.NewTensor(
          rp.Partition(gs, gs.fp32, gs.dtype, r, gl + " fp32"), bf16 ? ps : lean,
          gs.storage_class));
      ea[g] = out.NewTensor(rp.Partition(gs, gs.exp_avg, gs.state_dtype, r, gl + " exp_avg"),
                            ps, gs.state_storage_class);
      eas[g] = out.NewTensor(
          rp.Partition(gs, gs.exp_avg_sq, gs.state_dtype, r, gl + " exp_avg_sq"), ps,
          gs.state_storage_class);
      paddings.items.push_back(PickleInt(ps - lean));
      mappings.items.push_back(SliceMappings(gs, ps, r, fragment_cls));
    }
    PV::Ptr counts = PickleInt(dp);
    if (count_list) {
      PV list;
      list.kind = K::kList;
      for (size_t g = 0; g < groups.size(); ++g) list.items.push_back(PickleInt(dp));
      counts = Node(std::move(list));
    }
    FC_RETURN_IF_ERROR(AddOptimStates(job, std::move(out), rank0, Node(std::move(singles)),
                                      Node(std::move(paddings)), std::move(counts),
                                      Node(std::move(mappings)), ea, eas));
  }
  return Status::Ok();
}

// MoE with ZeRO 1/2 or BF16_Optimizer at one model-parallel rank, no pipeline (the layout
// fc's reader reads, fc/format/deepspeed.h): the dense groups are re-cut over the new DP size N; each expert
// group of ep_size E is re-cut, per expert-parallel rank e, over its new
// expert-data-parallel group of N / E ranks. E and ds_config's
// use_data_before_expert_parallelism stay (they are the model's and the config's), so rank
// R of the new job is expert-parallel rank R % E and expert-DP rank R / E (or R / (N/E) and
// R % (N/E)). The params of each (group, e) come from param_slice_mappings under their local
// expert names, which are the same at any DP size. The expert files and expp_rank_* files
// do not depend on the DP size: copied.
Status PlanMoeZero12(DsRepartition& job, Repartitioner& rp, const std::string& model_name,
                     const std::map<int64_t, std::string>& ranks, const std::string& prefix) {
  const int64_t dp = job.dp;
  FC_ASSIGN_OR_RETURN(SourceFile model, OpenSource(job.tag_dir, model_name));
  rp.AddFile(model);
  if (!model.root.is_dict()) return DataLossError(model.path + ": not a dict");
  FC_RETURN_IF_ERROR(AddModelStates(job, model_name, model));
  FC_RETURN_IF_ERROR(CheckNoRoundRobin(model));
  const int64_t ws = static_cast<int64_t>(ranks.size());
  if (ranks.rbegin()->first != ws - 1) {
    return NotFoundError(job.tag_dir + ": DP ranks are not 0.." + std::to_string(ws - 1) +
                         " (" + ranks.rbegin()->second + ")");
  }
  job.source_dp = ws;
  std::vector<SourceFile> files;
  bool bf16 = false;  // BF16_Optimizer: no zero_stage, fp32 partitions saved padded
  std::optional<bool> data_before_expert;
  std::vector<int64_t> counts;
  PV::Ptr fragment_cls;
  for (const auto& [r, name] : ranks) {
    FC_ASSIGN_OR_RETURN(SourceFile sf, OpenSource(job.tag_dir, name));
    rp.AddFile(sf);
    FC_RETURN_IF_ERROR(CheckNoRoundRobin(sf));
    const PV* osd = sf.root.Find("optimizer_state_dict");
    if (osd == nullptr || !osd->is_dict()) {
      return DataLossError(sf.path + ": no optimizer_state_dict dict");
    }
    if (osd->Find("fp32_flat_groups")) {
      return UnimplementedError(sf.path + ": MoE with ZeRO-3: not re-partitioned (MoE: ZeRO "
                                "stage 1/2 and BF16_Optimizer)");
    }
    const bool this_bf16 = osd->Find("zero_stage") == nullptr;
    if (r == 0) bf16 = this_bf16;
    if (this_bf16 != bf16) {
      return DataLossError(sf.path + ": zero_stage present in some DP ranks' files only");
    }
    const PV* base = osd->Find("base_optimizer_state");
    if (base == nullptr || !base->is_dict() || osd->Find("base_optimizer_state_step")) {
      return UnimplementedError(sf.path + ": elastic (or missing) base_optimizer_state: "
                                "not re-partitioned");
    }
    bool flag = false;
    const PV* cfg = sf.root.Find("ds_config");
    const PV* v = cfg && cfg->is_dict() ? cfg->Find("use_data_before_expert_parallelism") : nullptr;
    if (v != nullptr && !v->is_none()) {
      if (v->kind != K::kBool) {
        return DataLossError(sf.path + ": ds_config use_data_before_expert_parallelism is " +
                             v->DebugString(20) + ", expected a bool");
      }
      flag = v->bool_value;
    }
    if (data_before_expert && *data_before_expert != flag) {
      return DataLossError(sf.path + ": ds_config use_data_before_expert_parallelism differs "
                           "between the DP ranks' files");
    }
    data_before_expert = flag;
    const PV* pc = osd->Find("partition_count");
    std::vector<int64_t> c;
    if (pc != nullptr && (pc->is_list() || pc->is_tuple())) {
      for (const PV::Ptr& i : pc->items) {
        if (!i->is_int()) break;
        c.push_back(i->int_value);
      }
      if (c.size() != pc->items.size()) c.clear();
    }
    if (c.empty() || (r > 0 && c != counts)) {
      return DataLossError(sf.path + ": partition_count " +
                           (pc ? pc->DebugString(60) : std::string("missing")) +
                           (r > 0 ? " differs from DP rank 0's" : " is not a list of counts"));
    }
    counts = std::move(c);
    if (const PV* maps = osd->Find("param_slice_mappings"); maps && !fragment_cls) {
      for (const PV::Ptr& gm : maps->items) {
        for (const auto& [k, fv] : gm->entries) {
          if (fv->kind == K::kObject && fv->callee) fragment_cls = fv->callee;
        }
      }
    }
    files.push_back(std::move(sf));
  }
  if (!fragment_cls) fragment_cls = PickleGlobal("deepspeed.utils.tensor_fragment", "fragment_address");
  job.variant = bf16 ? "bf16_optimizer" : "zero";
  const size_t ngroups = counts.size();
  // Per group: E, the old and new partition counts, and per expert-parallel rank the group's
  // flat buffer.
  struct MoeGroup {
    int64_t ep = 1, old_count = 0, new_count = 0;
    std::vector<GroupSource> per_ep;
  };
  std::vector<MoeGroup> groups(ngroups);
  auto member = [&](int64_t e, int64_t j, int64_t count, int64_t ep) {
    return *data_before_expert ? e * count + j : e + j * ep;
  };
  for (size_t g = 0; g < ngroups; ++g) {
    const std::string gl = "group " + std::to_string(g);
    MoeGroup& mg = groups[g];
    mg.old_count = counts[g];
    if (mg.old_count <= 0 || ws % mg.old_count != 0) {
      return DataLossError(files[0].path + ": partition_count[" + std::to_string(g) + "] = " +
                           std::to_string(mg.old_count) + " does not divide the " +
                           std::to_string(ws) + " DP ranks");
    }
    mg.ep = ws / mg.old_count;
    if (dp % mg.ep != 0) {
      return InvalidArgumentError("--dp " + std::to_string(dp) + ": param " + gl + " is an "
                                  "expert group over " + std::to_string(mg.ep) +
                                  " expert-parallel ranks; the new DP size must be a multiple "
                                  "of " + std::to_string(mg.ep));
    }
    mg.new_count = dp / mg.ep;
    mg.per_ep.resize(static_cast<size_t>(mg.ep));
    for (int64_t e = 0; e < mg.ep; ++e) {
      GroupSource& gs = mg.per_ep[static_cast<size_t>(e)];
      // The params: param_slice_mappings of the partitions in order, back to back.
      const int64_t count = mg.old_count;
      std::vector<const SourceFile*> parts;
      for (int64_t j = 0; j < count; ++j) parts.push_back(&files[member(e, j, count, mg.ep)]);
      std::vector<int64_t> lean(parts.size());
      for (size_t j = 0; j < parts.size(); ++j) {
        const PV* single = parts[j]->root.Find("optimizer_state_dict")
                               ->Find("single_partition_of_fp32_groups");
        if (single == nullptr || !single->is_list() || single->items.size() != ngroups) {
          return DataLossError(parts[j]->path + ": single_partition_of_fp32_groups is not a "
                               "list of " + std::to_string(ngroups));
        }
        FC_ASSIGN_OR_RETURN(Located l, LocateTensor(*parts[j], single->items[g].get(),
                                                    "single_partition_of_fp32_groups[" +
                                                        std::to_string(g) + "]"));
        const PV* pads = parts[j]->root.Find("optimizer_state_dict")->Find("group_paddings");
        if (pads == nullptr || !pads->is_list() || pads->items.size() != ngroups ||
            !pads->items[g]->is_int() || pads->items[g]->int_value < 0 ||
            (bf16 && pads->items[g]->int_value > l.ref.shape[0])) {
          return DataLossError(parts[j]->path + ": group_paddings is not a list of " +
                               std::to_string(ngroups) + " paddings of its partitions");
        }
        // The real elements (BF16_Optimizer: the saved partition less its padding).
        lean[j] = l.ref.shape[0] - (bf16 ? pads->items[g]->int_value : 0);
      }
      int64_t ps_old = 0;
      {
        const PV* pads = parts[0]->root.Find("optimizer_state_dict")->Find("group_paddings");
        ps_old = lean[0] + pads->items[g]->int_value;
      }
      int64_t at = 0;
      std::map<std::string, size_t> seen;
      for (size_t j = 0; j < parts.size(); ++j) {
        const PV* maps = parts[j]->root.Find("optimizer_state_dict")->Find("param_slice_mappings");
        if (maps == nullptr || !maps->is_list() || maps->items.size() != ngroups) {
          return UnimplementedError(parts[j]->path + ": no param_slice_mappings for " +
                                    std::to_string(ngroups) + " groups (a MoE checkpoint has "
                                    "no param_shapes; they name the params)");
        }
        for (const auto& [k, fv] : maps->items[g]->entries) {
          const PV* st = fv->state.get();
          const PV* numel = st ? st->Find("numel") : nullptr;
          const PV* start = st ? st->Find("start") : nullptr;
          if (!k->is_str() || !numel || !numel->is_int() || !start || !start->is_int()) {
            return DataLossError(parts[j]->path + ": param_slice_mappings[" +
                                 std::to_string(g) + "] entry " + k->DebugString(40) +
                                 " is not name: fragment_address(numel, start)");
          }
          const int64_t pos = static_cast<int64_t>(j) * ps_old + start->int_value;
          if (pos != at || numel->int_value <= 0 || start->int_value + numel->int_value > lean[j]) {
            return DataLossError(parts[j]->path + ": param_slice_mappings[" +
                                 std::to_string(g) + "]: '" + k->str + "' at flat element " +
                                 std::to_string(pos) + " (" + std::to_string(numel->int_value) +
                                 " elements), expected the params back to back from " +
                                 std::to_string(at));
          }
          auto [it, fresh] = seen.try_emplace(k->str, gs.params.size());
          if (fresh) gs.params.emplace_back(k->str, 0);
          else if (it->second + 1 != gs.params.size()) {
            return DataLossError(parts[j]->path + ": param_slice_mappings[" +
                                 std::to_string(g) + "]: '" + k->str + "' is split around "
                                 "another param");
          }
          gs.params[it->second].second += numel->int_value;
          at += numel->int_value;
        }
      }
      gs.orig = at;
      if (PaddedLength(gs.orig, count) / count != ps_old) {
        return DataLossError(parts[0]->path + ": " + gl + " partitions of " +
                             std::to_string(ps_old) + " elements, but its params' " +
                             std::to_string(gs.orig) + " elements over " +
                             std::to_string(count) + " ranks give " +
                             std::to_string(PaddedLength(gs.orig, count) / count));
      }
      for (size_t j = 0; j < parts.size(); ++j) {
        const SourceFile& sf = *parts[j];
        const PV* osd = sf.root.Find("optimizer_state_dict");
        const int64_t want = LeanLength(gs.orig, ps_old, static_cast<int64_t>(j));
        const PV* pads = osd->Find("group_paddings");
        if (lean[j] != want || pads == nullptr || !pads->is_list() ||
            pads->items.size() != ngroups || !pads->items[g]->is_int() ||
            pads->items[g]->int_value != ps_old - want) {
          return DataLossError(sf.path + ": " + gl + " partition holds " +
                               std::to_string(lean[j]) + " elements; the padding rule gives " +
                               std::to_string(want) + " + " + std::to_string(ps_old - want) +
                               " padding");
        }
        const PV* single = osd->Find("single_partition_of_fp32_groups");
        const PV* state = osd->Find("base_optimizer_state")->Find("state");
        const PV* st = nullptr;
        if (state != nullptr && state->is_dict()) {
          for (const auto& [sk, sv] : state->entries) {
            if (sk->is_int() && sk->int_value == static_cast<int64_t>(g)) st = sv.get();
          }
        }
        if (st == nullptr || !st->is_dict()) {
          return DataLossError(sf.path + ": base_optimizer_state.state has no " + gl);
        }
        FC_RETURN_IF_ERROR(AddPartitionSources(
            rp, sf, *single->items[g], *st, g, ps_old, lean[j], bf16, j == 0,
            "rank" + std::to_string(member(e, static_cast<int64_t>(j), count, mg.ep)) +
                ".group" + std::to_string(g) + ".",
            &gs));
      }
    }
  }

  // The new DP ranks' files, from DP rank 0's tree.
  const SourceFile& rank0 = files.front();
  for (int64_t r = 0; r < dp; ++r) {
    const std::string name = prefix + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00" +
                             "_optim_states.pt";
    ArchiveBuilder out(JoinPath(job.tag, name));
    PV singles, paddings, mappings, partition_count;
    singles.kind = paddings.kind = mappings.kind = partition_count.kind = K::kList;
    std::vector<PV::Ptr> ea(ngroups), eas(ngroups);
    for (size_t g = 0; g < ngroups; ++g) {
      const MoeGroup& mg = groups[g];
      const int64_t count = mg.new_count;
      const int64_t e = *data_before_expert ? r / count : r % mg.ep;
      const int64_t j = *data_before_expert ? r % count : r / mg.ep;
      const GroupSource& gs = mg.per_ep[static_cast<size_t>(e)];
      const int64_t ps = PaddedLength(gs.orig, count) / count;
      const int64_t lean = LeanLength(gs.orig, ps, j);
      const std::string gl = "rank " + std::to_string(r) + " group " + std::to_string(g);
      auto part = [&](const std::vector<int64_t>& sources, DType dtype, const char* what) {
        return Repartitioner::PartitionOver(gs, sources, dtype, mg.old_count, count, j,
                                            gl + " " + what);
      };
      singles.items.push_back(out.NewTensor(part(gs.fp32, gs.dtype, "fp32"), bf16 ? ps : lean,
                                            gs.storage_class));
      ea[g] = out.NewTensor(part(gs.exp_avg, gs.state_dtype, "exp_avg"), ps,
                            gs.state_storage_class);
      eas[g] = out.NewTensor(part(gs.exp_avg_sq, gs.state_dtype, "exp_avg_sq"), ps,
                             gs.state_storage_class);
      paddings.items.push_back(PickleInt(ps - lean));
      mappings.items.push_back(SliceMappings(gs, ps, j, fragment_cls));
      partition_count.items.push_back(PickleInt(count));
    }
    FC_RETURN_IF_ERROR(AddOptimStates(job, std::move(out), rank0, Node(std::move(singles)),
                                      Node(std::move(paddings)), Node(std::move(partition_count)),
                                      Node(std::move(mappings)), ea, eas));
  }
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Planning.

Result<DsRepartition> PlanDeepSpeedRepartition(const std::string& input, int64_t dp) {
  if (dp < 1 || dp > (int64_t{1} << 20)) {
    return InvalidArgumentError("--dp " + std::to_string(dp) + ": the new data-parallel size "
                                "must be between 1 and 2^20");
  }
  DsRepartition job;
  job.dp = dp;
  std::string save_dir;
  FC_ASSIGN_OR_RETURN(job.tag_dir, ResolveTagDir(input, &save_dir));
  job.tag = Basename(StripTrailingSlashes(job.tag_dir));
  job.source.format = CheckpointFormat::kDeepSpeed;
  job.source.root = job.tag_dir;
  if (!IsDirectory(job.tag_dir)) return NotFoundError(job.tag_dir + ": no tag directory");
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(job.tag_dir));
  std::sort(names.begin(), names.end());

  std::map<int64_t, std::string> model_files;              // mp rank -> name
  std::map<int64_t, std::map<int64_t, std::string>> model3;  // ZeRO-3: mp -> dp -> name
  std::map<int64_t, std::map<int64_t, std::string>> optim;  // mp rank -> dp rank -> name
  // File name prefixes (bf16_, fp16_ or none) of the optimizer files and of ZeRO-3's per-rank
  // model states, apart: DeepSpeed 0.19 names a bf16 ZeRO-3 job's optimizer files
  // bf16_zero_pp_rank_* but its model states zero_pp_rank_* (_get_zero_ckpt_name and
  // _get_ckpt_name).
  std::set<std::string> prefixes, model_prefixes;
  std::vector<std::string> moe_files;
  for (const std::string& n : names) {
    const std::string path = JoinPath(job.tag_dir, n);
    if (IsDirectory(path)) {
      return UnimplementedError(path + ": a directory in the tag dir (NVMe-offloaded "
                                "optimizer state?) is not re-partitioned");
    }
    std::string prefix;
    int64_t r = 0, m = 0;
    if ((n.starts_with("layer_") && n.find("_expert_") != std::string::npos &&
         n.ends_with("_model_states.pt")) ||
        (n.starts_with("expp_rank_") && n.ends_with("_optim_states.pt"))) {
      moe_files.push_back(n);  // MoE: DP-independent, copied
      continue;
    }
    if (ParseRankName(n, "_optim_states.pt", &prefix, &r, &m)) {
      optim[m][r] = n;
      prefixes.insert(prefix);
    } else if (ParseRankName(n, "_model_states.pt", &prefix, &r, &m)) {
      model3[m][r] = n;
      model_prefixes.insert(prefix);
    } else if (int64_t mp = MpRankOf(n); mp >= 0) {
      model_files[mp] = n;
    } else if (n.starts_with("layer_") && n.ends_with("model_states.pt")) {
      job.copies.emplace_back(path, JoinPath(job.tag, n));
    } else {
      return UnimplementedError(path + ": a file --output-format deepspeed does not know "
                                "(not mp_rank_XX_model_states.pt, *zero_pp_rank_R_mp_rank_XX_"
                                "optim_states.pt or layer_*-model_states.pt)");
    }
  }
  if (!moe_files.empty() && !model3.empty()) {
    return UnimplementedError(job.tag_dir + ": MoE checkpoint (expert files) with ZeRO-3: not "
                              "re-partitioned (MoE: ZeRO 1/2 or BF16_Optimizer at one model-parallel rank)");
  }
  if (prefixes.size() > 1) {
    return DataLossError(job.tag_dir + ": optimizer files with different prefixes (" +
                         *prefixes.begin() + "zero_pp_rank_*, " + *prefixes.rbegin() +
                         "zero_pp_rank_*)");
  }
  if (model_prefixes.size() > 1) {
    return DataLossError(job.tag_dir + ": ZeRO-3 model-states files with different prefixes (" +
                         *model_prefixes.begin() + "zero_pp_rank_*, " +
                         *model_prefixes.rbegin() + "zero_pp_rank_*)");
  }
  if (!model3.empty()) {
    if (!model_files.empty()) {
      return DataLossError(job.tag_dir + ": both ZeRO-3 per-rank model states and " +
                           model_files.begin()->second);
    }
    FC_RETURN_IF_ERROR(PlanZero3(job, model3, optim, *model_prefixes.begin(),
                                 prefixes.empty() ? std::string() : *prefixes.begin()));
    AddZeroToFp32(job, save_dir);
    return job;
  }
  if (model_files.empty()) {
    return NotFoundError(job.tag_dir + ": no mp_rank_XX_model_states.pt");
  }
  job.mp = static_cast<int64_t>(model_files.size());
  if (model_files.rbegin()->first != job.mp - 1) {
    return NotFoundError(job.tag_dir + ": model-parallel ranks are not 0.." +
                         std::to_string(job.mp - 1) + " (" + model_files.rbegin()->second + ")");
  }
  for (const auto& [m, ranks] : optim) {
    if (!model_files.count(m)) {
      return NotFoundError(job.tag_dir + ": " + ranks.begin()->second + " has no " + MpName(m) +
                           "_model_states.pt");
    }
  }
  if (!optim.empty() && optim.size() != model_files.size()) {
    return NotFoundError(job.tag_dir + ": optimizer files for " + std::to_string(optim.size()) +
                         " of " + std::to_string(model_files.size()) + " model-parallel ranks");
  }
  const std::string prefix = prefixes.empty() ? "" : *prefixes.begin();
  job.variant = optim.empty() ? "none" : "zero";
  Repartitioner rp(job);
  if (!moe_files.empty()) {
    const bool layers = std::any_of(job.copies.begin(), job.copies.end(), [](const auto& c) {
      return Basename(c.first).starts_with("layer_");
    });
    if (job.mp != 1 || layers || optim.empty()) {
      return UnimplementedError(job.tag_dir + ": MoE checkpoint (expert files) with tensor or "
                                "pipeline parallelism, ZeRO-3 or no ZeRO optimizer files: not "
                                "re-partitioned (MoE: ZeRO 1/2 or BF16_Optimizer at one model-parallel rank)");
    }
    for (const std::string& n : moe_files) {
      job.copies.emplace_back(JoinPath(job.tag_dir, n), JoinPath(job.tag, n));
    }
    FC_RETURN_IF_ERROR(PlanMoeZero12(job, rp, model_files.begin()->second, optim.begin()->second,
                                     prefix));
    AddZeroToFp32(job, save_dir);
    return job;
  }

  for (const auto& [m, model_name] : model_files) {
    FC_RETURN_IF_ERROR(PlanZero12(job, rp, m, model_name, optim.empty() ? nullptr : &optim.at(m),
                                  prefix));
  }
  AddZeroToFp32(job, save_dir);
  return job;
}

}  // namespace fc
