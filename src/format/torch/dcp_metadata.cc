// Interpretation of a DCP `.metadata` pickle. Layout and contract:
// include/fc/format/torch_dcp.h.
//
// The pickle is parsed into a value tree first, then this file walks the tree. Nested
// classes are recognised by their class *name* and fields rather than by the full module
// path, because the paths moved between releases (1.13 `_shard.checkpoint`, 2.x
// `checkpoint`, TensorProperties moving ~2.3) and Megatron/resiliency writers reuse the
// same classes; only the root Metadata class decides the generation.
//
// Two trees, one walker: a 1M-chunk .metadata (170 MB, ~30M values) costs GBs and many
// seconds as PickleValue nodes, so it is first parsed by the compact machine
// (src/codec/compact_pickle.h: 8-byte values, flat arrays). The walker below is a template
// over the tree's accessors and runs on either. The general machine (fc/codec/pickle.h)
// stays the reference: whenever the compact machine or the walk over its tree fails, for
// whatever reason (a feature outside its subset, a malformed file, a structure error), the
// file is parsed again by the general machine and walked again, and that result, value or
// error, is the answer. So errors and their messages are exactly the general path's, and
// a compact success is a walk of the same values by the same code.
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "fc/format/torch_dcp.h"
#include "fc/format/torch_save.h"
#include "fc/io/process_memory.h"
#include "src/codec/compact_pickle.h"
#include "src/format/torch/dcp_metadata_parse.h"

namespace fc {
namespace {

using Kind = PickleValue::Kind;

constexpr std::string_view kModule113 = "torch.distributed._shard.checkpoint.metadata";
constexpr std::string_view kModule2 = "torch.distributed.checkpoint.metadata";

// The general tree. A value is a link (a pointer to the shared_ptr that holds it), so the
// parts kept as general values (planner_data) are shared, not copied; nullptr or a null
// link is "absent".
class GeneralTree {
 public:
  using V = const PickleValue::Ptr*;
  static constexpr bool kCompact = false;

  static bool absent(V v) { return v == nullptr || !*v; }
  static Kind kind(V v) { return (*v)->kind; }
  static std::string_view str(V v) { return (*v)->str; }
  static int64_t int_value(V v) { return (*v)->int_value; }
  static bool bool_value(V v) { return (*v)->bool_value; }
  // kCall/kObject with a kGlobal callee: that callee; else absent.
  static V CalleeGlobal(V v) {
    return (*v)->CalleeGlobal() != nullptr ? &(*v)->callee : nullptr;
  }
  static std::string_view module(V g) { return (*g)->str; }
  static std::string_view name(V g) { return (*g)->name; }
  static V args(V v) { return &(*v)->args; }
  static V state(V v) { return &(*v)->state; }
  // Tuples and lists: items. Dicts (and filled calls/objects): entries.
  static size_t item_count(V v) { return (*v)->items.size(); }
  static V item(V v, size_t i) { return &(*v)->items[i]; }
  template <typename F>
  static void ForEachItem(V v, F&& f) {
    for (const auto& i : (*v)->items) f(&i);
  }
  static size_t entry_count(V v) { return (*v)->entries.size(); }
  template <typename F>
  static Status ForEachEntry(V v, F&& f) {
    for (const auto& [k, val] : (*v)->entries) FC_RETURN_IF_ERROR(f(&k, &val));
    return Status::Ok();
  }
  static std::string Debug(V v) { return (*v)->DebugString(); }
  static Result<PickleValue::Ptr> Keep(V v) { return *v; }
};

// The compact tree. Messages built here are never shown (a failed compact walk is redone on
// the general tree), so Debug renders nothing.
class CompactTree {
 public:
  using V = CompactPickle::Ref;
  static constexpr bool kCompact = true;

  explicit CompactTree(const CompactPickle& p) : p_(p) {}
  static bool absent(V v) { return v.absent(); }
  Kind kind(V v) const { return p_.kind(v); }
  std::string_view str(V v) const { return p_.str(v); }
  int64_t int_value(V v) const { return p_.int_value(v); }
  bool bool_value(V v) const { return p_.bool_value(v); }
  V CalleeGlobal(V v) const { return p_.CalleeGlobal(v); }
  std::string_view module(V g) const { return p_.global_module(g); }
  std::string_view name(V g) const { return p_.global_name(g); }
  V args(V v) const { return p_.args(v); }
  V state(V v) const { return p_.state(v); }
  // A kind's items/entries as the general tree has them: tuples and lists hold items;
  // dicts, and calls/objects filled by SETITEM(S), entries.
  size_t item_count(V v) const { return p_.has_entries(v) ? 0 : p_.size(v); }
  V item(V v, size_t i) const {
    if (p_.kind(v) == Kind::kTuple) return p_.TupleItem(v, i);
    V out;
    size_t k = 0;
    p_.ForEachLink(v, [&](V link) {
      if (k++ == i) out = link;
    });
    return out;
  }
  template <typename F>
  void ForEachItem(V v, F&& f) const {
    if (!p_.has_entries(v)) p_.ForEachLink(v, f);
  }
  size_t entry_count(V v) const { return p_.has_entries(v) ? p_.size(v) / 2 : 0; }
  template <typename F>
  Status ForEachEntry(V v, F&& f) const {
    if (!p_.has_entries(v)) return Status::Ok();
    Status st = Status::Ok();
    V key;
    bool have_key = false;
    p_.ForEachLink(v, [&](V link) {
      if (!st.ok()) return;
      if (!have_key) {
        key = link;
        have_key = true;
        return;
      }
      have_key = false;
      st = f(key, link);
    });
    return st;
  }
  static std::string Debug(V) { return std::string(); }
  // Under the general decoder's tree budget for this input (PickleLimits defaults): a
  // value it would refuse is refused here too, and the walk falls back to it.
  Result<PickleValue::Ptr> Keep(V v) const {
    const PickleLimits limits;
    const uint64_t input = p_.input_size();
    const uint64_t budget = input * limits.max_tree_bytes_per_input_byte +
                            limits.max_tree_bytes_base;  // input < 4 GiB: no overflow
    return p_.ToPickleValue(v, budget);
  }

 private:
  const CompactPickle& p_;
};

// The memo lets a crafted file reuse one big value in many places (a 100k-entry dict as the
// state of 100k objects), so walking the tree can cost far more than the file's size. Every
// walk is charged here; an honest file costs about one unit per pickled value.
class Work {
 public:
  explicit Work(uint64_t input_bytes) : left_(4 * input_bytes + 4096) {}
  Status Charge(uint64_t units) {
    if (units > left_) {
      return DataLossError("the .metadata shares values so heavily that reading it would "
                           "cost more than its size allows");
    }
    left_ -= units;
    return Status::Ok();
  }

 private:
  uint64_t left_;
};

template <typename Tree>
class Walker {
 public:
  using V = typename Tree::V;
  // Attribute name -> its value.
  using Fields = std::vector<std::pair<std::string_view, V>>;

  Walker(const Tree& tree, uint64_t input_bytes) : t_(tree), work_(input_bytes) {}

  Result<DcpMetadata> Metadata(V root);

 private:
  std::string Debug(V v) const { return t_.absent(v) ? "missing" : t_.Debug(v); }
  bool IsKind(V v, Kind k) const { return !t_.absent(v) && t_.kind(v) == k; }

  // The attributes an object was BUILt with: a dict state, or the (dict | None, slots
  // dict) pair Python uses for classes with __slots__. Objects without BUILD have none.
  Status ObjectFields(V obj, std::string_view what, Fields* out);
  static V Field(const Fields& fields, std::string_view name) {
    for (const auto& [k, v] : fields) {
      if (k == name) return v;
    }
    return V{};
  }
  std::string_view ClassName(V obj) const {
    const V g = t_.CalleeGlobal(obj);
    return t_.absent(g) ? std::string_view() : t_.name(g);
  }
  Result<std::string> Str(V v, std::string_view what);
  Result<uint64_t> NonNegativeInt(V v, std::string_view what) const;
  Status SizeValue(V v, std::string_view what, Shape* out);
  std::string EnumMemberName(V v) const;
  Result<std::optional<std::string>> PathValue(V v) const;
  Status ParseTensorProperties(V v, DcpItemMetadata* item);
  Status ParseItem(std::string_view fqn, V v, DcpItemMetadata* item);
  Status ParseStorageEntry(V key, V value, DcpStorageInfo* s);

  const Tree& t_;
  Work work_;
  Fields key_fields_, value_fields_;  // ParseStorageEntry's, kept for their capacity
};

template <typename Tree>
Status Walker<Tree>::ObjectFields(V obj, std::string_view what, Fields* out) {
  out->clear();
  if (!IsKind(obj, Kind::kObject) && !IsKind(obj, Kind::kCall)) {
    return DataLossError(std::string(what) + " is not an object: " + Debug(obj));
  }
  const V state = t_.state(obj);
  if (t_.absent(state)) return Status::Ok();
  V dicts[2];
  size_t n_dicts = 0;
  if (t_.kind(state) == Kind::kDict) {
    dicts[n_dicts++] = state;
  } else if (t_.kind(state) == Kind::kTuple && t_.item_count(state) == 2) {
    for (size_t i = 0; i < 2; ++i) {
      const V part = t_.item(state, i);
      if (t_.kind(part) == Kind::kDict) {
        dicts[n_dicts++] = part;
      } else if (t_.kind(part) != Kind::kNone) {
        return DataLossError(std::string(what) + " has an unexpected state: " + Debug(obj));
      }
    }
  } else {
    return DataLossError(std::string(what) + " has an unexpected state: " + Debug(obj));
  }
  // Objects have a handful of attributes: a linear search beats a hash map (which cost
  // an allocation per object, millions per big .metadata); many attributes use the map.
  size_t total = 0;
  for (size_t i = 0; i < n_dicts; ++i) total += t_.entry_count(dicts[i]);
  out->reserve(total);
  std::unordered_map<std::string_view, size_t> position;
  const bool small = total <= 16;
  for (size_t d = 0; d < n_dicts; ++d) {
    FC_RETURN_IF_ERROR(work_.Charge(t_.entry_count(dicts[d])));
    FC_RETURN_IF_ERROR(t_.ForEachEntry(dicts[d], [&](V k, V v) -> Status {
      if (t_.kind(k) != Kind::kStr) {
        return DataLossError(std::string(what) + " has a non-string attribute name: " +
                             Debug(k));
      }
      const std::string_view key = t_.str(k);
      // Later entries win (a second BUILD, or a repeated key).
      size_t at = out->size();
      if (small) {
        for (size_t i = 0; i < out->size(); ++i) {
          if ((*out)[i].first == key) at = i;
        }
      } else {
        at = position.emplace(key, out->size()).first->second;
      }
      if (at == out->size()) {
        out->emplace_back(key, v);
      } else {
        (*out)[at].second = v;
      }
      return Status::Ok();
    }));
  }
  return Status::Ok();
}

// A string copied out of the tree. The memo lets one big string be referenced from every
// entry (a 1 MB .metadata naming one 500 KB relative_path 20,000 times would copy 10 GB),
// so the bytes copied are charged: one unit per 8 bytes.
template <typename Tree>
Result<std::string> Walker<Tree>::Str(V v, std::string_view what) {
  if (!IsKind(v, Kind::kStr)) {
    return DataLossError(std::string(what) + " is not a string: " + Debug(v));
  }
  FC_RETURN_IF_ERROR(work_.Charge(t_.str(v).size() / 8));
  return std::string(t_.str(v));
}

template <typename Tree>
Result<uint64_t> Walker<Tree>::NonNegativeInt(V v, std::string_view what) const {
  if (t_.absent(v)) return DataLossError(std::string(what) + " is missing");
  if (t_.kind(v) == Kind::kBigInt) {
    return DataLossError(std::string(what) + " is an integer beyond 64 bits");
  }
  if (t_.kind(v) != Kind::kInt || t_.int_value(v) < 0) {
    return DataLossError(std::string(what) + " is not an integer >= 0: " + Debug(v));
  }
  return static_cast<uint64_t>(t_.int_value(v));
}

// torch.Size((d0, d1, ...)) (or a plain tuple/list) -> Shape with entries >= 0.
template <typename Tree>
Status Walker<Tree>::SizeValue(V v, std::string_view what, Shape* out) {
  if (t_.absent(v)) return DataLossError(std::string(what) + " is missing");
  V tv = v;
  if (t_.kind(v) == Kind::kCall) {
    const V g = t_.CalleeGlobal(v);
    if (t_.absent(g) || t_.module(g) != "torch" || t_.name(g) != "Size" ||
        t_.item_count(t_.args(v)) != 1) {
      return DataLossError(std::string(what) + " is not a torch.Size: " + Debug(v));
    }
    tv = t_.item(t_.args(v), 0);
  }
  if (t_.kind(tv) != Kind::kTuple && t_.kind(tv) != Kind::kList) {
    return DataLossError(std::string(what) + " is not a torch.Size: " + Debug(v));
  }
  const size_t n = t_.item_count(tv);
  FC_RETURN_IF_ERROR(work_.Charge(n));
  out->clear();
  out->reserve(n);
  bool good = true;
  t_.ForEachItem(tv, [&](V d) {
    if (!good) return;
    if (t_.kind(d) != Kind::kInt || t_.int_value(d) < 0) {
      good = false;
      return;
    }
    out->push_back(t_.int_value(d));
  });
  if (!good) {
    return DataLossError(std::string(what) + " has an entry that is not an int >= 0: " +
                         Debug(v));
  }
  return Status::Ok();
}

// An enum member in either pickling form -> its name ("" when not recognisable).
template <typename Tree>
std::string Walker<Tree>::EnumMemberName(V v) const {
  static constexpr std::string_view kMemFormats[] = {
      "TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT"};
  if (!IsKind(v, Kind::kCall) || t_.absent(t_.args(v))) return "";
  const V g = t_.CalleeGlobal(v);
  if (t_.absent(g)) return "";
  const V a = t_.args(v);
  const size_t n = t_.item_count(a);
  if (t_.module(g) == "builtins" && t_.name(g) == "getattr" && n == 2 &&
      t_.kind(t_.item(a, 1)) == Kind::kStr) {
    return std::string(t_.str(t_.item(a, 1)));  // by name: getattr(EnumCls, 'NAME')
  }
  if (n == 1 && t_.kind(t_.item(a, 0)) == Kind::kInt &&
      t_.name(g).ends_with("MEM_FORMAT_ENCODING") && t_.int_value(t_.item(a, 0)) >= 0 &&
      t_.int_value(t_.item(a, 0)) < 3) {
    return std::string(kMemFormats[t_.int_value(t_.item(a, 0))]);  // by value: EnumCls(0)
  }
  return "";
}

// A pathlib path (either PosixPath pickling form) or a plain string. Other values are
// rendered with DebugString, which only the general tree does (an error on the compact one).
template <typename Tree>
Result<std::optional<std::string>> Walker<Tree>::PathValue(V v) const {
  if (t_.absent(v) || t_.kind(v) == Kind::kNone) return std::optional<std::string>();
  if (t_.kind(v) == Kind::kStr) return std::optional<std::string>(std::string(t_.str(v)));
  auto rendered = [&]() -> Result<std::optional<std::string>> {
    if constexpr (Tree::kCompact) {
      return UnimplementedError("compact walk: a path that needs DebugString");
    } else {
      return std::optional<std::string>(t_.Debug(v));
    }
  };
  const V g = t_.CalleeGlobal(v);
  if (t_.absent(g) || (t_.module(g) != "pathlib" && t_.module(g) != "pathlib._local") ||
      t_.absent(t_.args(v))) {
    return rendered();
  }
  // Python <= 3.12: the parts, ('/', 'ckpt', 'step_100'); 3.13: one full string.
  std::string out;
  bool good = true;
  t_.ForEachItem(t_.args(v), [&](V part) {
    if (!good) return;
    if (t_.kind(part) != Kind::kStr) {
      good = false;
      return;
    }
    if (!out.empty() && out.back() != '/') out += '/';
    out += t_.str(part);
  });
  if (!good) return rendered();
  return std::optional<std::string>(std::move(out));
}

template <typename Tree>
Status Walker<Tree>::ParseTensorProperties(V v, DcpItemMetadata* item) {
  if (t_.absent(v)) return DataLossError("properties are missing");
  if (t_.kind(v) != Kind::kObject || ClassName(v) != "TensorProperties") {
    return DataLossError("properties are not a TensorProperties: " + Debug(v));
  }
  V dtype{}, layout{}, requires_grad{}, memory_format{};
  const V state = t_.state(v);
  if (!t_.absent(state) && t_.kind(state) == Kind::kTuple) {
    // __getstate__: (dtype, layout, requires_grad, memory_format, pin_memory).
    const size_t n = t_.item_count(state);
    if (n < 1) return DataLossError("TensorProperties state is empty");
    dtype = t_.item(state, 0);
    if (n > 1) layout = t_.item(state, 1);
    if (n > 2) requires_grad = t_.item(state, 2);
    if (n > 3) memory_format = t_.item(state, 3);
  } else {
    Fields f;
    FC_RETURN_IF_ERROR(ObjectFields(v, "TensorProperties", &f));
    dtype = Field(f, "dtype");
    layout = Field(f, "layout");
    requires_grad = Field(f, "requires_grad");
    memory_format = Field(f, "memory_format");
  }
  if (!IsKind(dtype, Kind::kGlobal) || t_.module(dtype) != "torch") {
    return DataLossError("dtype is not a torch dtype: " + Debug(dtype));
  }
  FC_ASSIGN_OR_RETURN(item->dtype, TorchDTypeFromName(t_.name(dtype)));
  if (IsKind(layout, Kind::kCall) && !t_.absent(t_.args(layout)) &&
      t_.item_count(t_.args(layout)) == 1 &&
      t_.kind(t_.item(t_.args(layout), 0)) == Kind::kStr &&
      t_.str(t_.item(t_.args(layout), 0)) != "torch.strided") {
    return UnimplementedError("layout " + std::string(t_.str(t_.item(t_.args(layout), 0))) +
                              " is not supported");
  }
  item->requires_grad = IsKind(requires_grad, Kind::kBool) && t_.bool_value(requires_grad);
  item->memory_format = EnumMemberName(memory_format);
  return Status::Ok();
}

template <typename Tree>
Status Walker<Tree>::ParseItem(std::string_view fqn, V v, DcpItemMetadata* item) {
  item->fqn = std::string(fqn);
  const std::string_view cls = ClassName(v);
  if (!IsKind(v, Kind::kObject) ||
      (cls != "TensorStorageMetadata" && cls != "BytesStorageMetadata")) {
    return DataLossError("is neither TensorStorageMetadata nor BytesStorageMetadata: " +
                         Debug(v));
  }
  if (cls == "BytesStorageMetadata") return Status::Ok();
  item->is_tensor = true;
  Fields f;
  FC_RETURN_IF_ERROR(ObjectFields(v, "TensorStorageMetadata", &f));
  FC_RETURN_IF_ERROR(ParseTensorProperties(Field(f, "properties"), item));
  FC_RETURN_IF_ERROR(SizeValue(Field(f, "size"), "size", &item->size));
  const V chunks = Field(f, "chunks");
  if (!IsKind(chunks, Kind::kList)) {
    return DataLossError("chunks is not a list: " + Debug(chunks));
  }
  const size_t n = t_.item_count(chunks);
  FC_RETURN_IF_ERROR(work_.Charge(n));
  item->chunks.reserve(n);
  Status st = Status::Ok();
  size_t i = 0;
  Fields cf;
  t_.ForEachItem(chunks, [&](V c) {
    if (!st.ok()) return;
    // The context is built only for an error: millions of chunks, no string each.
    auto what = [i] { return "chunk " + std::to_string(i); };
    ++i;
    if (t_.kind(c) != Kind::kObject || ClassName(c) != "ChunkStorageMetadata") {
      st = DataLossError(what() + " is not a ChunkStorageMetadata: " + Debug(c));
      return;
    }
    if (Status s = ObjectFields(c, "ChunkStorageMetadata", &cf); !s.ok()) {
      st = s.With(what());
      return;
    }
    DcpChunkMetadata chunk;
    if (Status s = SizeValue(Field(cf, "offsets"), "offsets", &chunk.offsets); !s.ok()) {
      st = s.With(what());
      return;
    }
    if (Status s = SizeValue(Field(cf, "sizes"), "sizes", &chunk.sizes); !s.ok()) {
      st = s.With(what());
      return;
    }
    item->chunks.push_back(std::move(chunk));
  });
  return st;
}

template <typename Tree>
Status Walker<Tree>::ParseStorageEntry(V key, V value, DcpStorageInfo* s) {
  if (t_.kind(key) != Kind::kObject || ClassName(key) != "MetadataIndex") {
    return DataLossError("storage_data key is not a MetadataIndex: " + Debug(key));
  }
  Fields& kf = key_fields_;  // reused: one storage entry per chunk
  FC_RETURN_IF_ERROR(ObjectFields(key, "MetadataIndex", &kf));
  FC_ASSIGN_OR_RETURN(s->fqn, Str(Field(kf, "fqn"), "MetadataIndex fqn"));
  // Error contexts. The compact walk's messages are never shown, so it builds none (one
  // storage entry per chunk).
  const std::string ctx = Tree::kCompact ? std::string() : "storage_data['" + s->fqn + "']";
  auto with = [&ctx](const char* suffix) {
    return Tree::kCompact ? std::string() : ctx + suffix;
  };
  if (const V off = Field(kf, "offset"); !t_.absent(off) && t_.kind(off) != Kind::kNone) {
    Shape offsets;
    FC_RETURN_IF_ERROR(SizeValue(off, with(" offset"), &offsets));
    s->chunk_offsets = std::move(offsets);
  }
  if (const V idx = Field(kf, "index"); IsKind(idx, Kind::kInt)) {
    s->index = t_.int_value(idx);
  }
  if (t_.kind(value) != Kind::kObject || ClassName(value) != "_StorageInfo") {
    return DataLossError(ctx + " is not a _StorageInfo: " + Debug(value));
  }
  Fields& vf = value_fields_;
  FC_RETURN_IF_ERROR(ObjectFields(value, "_StorageInfo", &vf));
  FC_ASSIGN_OR_RETURN(s->relative_path,
                      Str(Field(vf, "relative_path"), with(" relative_path")));
  FC_ASSIGN_OR_RETURN(s->offset, NonNegativeInt(Field(vf, "offset"), with(" offset")));
  FC_ASSIGN_OR_RETURN(s->length, NonNegativeInt(Field(vf, "length"), with(" length")));
  if (const V td = Field(vf, "transform_descriptors");
      !t_.absent(td) && t_.kind(td) != Kind::kNone) {
    if (t_.kind(td) != Kind::kList && t_.kind(td) != Kind::kTuple) {
      return DataLossError(ctx + " transform_descriptors is not a list: " + Debug(td));
    }
    bool rendered = false;
    t_.ForEachItem(td, [&](V d) {
      if (t_.kind(d) == Kind::kStr) {
        s->transform_descriptors.emplace_back(t_.str(d));
      } else {
        rendered = true;
        s->transform_descriptors.push_back(Debug(d));
      }
    });
    if (rendered && Tree::kCompact) {
      return UnimplementedError("compact walk: a descriptor that needs DebugString");
    }
  }
  return Status::Ok();
}

template <typename Tree>
Result<DcpMetadata> Walker<Tree>::Metadata(V root) {
  const V cls = t_.CalleeGlobal(root);
  if (t_.kind(root) != Kind::kObject || t_.absent(cls)) {
    return DataLossError("the pickle does not hold a DCP Metadata object: " + Debug(root));
  }
  const std::string module(t_.module(cls)), cls_name(t_.name(cls));
  DcpMetadata md;
  if (cls_name == "Metadata" && module == kModule113) {
    md.generation = "1.13";
  } else if (cls_name == "Metadata" && module == kModule2) {
    md.generation = "2";
  } else if (module.starts_with("torch.")) {
    return DataLossError("unknown DCP metadata class " + module + "." + cls_name);
  } else {
    return UnimplementedError("not a PyTorch DCP .metadata: the root object is " + module +
                              "." + cls_name);
  }
  Fields fields;
  FC_RETURN_IF_ERROR(ObjectFields(root, "Metadata", &fields));
  const V sdm = Field(fields, "state_dict_metadata");
  if (!IsKind(sdm, Kind::kDict)) {
    return DataLossError("state_dict_metadata is not a dict: " + Debug(sdm));
  }
  std::unordered_set<std::string_view> fqns;
  md.items.reserve(t_.entry_count(sdm));
  FC_RETURN_IF_ERROR(t_.ForEachEntry(sdm, [&](V k, V v) -> Status {
    if (t_.kind(k) != Kind::kStr) {
      return DataLossError("state_dict_metadata key is not a string: " + Debug(k));
    }
    const std::string_view fqn = t_.str(k);
    if (!fqns.insert(fqn).second) {
      return DataLossError("state_dict_metadata lists '" + std::string(fqn) + "' twice");
    }
    DcpItemMetadata item;
    FC_RETURN_IF_ERROR_WITH(ParseItem(fqn, v, &item),
                            "state_dict_metadata['" + std::string(fqn) + "']");
    md.items.push_back(std::move(item));
    return Status::Ok();
  }));

  if (const V sd = Field(fields, "storage_data"); !t_.absent(sd) && t_.kind(sd) != Kind::kNone) {
    if (t_.kind(sd) != Kind::kDict) {
      return UnimplementedError("storage_data is not a FileSystemWriter mapping: " + Debug(sd));
    }
    md.storage.reserve(t_.entry_count(sd));
    FC_RETURN_IF_ERROR(t_.ForEachEntry(sd, [&](V k, V v) -> Status {
      DcpStorageInfo s;
      FC_RETURN_IF_ERROR(ParseStorageEntry(k, v, &s));
      md.storage.push_back(std::move(s));
      return Status::Ok();
    }));
  }

  if (const V p = Field(fields, "planner_data"); !t_.absent(p) && t_.kind(p) != Kind::kNone) {
    FC_ASSIGN_OR_RETURN(md.planner_data, t_.Keep(p));
  }
  for (const auto& [name, v] : fields) {
    if (name == "state_dict_metadata" || name == "storage_data" || name == "planner_data") {
      continue;
    }
    if (name == "version") {
      if (t_.kind(v) == Kind::kStr) md.version = std::string(t_.str(v));
    } else if (name == "storage_meta") {
      if (t_.kind(v) == Kind::kNone) continue;
      Fields sm;
      FC_RETURN_IF_ERROR(ObjectFields(v, "storage_meta", &sm));
      FC_ASSIGN_OR_RETURN(md.checkpoint_id, PathValue(Field(sm, "checkpoint_id")));
      if (const V id = Field(sm, "save_id"); IsKind(id, Kind::kStr)) {
        md.save_id = std::string(t_.str(id));
      }
    } else if (name == "mcore_data") {
      FC_ASSIGN_OR_RETURN(md.mcore_data, t_.Keep(v));
    } else {
      md.extra_fields.emplace_back(name);
    }
  }
  return md;
}

}  // namespace

Result<DcpMetadata> ParseDcpMetadataGeneral(std::span<const std::byte> bytes) {
  FC_ASSIGN_OR_RETURN(PickleValue root, ParsePickle(bytes));
  const auto root_link = std::make_shared<const PickleValue>(std::move(root));
  const PickleValue::Ptr link = root_link;
  GeneralTree tree;
  Walker<GeneralTree> walker(tree, bytes.size());
  return walker.Metadata(&link);
}

Result<DcpMetadata> ParseDcpMetadataCompact(std::span<const std::byte> bytes) {
  FC_ASSIGN_OR_RETURN(CompactPickle pickle, CompactPickle::Parse(bytes));
  CompactTree tree(pickle);
  Walker<CompactTree> walker(tree, bytes.size());
  return walker.Metadata(pickle.root());
}

Result<DcpMetadata> ParseDcpMetadata(std::span<const std::byte> bytes) {
  auto fast = ParseDcpMetadataCompact(bytes);
  if (fast.ok()) return fast;
  // The compact machine's blocks are free now, but an allocator may keep them resident
  // (jemalloc does, for seconds); the general decoder's own budget assumes they are gone.
  ReleaseFreeMemory();
  return ParseDcpMetadataGeneral(bytes);
}

}  // namespace fc
