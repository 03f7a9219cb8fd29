// AOA-driven output tensors: the engine's ShardMappings turned into SourcePieces.
#include <functional>
#include <variant>

#include "fc/codec/json_writer.h"
#include "fc/layout/target_layout.h"
#include "fc/ops/report_format.h"

#include "fc/aoa/engine.h"
#include "fc/aoa/program.h"
#include "fc/ops/targets.h"

namespace fc {

std::vector<aoa::TensorMeta> AoaSourceMeta(const CheckpointIndex& index) {
  std::vector<aoa::TensorMeta> metas;
  metas.reserve(index.tensors.size());
  for (const TensorEntry& t : index.tensors) {
    aoa::TensorMeta m{t.key, t.dtype, t.global_shape, {}};
    for (const Chunk& c : t.chunks) {
      if (c.replica_id == 0) m.chunks.push_back(c.box);
    }
    metas.push_back(std::move(m));
  }
  return metas;
}

Result<aoa::AoaEngine> MakeExportEngine(const CheckpointIndex& index, const std::string& aoa_text,
                                        const std::string& origin) {
  FC_ASSIGN_OR_RETURN(aoa::AoaProgram program, aoa::ParseAoaProgram(aoa_text, origin));
  const std::vector<aoa::TensorMeta> metas = AoaSourceMeta(index);
  return aoa::AoaEngine::Create(program, metas);
}

Result<OutputTensor> OutputFromEngine(
    const aoa::AoaEngine& engine, const aoa::OutputTensor& out,
    const std::function<const TensorEntry*(const std::string&)>& resolve) {
  OutputTensor target{out.key, out.dtype, out.shape, {}};
  FC_ASSIGN_OR_RETURN(std::vector<aoa::ShardMapping> mappings,
                      engine.FindShardSources(out.key, Box::Whole(out.shape)));
  for (const aoa::ShardMapping& m : mappings) {
    SourcePiece piece;
    piece.dst_box = m.target_box;
    if (m.kind == aoa::MappingKind::kFill) {
      piece.fill_value = m.fill_value;
      target.pieces.push_back(std::move(piece));
      continue;
    }
    piece.source = resolve(m.source_key);
    if (piece.source == nullptr) {
      return NotFoundError("output '" + out.key + "' needs source tensor '" + m.source_key +
                           "', which the checkpoint does not hold");
    }
    piece.src_box = m.source_box;
    for (const aoa::PostOp& op : m.ops) {
      PieceOp p;
      if (const auto* perm = std::get_if<aoa::Permute>(&op)) {
        p.kind = PieceOp::Kind::kPermute;
        p.permutation.assign(perm->perm.begin(), perm->perm.end());
      } else if (const auto* cast = std::get_if<aoa::Cast>(&op)) {
        p.kind = PieceOp::Kind::kCast;
        p.dtype = cast->dtype;
      } else {
        p.kind = PieceOp::Kind::kReshape;
        p.shape = std::get<aoa::Reshape>(op).shape;
      }
      piece.ops.push_back(std::move(p));
    }
    target.pieces.push_back(std::move(piece));
  }
  return target;
}

namespace {

Result<OutputTensor> IndexOutput(const CheckpointIndex& index, const aoa::AoaEngine& engine,
                                 const aoa::OutputTensor& out) {
  return OutputFromEngine(engine, out,
                          [&index](const std::string& key) { return index.FindTensor(key); });
}

}  // namespace

Result<std::vector<OutputTensor>> AoaOutputs(const CheckpointIndex& index,
                                             const std::string& aoa_text,
                                             const std::string& origin) {
  FC_ASSIGN_OR_RETURN(aoa::AoaEngine engine, MakeExportEngine(index, aoa_text, origin));
  std::vector<OutputTensor> outputs;
  for (const aoa::OutputTensor& out : engine.ListOutputs(/*with_states=*/true)) {
    if (!out.has_data) continue;
    FC_ASSIGN_OR_RETURN(OutputTensor target, IndexOutput(index, engine, out));
    outputs.push_back(std::move(target));
  }
  return outputs;
}

Result<std::vector<OutputTensor>> AoaConvertOutputs(const CheckpointIndex& index,
                                                    const std::string& aoa_text,
                                                    const std::string& origin,
                                                    const TargetLayout& layout) {
  FC_ASSIGN_OR_RETURN(aoa::AoaProgram program, aoa::ParseAoaProgram(aoa_text, origin));
  const std::vector<aoa::TensorMeta> sources = AoaSourceMeta(index);
  std::vector<aoa::TensorMeta> destination;
  for (const TargetTensor& t : layout.tensors) {
    aoa::TensorMeta m{t.key, t.dtype, t.global_shape, {}};
    for (const TargetRank& r : layout.ranks) {
      for (const TargetChunk& c : r.chunks) {
        if (c.key == t.key && c.replica_id == 0) m.chunks.push_back(c.box);
      }
    }
    destination.push_back(std::move(m));
  }
  FC_ASSIGN_OR_RETURN(aoa::AoaEngine engine,
                      aoa::AoaEngine::Create(program, sources,
                                             std::span<const aoa::TensorMeta>(destination)));
  std::vector<OutputTensor> outputs;
  for (const TargetTensor& t : layout.tensors) {
    FC_ASSIGN_OR_RETURN(aoa::OutputTensor out, engine.Output(t.key));
    if (!out.has_data) {
      // Declared with `_ -> key`: nothing maps to it; the target is written as zeros.
      SourcePiece zeros;
      zeros.dst_box = Box::Whole(t.global_shape);
      outputs.push_back({t.key, t.dtype.value_or(out.dtype), t.global_shape, {std::move(zeros)}});
      continue;
    }
    FC_ASSIGN_OR_RETURN(OutputTensor target, IndexOutput(index, engine, out));
    outputs.push_back(std::move(target));
  }
  return outputs;
}

Status WriteAoaPreview(const CheckpointIndex& index, const std::string& aoa_text,
                       const std::string& origin, bool json, std::ostream& out) {
  FC_ASSIGN_OR_RETURN(aoa::AoaEngine engine, MakeExportEngine(index, aoa_text, origin));
  const std::vector<std::string> expanded = engine.ExpandedStatements();
  const std::vector<aoa::OutputTensor> outputs = engine.ListOutputs(/*with_states=*/false);
  if (json) {
    JsonWriter j(JsonWriter::Style::kCompact);
    j.BeginObject();
    j.Key("aoa").String(origin);
    j.Key("expanded_statements").BeginArray();
    for (const std::string& s : expanded) j.String(s);
    j.EndArray();
    j.Key("outputs").BeginArray();
    for (const aoa::OutputTensor& o : outputs) {
      j.BeginObject().Key("name").String(o.key).Key("dtype").String(DTypeName(o.dtype));
      j.Key("shape").BeginArray(true);
      for (int64_t d : o.shape) j.Int(d);
      j.EndArray().Key("has_data").Bool(o.has_data).EndObject();
    }
    j.EndArray();
    j.Key("warnings").BeginArray();
    for (const std::string& w : engine.warnings()) j.String(w);
    j.EndArray();
    j.EndObject();
    out << j.str() << "\n";
    return Status::Ok();
  }
  out << "AOA program " << origin << ": " << expanded.size()
      << " statements after macro expansion\n";
  for (const std::string& s : expanded) out << "  " << s << "\n";
  out << "\noutput tensors (" << outputs.size() << "):\n";
  TextTable table({"NAME", "DTYPE", "SHAPE"});
  for (const aoa::OutputTensor& o : outputs) {
    std::string shape = "[";
    for (size_t i = 0; i < o.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(o.shape[i]);
    table.AddRow({o.key, std::string(DTypeName(o.dtype)), shape + "]" + (o.has_data ? "" : " (no data)")});
  }
  table.Print(out);
  for (const std::string& w : engine.warnings()) out << "warning: " << w << "\n";
  return Status::Ok();
}

}  // namespace fc
