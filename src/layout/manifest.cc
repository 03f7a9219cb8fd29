// The target-layout manifest: TargetLayout <-> JSON (schema in man/fc-layout.5).
#include <simdjson.h>

#include "fc/codec/json_writer.h"
#include "fc/layout/target_layout.h"
#include "src/codec/json_util.h"
#include "src/layout/json_read.h"

namespace fc {
namespace {

constexpr std::string_view kFormat = "fc-layout-manifest";
constexpr int64_t kVersion = 1;

void WriteInts(JsonWriter& w, std::span<const int64_t> values) {
  w.BeginArray(true);
  for (int64_t v : values) w.Int(v);
  w.EndArray();
}

using layout_internal::JsonContext;

Result<TargetTensor> ParseTensor(simdjson::dom::element e, const JsonContext& where) {
  FC_ASSIGN_OR_RETURN(simdjson::dom::object obj, where.Object(e));
  TargetTensor t;
  FC_ASSIGN_OR_RETURN(t.key, where.RequiredString(obj, "key"));
  FC_ASSIGN_OR_RETURN(t.global_shape, where.RequiredShape(obj, "global_shape"));
  simdjson::dom::element dtype;
  if (obj["dtype"].get(dtype) == simdjson::SUCCESS && !dtype.is_null()) {
    std::optional<std::string_view> name = json_internal::GetString(dtype);
    if (!name) return where.Error("'dtype' must be a string or null");
    Result<DType> parsed = ParseDType(*name);
    if (!parsed.ok()) return where.Error(parsed.status().message());
    t.dtype = *parsed;
  }
  return t;
}

Result<TargetChunk> ParseChunk(simdjson::dom::element e, const JsonContext& where) {
  FC_ASSIGN_OR_RETURN(simdjson::dom::object obj, where.Object(e));
  TargetChunk c;
  FC_ASSIGN_OR_RETURN(c.key, where.RequiredString(obj, "key"));
  FC_ASSIGN_OR_RETURN(c.box.global_offset, where.RequiredShape(obj, "global_offset"));
  FC_ASSIGN_OR_RETURN(c.box.local_shape, where.RequiredShape(obj, "local_shape"));
  simdjson::dom::element range;
  if (obj["flattened_range"].get(range) == simdjson::SUCCESS && !range.is_null()) {
    std::optional<Shape> r = json_internal::GetShape(range);
    if (!r || r->size() != 2 || (*r)[0] > (*r)[1]) {
      return where.Error("'flattened_range' must be null or [min, max] with 0 <= min <= max");
    }
    c.flat_range = FlatRange{(*r)[0], (*r)[1]};
  }
  FC_ASSIGN_OR_RETURN(std::optional<int64_t> replica, where.OptionalInt(obj, "replica_id"));
  c.replica_id = replica.value_or(0);
  return c;
}

}  // namespace

std::string ManifestJson(const TargetLayout& layout) {
  JsonWriter w(JsonWriter::Style::kPretty);
  w.BeginObject();
  w.Key("format").String(kFormat);
  w.Key("version").Int(kVersion);
  w.Key("tensors").BeginArray();
  for (const TargetTensor& t : layout.tensors) {
    w.BeginObject(true).Key("key").String(t.key);
    if (t.dtype) w.Key("dtype").String(DTypeName(*t.dtype));
    w.Key("global_shape");
    WriteInts(w, t.global_shape);
    w.EndObject();
  }
  w.EndArray();
  w.Key("ranks").BeginArray();
  for (const TargetRank& r : layout.ranks) {
    w.BeginObject().Key("rank").Int(r.rank).Key("chunks").BeginArray();
    for (const TargetChunk& c : r.chunks) {
      w.BeginObject(true).Key("key").String(c.key).Key("global_offset");
      WriteInts(w, c.box.global_offset);
      w.Key("local_shape");
      WriteInts(w, c.box.local_shape);
      w.Key("flattened_range");
      if (c.flat_range) {
        w.BeginArray(true).Int(c.flat_range->inclusive_min).Int(c.flat_range->exclusive_max);
        w.EndArray();
      } else {
        w.Null();
      }
      w.Key("replica_id").Int(c.replica_id);
      w.EndObject();
    }
    w.EndArray().EndObject();
  }
  w.EndArray();
  w.EndObject();
  std::string out = w.Take();
  out += '\n';
  return out;
}

Result<TargetLayout> ParseManifest(std::string_view json) {
  simdjson::dom::parser parser;
  const JsonContext root_ctx("manifest");
  FC_ASSIGN_OR_RETURN(simdjson::dom::element root, root_ctx.Parse(parser, json));
  FC_ASSIGN_OR_RETURN(simdjson::dom::object obj, root_ctx.Object(root));

  FC_ASSIGN_OR_RETURN(std::string format, root_ctx.RequiredString(obj, "format"));
  if (format != kFormat) {
    return root_ctx.Error("'format' is '" + format + "', expected '" + std::string(kFormat) +
                          "'");
  }
  FC_ASSIGN_OR_RETURN(std::optional<int64_t> version, root_ctx.OptionalInt(obj, "version"));
  if (!version) return root_ctx.Error("missing 'version'");
  if (*version > kVersion) {
    return UnimplementedError("manifest: version " + std::to_string(*version) +
                              " is newer than this fc supports (" + std::to_string(kVersion) +
                              ")");
  }
  if (*version != kVersion) {
    return root_ctx.Error("unknown 'version' " + std::to_string(*version));
  }

  TargetLayout layout;
  FC_ASSIGN_OR_RETURN(simdjson::dom::array tensors, root_ctx.RequiredArray(obj, "tensors"));
  size_t i = 0;
  for (simdjson::dom::element e : tensors) {
    FC_ASSIGN_OR_RETURN(TargetTensor t, ParseTensor(e, root_ctx.At("tensors", i++)));
    layout.tensors.push_back(std::move(t));
  }
  FC_ASSIGN_OR_RETURN(simdjson::dom::array ranks, root_ctx.RequiredArray(obj, "ranks"));
  i = 0;
  for (simdjson::dom::element e : ranks) {
    const JsonContext rank_ctx = root_ctx.At("ranks", i++);
    FC_ASSIGN_OR_RETURN(simdjson::dom::object robj, rank_ctx.Object(e));
    TargetRank rank;
    FC_ASSIGN_OR_RETURN(std::optional<int64_t> id, rank_ctx.OptionalInt(robj, "rank"));
    if (!id) return rank_ctx.Error("missing 'rank'");
    rank.rank = *id;
    FC_ASSIGN_OR_RETURN(simdjson::dom::array chunks, rank_ctx.RequiredArray(robj, "chunks"));
    size_t j = 0;
    for (simdjson::dom::element c : chunks) {
      FC_ASSIGN_OR_RETURN(TargetChunk chunk, ParseChunk(c, rank_ctx.At("chunks", j++)));
      rank.chunks.push_back(std::move(chunk));
    }
    layout.ranks.push_back(std::move(rank));
  }
  FC_RETURN_IF_ERROR_WITH(ValidateTargetLayout(layout), "manifest");
  return layout;
}

}  // namespace fc
