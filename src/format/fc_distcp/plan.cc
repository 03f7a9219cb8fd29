// fc distcp: names, plan validation, per-file layouts and the metadata JSON text. All pure:
// every rank of a multi-process write computes the same layouts from the same plan, so only
// checksums have to travel to the rank that commits.
#include <unordered_map>
#include <unordered_set>

#include "fc/core/checked_math.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/file_names.h"
#include "fc/codec/json_writer.h"
#include "src/format/fc_distcp/internal.h"

namespace fc {
namespace {

void AppendShape(JsonWriter& w, std::span<const int64_t> shape) {
  w.BeginArray(true);
  for (int64_t d : shape) w.Int(d);
  w.EndArray();
}

}  // namespace

namespace fcdistcp_internal {

bool IsWriterFileName(std::string_view name) {
  // "<rank>_<n>.distcp" written canonically (no leading zeros: one name per file).
  std::optional<NumberedName> m = MatchNumberedName(name, "#_#.distcp");
  return m && name == std::to_string((*m)[0]) + "_" + std::to_string((*m)[1]) + ".distcp";
}

std::string ChunkEntryName(std::string_view key, size_t chunk_index) {
  return std::string(key) + "@" + std::to_string(chunk_index);
}

std::string ObjectEntryName(std::string_view key) { return std::string(key) + "@obj"; }

std::string Hex64(uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[static_cast<size_t>(i)] = kDigits[v & 0xf];
    v >>= 4;
  }
  return s;
}

std::string ChunkText(const std::string& key, const Box& box,
                      const std::optional<FlatRange>& flat) {
  std::string s = "tensor '" + key + "' chunk " + box.ToString();
  if (flat) s += " flat " + flat->ToString();
  return s;
}

Result<std::string> MetadataJson(const FcDistcpPlan& plan,
                                 const std::vector<FcDistcpFileLayout>& layouts,
                                 std::span<const FcDistcpFileDigests> digests) {
  // Digest lookup by file, checked for completeness.
  std::vector<const FcDistcpFileDigests*> by_file(plan.files.size(), nullptr);
  for (const FcDistcpFileDigests& d : digests) {
    if (d.file >= plan.files.size()) {
      return InvalidArgumentError("checksums given for file index " + std::to_string(d.file) +
                                  ", but the plan has " + std::to_string(plan.files.size()) +
                                  " files");
    }
    const FcDistcpFileSpec& f = plan.files[d.file];
    if (by_file[d.file] != nullptr) {
      return InvalidArgumentError("checksums given twice for " + f.name);
    }
    if (d.chunk_xxh3.size() != f.chunks.size() || d.object_xxh3.size() != f.objects.size()) {
      return InvalidArgumentError("checksums for " + f.name + " cover " +
                                  std::to_string(d.chunk_xxh3.size()) + " chunks and " +
                                  std::to_string(d.object_xxh3.size()) +
                                  " objects; the plan has " + std::to_string(f.chunks.size()) +
                                  " and " + std::to_string(f.objects.size()));
    }
    by_file[d.file] = &d;
  }
  for (size_t i = 0; i < plan.files.size(); ++i) {
    if (by_file[i] == nullptr) {
      return InvalidArgumentError("no checksums for " + plan.files[i].name);
    }
  }

  // Tensor key -> (file, chunk-in-file), ordered by chunk index.
  std::unordered_map<std::string, size_t> tensor_of;
  for (size_t t = 0; t < plan.tensors.size(); ++t) tensor_of[plan.tensors[t].key] = t;
  std::vector<std::vector<std::pair<size_t, size_t>>> chunks_of(plan.tensors.size());
  for (size_t f = 0; f < plan.files.size(); ++f) {
    for (size_t c = 0; c < plan.files[f].chunks.size(); ++c) {
      auto& list = chunks_of[tensor_of.at(plan.files[f].chunks[c].key)];
      const size_t index = layouts[f].chunk_index[c];
      if (list.size() <= index) list.resize(index + 1);
      list[index] = {f, c};
    }
  }

  JsonWriter w(JsonWriter::Style::kPretty);
  w.BeginObject();
  w.Key("format").String(kFcDistcpFormatName);
  w.Key("version").Int(kFcDistcpVersion);
  w.Key("attributes").BeginObject();
  for (const auto& [k, v] : plan.attributes) w.Key(k).String(v);
  w.EndObject();
  w.Key("files").BeginArray();
  for (size_t f = 0; f < plan.files.size(); ++f) {
    w.BeginObject(true)
        .Key("name").String(plan.files[f].name)
        .Key("size").Uint(layouts[f].safetensors.file_size)
        .EndObject();
  }
  w.EndArray();
  w.Key("tensors").BeginArray();
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const FcDistcpTensorSpec& ts = plan.tensors[t];
    w.BeginObject();
    w.Key("key").String(ts.key);
    w.Key("dtype").String(DTypeName(ts.dtype));
    w.Key("global_shape");
    AppendShape(w, ts.global_shape);
    w.Key("chunks").BeginArray();
    for (const auto& [f, c] : chunks_of[t]) {
      const FcDistcpChunkSpec& cs = plan.files[f].chunks[c];
      w.BeginObject(true);
      w.Key("global_offset");
      AppendShape(w, cs.box.global_offset);
      w.Key("local_shape");
      AppendShape(w, cs.box.local_shape);
      w.Key("flattened_range");
      if (cs.flat_range) {
        w.BeginArray().Int(cs.flat_range->inclusive_min).Int(cs.flat_range->exclusive_max)
            .EndArray();
      } else {
        w.Null();
      }
      w.Key("replica_id").Int(cs.replica_id);
      w.Key("file").String(plan.files[f].name);
      w.Key("byte_offset").Uint(layouts[f].chunk_offset[c]);
      w.Key("byte_length").Uint(layouts[f].chunk_bytes[c]);
      w.Key("xxh3_64").String(Hex64(by_file[f]->chunk_xxh3[c]));
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.Key("objects").BeginArray();
  for (size_t f = 0; f < plan.files.size(); ++f) {
    for (size_t o = 0; o < plan.files[f].objects.size(); ++o) {
      const FcDistcpObjectSpec& os = plan.files[f].objects[o];
      w.BeginObject(true)
          .Key("key").String(os.key)
          .Key("encoding").String(ObjectEncodingName(os.encoding))
          .Key("file").String(plan.files[f].name)
          .Key("byte_offset").Uint(layouts[f].object_offset[o])
          .Key("byte_length").Uint(layouts[f].object_bytes[o])
          .Key("xxh3_64").String(Hex64(by_file[f]->object_xxh3[o]))
          .EndObject();
    }
  }
  w.EndArray();
  w.EndObject();
  return w.Take() + "\n";
}

}  // namespace fcdistcp_internal

using namespace fcdistcp_internal;

std::string FcDistcpFileName(int64_t rank, int64_t id) {
  return std::to_string(rank) + "_" + std::to_string(id) + ".distcp";
}

std::string_view ObjectEncodingName(ObjectEncoding encoding) {
  switch (encoding) {
    case ObjectEncoding::kRaw: return "raw";
    case ObjectEncoding::kTorchSave: return "torch_save";
  }
  return "raw";
}

Result<ObjectEncoding> ParseObjectEncoding(std::string_view name) {
  if (name == "raw") return ObjectEncoding::kRaw;
  if (name == "torch_save") return ObjectEncoding::kTorchSave;
  return DataLossError("unknown object encoding \"" + std::string(name) + "\"");
}

Status ValidateFcDistcpPlan(const FcDistcpPlan& plan) {
  std::unordered_map<std::string_view, const FcDistcpTensorSpec*> tensors;
  for (const FcDistcpTensorSpec& t : plan.tensors) {
    if (t.key.empty()) return InvalidArgumentError("fc distcp plan: empty tensor key");
    if (!IsValidUtf8(t.key)) {
      return InvalidArgumentError("fc distcp plan: tensor key " + JsonQuote(t.key) +
                                  " is not valid UTF-8");
    }
    if (!tensors.emplace(t.key, &t).second) {
      return InvalidArgumentError("fc distcp plan: tensor '" + t.key + "' listed twice");
    }
    Result<int64_t> n = CheckedNumElements(t.global_shape);
    if (!n.ok()) {
      return InvalidArgumentError("fc distcp plan: tensor '" + t.key +
                                  "': bad global shape: " + n.status().message());
    }
  }
  std::unordered_set<std::string_view> names, objects;
  for (const FcDistcpFileSpec& f : plan.files) {
    if (!IsWriterFileName(f.name)) {
      return InvalidArgumentError("fc distcp plan: file name \"" + f.name +
                                  "\" is not <rank>_<id>.distcp");
    }
    if (!names.insert(f.name).second) {
      return InvalidArgumentError("fc distcp plan: file " + f.name + " listed twice");
    }
    for (const FcDistcpChunkSpec& c : f.chunks) {
      auto it = tensors.find(c.key);
      if (it == tensors.end()) {
        return InvalidArgumentError("fc distcp plan: " + f.name + " has a chunk of tensor '" +
                                    c.key + "', which the plan does not list");
      }
      const FcDistcpTensorSpec& t = *it->second;
      // Built only for an error (a plan may hold millions of chunks).
      auto what = [&] {
        return "fc distcp plan: " + f.name + ": " + ChunkText(c.key, c.box, c.flat_range);
      };
      Status s = ValidateBox(c.box, t.global_shape);
      if (!s.ok()) return InvalidArgumentError(what() + ": " + s.message());
      if (c.flat_range && (!c.flat_range->SatisfiesInvariants() ||
                           c.flat_range->exclusive_max > c.box.num_elements())) {
        return InvalidArgumentError(what() + ": flattened range outside the box's " +
                                    std::to_string(c.box.num_elements()) + " elements");
      }
      if (c.replica_id < 0) {
        return InvalidArgumentError(what() + ": negative replica id " +
                                    std::to_string(c.replica_id));
      }
      const int64_t stored = c.flat_range ? c.flat_range->size() : c.box.num_elements();
      if (!CheckedMulU(static_cast<uint64_t>(stored), DTypeSize(t.dtype))) {
        return InvalidArgumentError(what() + ": byte size overflows");
      }
    }
    for (const FcDistcpObjectSpec& o : f.objects) {
      if (o.key.empty()) return InvalidArgumentError("fc distcp plan: empty object key");
      if (!IsValidUtf8(o.key)) {
        return InvalidArgumentError("fc distcp plan: object key " + JsonQuote(o.key) +
                                    " is not valid UTF-8");
      }
      if (!objects.insert(o.key).second) {
        return InvalidArgumentError("fc distcp plan: object '" + o.key + "' listed twice");
      }
      if (o.byte_length > static_cast<uint64_t>(INT64_MAX)) {
        return InvalidArgumentError("fc distcp plan: object '" + o.key + "' is too large");
      }
    }
  }
  return Status::Ok();
}

Result<std::vector<FcDistcpFileLayout>> ComputeFcDistcpLayouts(const FcDistcpPlan& plan) {
  FC_RETURN_IF_ERROR(ValidateFcDistcpPlan(plan));
  std::unordered_map<std::string_view, const FcDistcpTensorSpec*> tensors;
  for (const FcDistcpTensorSpec& t : plan.tensors) tensors[t.key] = &t;
  std::unordered_map<std::string_view, size_t> next_index;
  const SafetensorsMetadata metadata = DataFileMetadata();
  SafetensorsWriteOptions options = DataFileWriteOptions();

  std::vector<FcDistcpFileLayout> layouts;
  layouts.reserve(plan.files.size());
  for (const FcDistcpFileSpec& f : plan.files) {
    FcDistcpFileLayout fl;
    std::vector<SafetensorsTensorSpec> specs;
    for (const FcDistcpChunkSpec& c : f.chunks) {
      const FcDistcpTensorSpec& t = *tensors.at(c.key);
      const size_t index = next_index[c.key]++;
      fl.chunk_index.push_back(index);
      Shape shape = c.flat_range ? Shape{c.flat_range->size()} : c.box.local_shape;
      specs.push_back({ChunkEntryName(c.key, index), t.dtype, std::move(shape)});
    }
    for (const FcDistcpObjectSpec& o : f.objects) {
      specs.push_back({ObjectEntryName(o.key), DType::kUInt8,
                       Shape{static_cast<int64_t>(o.byte_length)}});
    }
    Result<SafetensorsLayout> st = ComputeSafetensorsLayout(specs, metadata, options);
    if (!st.ok()) return std::move(st).With(f.name).status();
    fl.safetensors = std::move(*st);
    for (size_t i = 0; i < f.chunks.size(); ++i) {
      fl.chunk_offset.push_back(fl.safetensors.tensor_offset[i]);
      fl.chunk_bytes.push_back(fl.safetensors.tensor_bytes[i]);
    }
    for (size_t i = 0; i < f.objects.size(); ++i) {
      fl.object_offset.push_back(fl.safetensors.tensor_offset[f.chunks.size() + i]);
      fl.object_bytes.push_back(fl.safetensors.tensor_bytes[f.chunks.size() + i]);
    }
    layouts.push_back(std::move(fl));
  }
  return layouts;
}

Result<std::string> FcDistcpMetadataJson(const FcDistcpPlan& plan,
                                         std::span<const FcDistcpFileDigests> digests) {
  FC_ASSIGN_OR_RETURN(std::vector<FcDistcpFileLayout> layouts, ComputeFcDistcpLayouts(plan));
  return MetadataJson(plan, layouts, digests);
}

}  // namespace fc
