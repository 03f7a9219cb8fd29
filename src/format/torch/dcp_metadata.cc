// Interpretation of a DCP `.metadata` pickle. Layout and contract:
// include/fc/format/torch_dcp.h.
//
// The pickle is parsed generically first (fc/codec/pickle.h); this file walks the value
// tree. Nested classes are recognised by their class *name* and fields rather than by the
// full module path, because the paths moved between releases (1.13 `_shard.checkpoint`,
// 2.x `checkpoint`, TensorProperties moving ~2.3) and Megatron/resiliency writers reuse the
// same classes; only the root Metadata class decides the generation.
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "fc/format/torch_dcp.h"
#include "fc/format/torch_save.h"

namespace fc {
namespace {

using Kind = PickleValue::Kind;

constexpr std::string_view kModule113 = "torch.distributed._shard.checkpoint.metadata";
constexpr std::string_view kModule2 = "torch.distributed.checkpoint.metadata";

// Attribute name -> the link in the tree that holds its value. The links are borrowed from
// the (immutable) tree, so collecting millions of objects' fields costs no reference counts.
using Fields = std::vector<std::pair<std::string_view, const PickleValue::Ptr*>>;

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

// The attributes an object was BUILt with: a dict state, or the (dict | None, slots dict)
// pair Python uses for classes with __slots__. Objects without BUILD have no fields.
Result<Fields> ObjectFields(Work& work, const PickleValue& obj, std::string_view what) {
  Fields out;
  if (obj.kind != Kind::kObject && obj.kind != Kind::kCall) {
    return DataLossError(std::string(what) + " is not an object: " + obj.DebugString());
  }
  if (!obj.state) return out;
  std::vector<const PickleValue*> dicts;
  if (obj.state->kind == Kind::kDict) {
    dicts.push_back(obj.state.get());
  } else if (obj.state->kind == Kind::kTuple && obj.state->items.size() == 2) {
    for (const auto& part : obj.state->items) {
      if (part->kind == Kind::kDict) {
        dicts.push_back(part.get());
      } else if (part->kind != Kind::kNone) {
        return DataLossError(std::string(what) + " has an unexpected state: " +
                             obj.DebugString());
      }
    }
  } else {
    return DataLossError(std::string(what) + " has an unexpected state: " + obj.DebugString());
  }
  // Objects have a handful of attributes: a linear search beats a hash map (which cost
  // an allocation per object, millions per big .metadata); many attributes use the map.
  size_t total = 0;
  for (const PickleValue* d : dicts) total += d->entries.size();
  out.reserve(total);
  std::unordered_map<std::string_view, size_t> position;
  const bool small = total <= 16;
  for (const PickleValue* d : dicts) {
    FC_RETURN_IF_ERROR(work.Charge(d->entries.size()));
    for (const auto& [k, v] : d->entries) {
      if (k->kind != Kind::kStr) {
        return DataLossError(std::string(what) + " has a non-string attribute name: " +
                             k->DebugString());
      }
      // Later entries win (a second BUILD, or a repeated key).
      size_t at = out.size();
      if (small) {
        for (size_t i = 0; i < out.size(); ++i) {
          if (out[i].first == k->str) at = i;
        }
      } else {
        at = position.emplace(k->str, out.size()).first->second;
      }
      if (at == out.size()) {
        out.emplace_back(k->str, &v);
      } else {
        out[at].second = &v;
      }
    }
  }
  return out;
}

PickleValue::Ptr FieldPtr(const Fields& fields, std::string_view name) {
  for (const auto& [k, v] : fields) {
    if (k == name) return *v;
  }
  return nullptr;
}
const PickleValue* Field(const Fields& fields, std::string_view name) {
  for (const auto& [k, v] : fields) {
    if (k == name) return v->get();
  }
  return nullptr;
}

std::string_view ClassName(const PickleValue& obj) {
  const PickleValue* g = obj.CalleeGlobal();
  return g ? std::string_view(g->name) : std::string_view();
}

// A string copied out of the tree. The memo lets one big string be referenced from every
// entry (a 1 MB .metadata naming one 500 KB relative_path 20,000 times would copy 10 GB),
// so the bytes copied are charged: one unit per 8 bytes.
Result<std::string> Str(Work& work, const PickleValue* v, std::string_view what) {
  if (v == nullptr || v->kind != Kind::kStr) {
    return DataLossError(std::string(what) + " is not a string: " +
                         (v ? v->DebugString() : std::string("missing")));
  }
  FC_RETURN_IF_ERROR(work.Charge(v->str.size() / 8));
  return v->str;
}

Result<uint64_t> NonNegativeInt(const PickleValue* v, std::string_view what) {
  if (v == nullptr) return DataLossError(std::string(what) + " is missing");
  if (v->kind == Kind::kBigInt) {
    return DataLossError(std::string(what) + " is an integer beyond 64 bits");
  }
  if (v->kind != Kind::kInt || v->int_value < 0) {
    return DataLossError(std::string(what) + " is not an integer >= 0: " + v->DebugString());
  }
  return static_cast<uint64_t>(v->int_value);
}

// torch.Size((d0, d1, ...)) (or a plain tuple/list) -> Shape with entries >= 0.
Result<Shape> SizeValue(Work& work, const PickleValue* v, std::string_view what) {
  if (v == nullptr) return DataLossError(std::string(what) + " is missing");
  const PickleValue* t = v;
  if (v->kind == Kind::kCall) {
    const PickleValue* g = v->CalleeGlobal();
    if (g == nullptr || g->str != "torch" || g->name != "Size" || v->args->items.size() != 1) {
      return DataLossError(std::string(what) + " is not a torch.Size: " + v->DebugString());
    }
    t = v->args->items[0].get();
  }
  if (t->kind != Kind::kTuple && t->kind != Kind::kList) {
    return DataLossError(std::string(what) + " is not a torch.Size: " + v->DebugString());
  }
  FC_RETURN_IF_ERROR(work.Charge(t->items.size()));
  Shape out;
  out.reserve(t->items.size());
  for (const auto& d : t->items) {
    if (d->kind != Kind::kInt || d->int_value < 0) {
      return DataLossError(std::string(what) + " has an entry that is not an int >= 0: " +
                           v->DebugString());
    }
    out.push_back(d->int_value);
  }
  return out;
}

// An enum member in either pickling form -> its name ("" when not recognisable).
std::string EnumMemberName(const PickleValue* v) {
  static constexpr std::string_view kMemFormats[] = {
      "TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT"};
  if (v == nullptr || v->kind != Kind::kCall || !v->args) return "";
  const PickleValue* g = v->CalleeGlobal();
  if (g == nullptr) return "";
  const auto& a = v->args->items;
  if (g->str == "builtins" && g->name == "getattr" && a.size() == 2 &&
      a[1]->kind == Kind::kStr) {
    return a[1]->str;  // by name: getattr(EnumCls, 'NAME')
  }
  if (a.size() == 1 && a[0]->kind == Kind::kInt && g->name.ends_with("MEM_FORMAT_ENCODING") &&
      a[0]->int_value >= 0 && a[0]->int_value < 3) {
    return std::string(kMemFormats[a[0]->int_value]);  // by value: EnumCls(0)
  }
  return "";
}

// A pathlib path (either PosixPath pickling form) or a plain string.
std::optional<std::string> PathValue(const PickleValue* v) {
  if (v == nullptr || v->kind == Kind::kNone) return std::nullopt;
  if (v->kind == Kind::kStr) return v->str;
  const PickleValue* g = v->CalleeGlobal();
  if (g == nullptr || (g->str != "pathlib" && g->str != "pathlib._local") || !v->args) {
    return v->DebugString();
  }
  // Python <= 3.12: the parts, ('/', 'ckpt', 'step_100'); 3.13: one full string.
  std::string out;
  for (const auto& part : v->args->items) {
    if (part->kind != Kind::kStr) return v->DebugString();
    if (!out.empty() && out.back() != '/') out += '/';
    out += part->str;
  }
  return out;
}

Status ParseTensorProperties(Work& work, const PickleValue* v, DcpItemMetadata* item) {
  if (v == nullptr) return DataLossError("properties are missing");
  if (v->kind != Kind::kObject || ClassName(*v) != "TensorProperties") {
    return DataLossError("properties are not a TensorProperties: " + v->DebugString());
  }
  const PickleValue *dtype = nullptr, *layout = nullptr, *requires_grad = nullptr,
                    *memory_format = nullptr;
  if (v->state && v->state->kind == Kind::kTuple) {
    // __getstate__: (dtype, layout, requires_grad, memory_format, pin_memory).
    const auto& s = v->state->items;
    if (s.size() < 1) return DataLossError("TensorProperties state is empty");
    dtype = s[0].get();
    if (s.size() > 1) layout = s[1].get();
    if (s.size() > 2) requires_grad = s[2].get();
    if (s.size() > 3) memory_format = s[3].get();
  } else {
    FC_ASSIGN_OR_RETURN(Fields f, ObjectFields(work, *v, "TensorProperties"));
    dtype = Field(f, "dtype");
    layout = Field(f, "layout");
    requires_grad = Field(f, "requires_grad");
    memory_format = Field(f, "memory_format");
  }
  if (dtype == nullptr || dtype->kind != Kind::kGlobal || dtype->str != "torch") {
    return DataLossError("dtype is not a torch dtype: " +
                         (dtype ? dtype->DebugString() : std::string("missing")));
  }
  FC_ASSIGN_OR_RETURN(item->dtype, TorchDTypeFromName(dtype->name));
  if (layout != nullptr && layout->kind == Kind::kCall && layout->args &&
      layout->args->items.size() == 1 && layout->args->items[0]->kind == Kind::kStr &&
      layout->args->items[0]->str != "torch.strided") {
    return UnimplementedError("layout " + layout->args->items[0]->str + " is not supported");
  }
  item->requires_grad = requires_grad != nullptr && requires_grad->kind == Kind::kBool &&
                        requires_grad->bool_value;
  item->memory_format = EnumMemberName(memory_format);
  return Status::Ok();
}

Status ParseItem(Work& work, const std::string& fqn, const PickleValue& v,
                 DcpItemMetadata* item) {
  item->fqn = fqn;
  const std::string_view cls = ClassName(v);
  if (v.kind != Kind::kObject || (cls != "TensorStorageMetadata" && cls != "BytesStorageMetadata")) {
    return DataLossError("is neither TensorStorageMetadata nor BytesStorageMetadata: " +
                         v.DebugString());
  }
  if (cls == "BytesStorageMetadata") return Status::Ok();
  item->is_tensor = true;
  FC_ASSIGN_OR_RETURN(Fields f, ObjectFields(work, v, "TensorStorageMetadata"));
  FC_RETURN_IF_ERROR(ParseTensorProperties(work, Field(f, "properties"), item));
  FC_ASSIGN_OR_RETURN(item->size, SizeValue(work, Field(f, "size"), "size"));
  const PickleValue* chunks = Field(f, "chunks");
  if (chunks == nullptr || chunks->kind != Kind::kList) {
    return DataLossError("chunks is not a list: " +
                         (chunks ? chunks->DebugString() : std::string("missing")));
  }
  FC_RETURN_IF_ERROR(work.Charge(chunks->items.size()));
  item->chunks.reserve(chunks->items.size());
  for (size_t i = 0; i < chunks->items.size(); ++i) {
    const PickleValue& c = *chunks->items[i];
    // The context is built only for an error: millions of chunks, no string each.
    auto what = [i] { return "chunk " + std::to_string(i); };
    if (c.kind != Kind::kObject || ClassName(c) != "ChunkStorageMetadata") {
      return DataLossError(what() + " is not a ChunkStorageMetadata: " + c.DebugString());
    }
    auto cf = ObjectFields(work, c, "ChunkStorageMetadata");
    if (!cf.ok()) return cf.status().With(what());
    DcpChunkMetadata chunk;
    auto offsets = SizeValue(work, Field(*cf, "offsets"), "offsets");
    if (!offsets.ok()) return offsets.status().With(what());
    auto sizes = SizeValue(work, Field(*cf, "sizes"), "sizes");
    if (!sizes.ok()) return sizes.status().With(what());
    chunk.offsets = std::move(offsets).value();
    chunk.sizes = std::move(sizes).value();
    item->chunks.push_back(std::move(chunk));
  }
  return Status::Ok();
}

Status ParseStorageEntry(Work& work, const PickleValue& key, const PickleValue& value,
                         DcpStorageInfo* s) {
  if (key.kind != Kind::kObject || ClassName(key) != "MetadataIndex") {
    return DataLossError("storage_data key is not a MetadataIndex: " + key.DebugString());
  }
  FC_ASSIGN_OR_RETURN(Fields kf, ObjectFields(work, key, "MetadataIndex"));
  FC_ASSIGN_OR_RETURN(s->fqn, Str(work, Field(kf, "fqn"), "MetadataIndex fqn"));
  const std::string ctx = "storage_data['" + s->fqn + "']";
  if (const PickleValue* off = Field(kf, "offset"); off != nullptr && !off->is_none()) {
    FC_ASSIGN_OR_RETURN(s->chunk_offsets, SizeValue(work, off, ctx + " offset"));
  }
  if (const PickleValue* idx = Field(kf, "index"); idx != nullptr && idx->is_int()) {
    s->index = idx->int_value;
  }
  if (value.kind != Kind::kObject || ClassName(value) != "_StorageInfo") {
    return DataLossError(ctx + " is not a _StorageInfo: " + value.DebugString());
  }
  FC_ASSIGN_OR_RETURN(Fields vf, ObjectFields(work, value, "_StorageInfo"));
  FC_ASSIGN_OR_RETURN(s->relative_path, Str(work, Field(vf, "relative_path"), ctx + " relative_path"));
  FC_ASSIGN_OR_RETURN(s->offset, NonNegativeInt(Field(vf, "offset"), ctx + " offset"));
  FC_ASSIGN_OR_RETURN(s->length, NonNegativeInt(Field(vf, "length"), ctx + " length"));
  if (const PickleValue* td = Field(vf, "transform_descriptors"); td != nullptr && !td->is_none()) {
    if (td->kind != Kind::kList && td->kind != Kind::kTuple) {
      return DataLossError(ctx + " transform_descriptors is not a list: " + td->DebugString());
    }
    for (const auto& d : td->items) {
      s->transform_descriptors.push_back(d->kind == Kind::kStr ? d->str : d->DebugString());
    }
  }
  return Status::Ok();
}

}  // namespace

Result<DcpMetadata> ParseDcpMetadata(std::span<const std::byte> bytes) {
  FC_ASSIGN_OR_RETURN(PickleValue root, ParsePickle(bytes));
  const PickleValue* cls = root.CalleeGlobal();
  if (root.kind != Kind::kObject || cls == nullptr) {
    return DataLossError("the pickle does not hold a DCP Metadata object: " +
                         root.DebugString());
  }
  DcpMetadata md;
  if (cls->name == "Metadata" && cls->str == kModule113) {
    md.generation = "1.13";
  } else if (cls->name == "Metadata" && cls->str == kModule2) {
    md.generation = "2";
  } else if (cls->str.starts_with("torch.")) {
    return DataLossError("unknown DCP metadata class " + cls->str + "." + cls->name);
  } else {
    return UnimplementedError("not a PyTorch DCP .metadata: the root object is " + cls->str +
                              "." + cls->name);
  }
  Work work(bytes.size());
  FC_ASSIGN_OR_RETURN(Fields fields, ObjectFields(work, root, "Metadata"));
  const PickleValue* sdm = Field(fields, "state_dict_metadata");
  if (sdm == nullptr || sdm->kind != Kind::kDict) {
    return DataLossError("state_dict_metadata is not a dict: " +
                         (sdm ? sdm->DebugString() : std::string("missing")));
  }
  std::unordered_set<std::string> fqns;
  md.items.reserve(sdm->entries.size());
  for (const auto& [k, v] : sdm->entries) {
    if (k->kind != Kind::kStr) {
      return DataLossError("state_dict_metadata key is not a string: " + k->DebugString());
    }
    if (!fqns.insert(k->str).second) {
      return DataLossError("state_dict_metadata lists '" + k->str + "' twice");
    }
    DcpItemMetadata item;
    FC_RETURN_IF_ERROR_WITH(ParseItem(work, k->str, *v, &item),
                            "state_dict_metadata['" + k->str + "']");
    md.items.push_back(std::move(item));
  }

  if (const PickleValue* sd = Field(fields, "storage_data"); sd != nullptr && !sd->is_none()) {
    if (sd->kind != Kind::kDict) {
      return UnimplementedError("storage_data is not a FileSystemWriter mapping: " +
                                sd->DebugString());
    }
    md.storage.reserve(sd->entries.size());
    for (const auto& [k, v] : sd->entries) {
      DcpStorageInfo s;
      FC_RETURN_IF_ERROR(ParseStorageEntry(work, *k, *v, &s));
      md.storage.push_back(std::move(s));
    }
  }

  if (PickleValue::Ptr p = FieldPtr(fields, "planner_data"); p != nullptr && !p->is_none()) {
    md.planner_data = std::move(p);
  }
  for (const auto& [name, link] : fields) {
    const PickleValue::Ptr& v = *link;
    if (name == "state_dict_metadata" || name == "storage_data" || name == "planner_data") {
      continue;
    }
    if (name == "version") {
      if (v->is_str()) md.version = v->str;
    } else if (name == "storage_meta") {
      if (v->is_none()) continue;
      FC_ASSIGN_OR_RETURN(Fields sm, ObjectFields(work, *v, "storage_meta"));
      md.checkpoint_id = PathValue(Field(sm, "checkpoint_id"));
      if (const PickleValue* id = Field(sm, "save_id"); id != nullptr && id->is_str()) {
        md.save_id = id->str;
      }
    } else if (name == "mcore_data") {
      md.mcore_data = v;
    } else {
      md.extra_fields.emplace_back(name);
    }
  }
  return md;
}

}  // namespace fc
