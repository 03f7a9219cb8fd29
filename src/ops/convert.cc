#include "fc/ops/convert.h"

#include <map>
#include <set>

#include <spdlog/spdlog.h>

#include "fc/core/checked_math.h"
#include "fc/core/flat_range.h"
#include "fc/exec/assemble.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/json_writer.h"
#include "fc/format/open.h"
#include "fc/format/torch_dcp_writer.h"
#include "fc/io/file.h"
#include "fc/layout/layout_rules.h"
#include "fc/layout/target_layout.h"
#include "fc/ops/report_format.h"
#include "fc/ops/targets.h"

namespace fc {
namespace {

std::string ReadText(const std::vector<std::byte>& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

Result<std::string> ReadTextFile(const std::string& path) {
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(path, 256ull << 20));
  return ReadText(bytes);
}

// The tensors the target holds before any layout: the source's, or the AOA program's leaves.
Result<std::vector<TargetTensor>> LogicalTensors(const CheckpointIndex& index,
                                                 const ConvertOptions& options,
                                                 const std::string& aoa_text) {
  if (options.aoa_file.empty()) return TargetTensorsFromIndex(index);
  FC_ASSIGN_OR_RETURN(std::vector<OutputTensor> outputs,
                      AoaOutputs(index, aoa_text, options.aoa_file));
  std::vector<TargetTensor> tensors;
  for (const OutputTensor& o : outputs) tensors.push_back({o.name, o.dtype, o.shape});
  return tensors;
}

Result<TargetLayout> ResolveLayout(const CheckpointIndex& index, const ConvertOptions& options,
                                   const std::string& aoa_text) {
  const int given = !options.target_like.empty() + !options.target_layout_file.empty() +
                    !options.preset.empty() + !options.target_manifest.empty();
  if (given != 1) {
    return InvalidArgumentError(
        "give exactly one target: --target-like CKPT, --target-layout FILE.json, --preset "
        "NAME (with --tp/--pp/...), or --target-manifest FILE");
  }
  if (!options.target_like.empty()) {
    FC_ASSIGN_OR_RETURN(CheckpointIndex like, OpenCheckpoint(options.target_like));
    return LayoutFromIndex(like).With("--target-like " + options.target_like);
  }
  if (!options.target_manifest.empty()) {
    FC_ASSIGN_OR_RETURN(std::string text, ReadTextFile(options.target_manifest));
    return ParseManifest(text).With(options.target_manifest);
  }
  LayoutRules rules;
  if (!options.target_layout_file.empty()) {
    FC_ASSIGN_OR_RETURN(std::string text, ReadTextFile(options.target_layout_file));
    FC_ASSIGN_OR_RETURN(rules, ParseLayoutRules(text).With(options.target_layout_file));
  } else {
    FC_ASSIGN_OR_RETURN(rules, PresetRules(options.preset, options.degrees));
  }
  FC_ASSIGN_OR_RETURN(std::vector<TargetTensor> tensors, LogicalTensors(index, options, aoa_text));
  return LayoutFromRules(rules, tensors);
}

// Without a program, each target tensor is the source tensor of the same name.
Result<std::vector<OutputTensor>> IdentityTargets(const CheckpointIndex& index,
                                                  const TargetLayout& layout) {
  std::vector<OutputTensor> out;
  for (const TargetTensor& t : layout.tensors) {
    const TensorEntry* src = index.FindTensor(t.key);
    if (src == nullptr) {
      return NotFoundError("target tensor '" + t.key +
                           "' has no source: the checkpoint holds no tensor of that name "
                           "(map one to it with --aoa, or add it there with `_ -> " + t.key +
                           "`)");
    }
    if (src->global_shape != t.global_shape) {
      return InvalidArgumentError("target tensor '" + t.key + "' has shape " +
                                  Box::Whole(t.global_shape).ToString() + ", the source " +
                                  Box::Whole(src->global_shape).ToString() +
                                  " (reshape or pad it with --aoa)");
    }
    if (t.dtype && *t.dtype != src->dtype) {
      return InvalidArgumentError("target tensor '" + t.key + "' is " +
                                  std::string(DTypeName(*t.dtype)) + ", the source is " +
                                  std::string(DTypeName(src->dtype)) +
                                  ": a dtype change needs a cast (--aoa with `" + t.key +
                                  " -> " + t.key + ", dtype='" + std::string(DTypeName(*t.dtype)) +
                                  "'`)");
    }
    SourcePiece piece;
    piece.source = src;
    piece.src_box = Box::Whole(src->global_shape);
    piece.dst_box = piece.src_box;
    out.push_back({t.key, src->dtype, t.global_shape, {std::move(piece)}});
  }
  return out;
}

// The boxes (global coordinates, in stored order) whose elements a target chunk stores.
std::vector<Box> StoredBoxes(const TargetChunk& chunk) {
  if (!chunk.flat_range) return {chunk.box};
  std::vector<Box> boxes = DecomposeFlatRange(chunk.box.local_shape, *chunk.flat_range);
  for (Box& b : boxes) {
    for (size_t i = 0; i < b.rank(); ++i) b.global_offset[i] += chunk.box.global_offset[i];
  }
  return boxes;
}

struct ChunkTask {
  size_t file;
  size_t chunk;          // index within the file's chunk list
  const OutputTensor* target;
  DType dtype;
  Box region;            // contiguous in the chunk's stored order
  uint64_t byte_offset;  // within the chunk's stored bytes
};

struct RankPlan {
  int64_t rank = 0;
  uint64_t chunks = 0;
  uint64_t bytes_written = 0;
  std::map<uint32_t, uint64_t> bytes_read;  // source file -> bytes
};

void PrintPlan(const CheckpointIndex& index, const std::vector<RankPlan>& ranks,
               uint64_t peak_memory, const ConvertOptions& options, std::ostream& out) {
  uint64_t total_read = 0, total_written = 0;
  for (const RankPlan& r : ranks) {
    total_written += r.bytes_written;
    for (const auto& [f, b] : r.bytes_read) total_read += b;
  }
  if (options.json) {
    JsonWriter j(JsonWriter::Style::kCompact);
    j.BeginObject();
    j.Key("source").String(options.input);
    j.Key("ranks").BeginArray();
    for (const RankPlan& r : ranks) {
      uint64_t read = 0;
      for (const auto& [f, b] : r.bytes_read) read += b;
      j.BeginObject().Key("rank").Int(r.rank).Key("chunks").Uint(r.chunks);
      j.Key("bytes_written").Uint(r.bytes_written).Key("bytes_read").Uint(read);
      j.Key("files_read").BeginArray();
      for (const auto& [f, b] : r.bytes_read) {
        j.BeginObject(true).Key("file").String(index.files[f].path).Key("bytes").Uint(b).EndObject();
      }
      j.EndArray().EndObject();
    }
    j.EndArray();
    j.Key("bytes_read").Uint(total_read).Key("bytes_written").Uint(total_written);
    j.Key("estimated_peak_memory").Uint(peak_memory);
    j.EndObject();
    out << j.str() << "\n";
    return;
  }
  out << "plan: " << ranks.size() << " target rank(s), read " << HumanBytes(total_read)
      << ", write " << HumanBytes(total_written) << ", estimated peak memory "
      << HumanBytes(peak_memory) << "\n";
  TextTable table({"RANK", "CHUNKS", "WRITE", "READ", "SOURCE FILES"});
  for (const RankPlan& r : ranks) {
    uint64_t read = 0;
    std::string files;
    for (const auto& [f, b] : r.bytes_read) {
      read += b;
      files += (files.empty() ? "" : " ") + index.files[f].path;
    }
    table.AddRow({std::to_string(r.rank), std::to_string(r.chunks), HumanBytes(r.bytes_written),
                  HumanBytes(read), files});
  }
  table.Print(out);
}

}  // namespace

Result<ConvertSummary> RunConvert(const ConvertOptions& options, std::ostream& out) {
  FC_ASSIGN_OR_RETURN(CheckpointIndex index, OpenCheckpoint(options.input, options.format));
  std::string aoa_text;
  if (!options.aoa_file.empty()) {
    FC_ASSIGN_OR_RETURN(aoa_text, ReadTextFile(options.aoa_file));
  }
  FC_ASSIGN_OR_RETURN(TargetLayout layout, ResolveLayout(index, options, aoa_text));
  if (!options.emit_manifest.empty()) {
    FC_ASSIGN_OR_RETURN(auto file, WritableFile::Create(options.emit_manifest));
    FC_RETURN_IF_ERROR(file->Append(ManifestJson(layout)));
    FC_RETURN_IF_ERROR(file->Close());
  }
  std::vector<OutputTensor> targets;
  if (options.aoa_file.empty()) {
    FC_ASSIGN_OR_RETURN(targets, IdentityTargets(index, layout));
  } else {
    FC_ASSIGN_OR_RETURN(targets, AoaConvertOutputs(index, aoa_text, options.aoa_file, layout));
  }
  std::map<std::string, const OutputTensor*> by_key;
  std::set<const TensorEntry*> sources;
  for (const OutputTensor& t : targets) {
    FC_RETURN_IF_ERROR(PiecesCover(t.name, t.pieces, Box::Whole(t.shape)));
    for (const SourcePiece& p : t.pieces) {
      if (p.source) sources.insert(p.source);
    }
    by_key[t.name] = &t;
  }
  for (const TensorEntry* s : sources) FC_RETURN_IF_ERROR(CheckSourceCoverage(*s));

  // The write plan: one data file per target rank, objects with rank 0.
  FcDistcpPlan plan;
  std::map<std::string, DType> final_dtype;
  for (const TargetTensor& t : layout.tensors) {
    const OutputTensor& target = *by_key.at(t.key);
    final_dtype[t.key] = t.dtype.value_or(target.dtype);
    plan.tensors.push_back({t.key, final_dtype[t.key], t.global_shape});
  }
  const bool torch_out = options.output_format == ConvertOutputFormat::kTorchDcp;
  for (const TargetRank& r : layout.ranks) {
    FcDistcpFileSpec file;
    file.name = torch_out ? "__" + std::to_string(r.rank) + "_0.distcp" : FcDistcpFileName(r.rank, 0);
    for (const TargetChunk& c : r.chunks) {
      file.chunks.push_back({c.key, c.box, c.flat_range, c.replica_id});
    }
    plan.files.push_back(std::move(file));
  }
  if (plan.files.empty()) return InvalidArgumentError("the target layout has no ranks");
  std::vector<const ObjectEntry*> objects;
  for (const ObjectEntry& o : index.objects) {
    if (torch_out && o.encoding != ObjectEncoding::kTorchSave) {
      // torch DCP stores non-tensor values as torch.save items; raw bytes have no such form.
      spdlog::warn("object '{}' is raw bytes, not a torch.save value: left out of the torch "
                   "DCP output", o.key);
      continue;
    }
    objects.push_back(&o);
    plan.files.front().objects.push_back({o.key, o.encoding, o.byte_length});
  }

  // Tasks: every target chunk, cut into contiguous slabs under the memory budget.
  const int threads = WorkerThreads(options.threads);
  const uint64_t budget = options.memory_budget ? options.memory_budget : PhysicalMemoryBytes() / 4;
  const uint64_t per_worker = budget / static_cast<uint64_t>(threads) / 3;
  if (per_worker < 64) {
    return ResourceExhaustedError("--memory-budget " + std::to_string(budget) +
                                  " bytes is too small for " + std::to_string(threads) + " threads");
  }
  std::vector<ChunkTask> tasks;
  std::vector<RankPlan> rank_plans;
  uint64_t largest_slab = 0, total_bytes = 0;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    RankPlan rp;
    rp.rank = layout.ranks[f].rank;
    for (size_t c = 0; c < plan.files[f].chunks.size(); ++c) {
      const TargetChunk& chunk = layout.ranks[f].chunks[c];
      const OutputTensor& target = *by_key.at(chunk.key);
      const DType dtype = final_dtype.at(chunk.key);
      const size_t esize = DTypeSize(dtype);
      size_t widest = esize;
      for (const SourcePiece& p : target.pieces) {
        if (p.source) widest = std::max(widest, DTypeSize(p.source->dtype));
      }
      const int64_t max_elements = std::max<int64_t>(1, static_cast<int64_t>(per_worker / widest));
      uint64_t element_offset = 0;
      ++rp.chunks;
      for (const Box& stored : StoredBoxes(chunk)) {
        for (Box& slab : ContiguousSlabs(stored, max_elements)) {
          int64_t first = 0;
          if (slab.rank() > 0) {
            Shape rel(slab.rank());
            for (size_t i = 0; i < slab.rank(); ++i) rel[i] = slab.global_offset[i] - stored.global_offset[i];
            first = Ravel(rel, stored.local_shape);
          }
          const uint64_t bytes = static_cast<uint64_t>(slab.num_elements()) * esize;
          largest_slab = std::max(largest_slab, static_cast<uint64_t>(slab.num_elements()) * widest);
          rp.bytes_written += bytes;
          AccumulateRegionReads(target.pieces, slab, rp.bytes_read);
          tasks.push_back({f, c, &target, dtype, std::move(slab),
                           (element_offset + static_cast<uint64_t>(first)) * esize});
        }
        element_offset += static_cast<uint64_t>(stored.num_elements());
      }
      total_bytes += static_cast<uint64_t>(chunk.flat_range ? chunk.flat_range->size()
                                                             : chunk.box.num_elements()) * esize;
    }
    rank_plans.push_back(std::move(rp));
  }
  const uint64_t peak_memory = largest_slab * 3 * static_cast<uint64_t>(std::min<size_t>(threads, std::max<size_t>(tasks.size(), 1)));
  ConvertSummary summary;
  summary.ranks = layout.ranks.size();
  summary.chunks = 0;
  for (const RankPlan& r : rank_plans) summary.chunks += r.chunks;
  summary.bytes_written = total_bytes;
  summary.objects = objects.size();
  if (options.dry_run) {
    PrintPlan(index, rank_plans, peak_memory, options, out);
    return summary;
  }
  // The two writers share one shape: chunk and object bytes by (file, entry, offset).
  std::unique_ptr<FcDistcpWriter> fc_writer;
  std::unique_ptr<TorchDcpWriter> torch_writer;
  if (torch_out) {
    TorchDcpWriteOptions wo;
    std::string version = options.torch_version;
    if (version.empty()) {
      auto it = index.attributes.find("torch_generation");
      version = it != index.attributes.end() ? it->second : "2";
    }
    if (version == "1.13") {
      wo.generation = TorchGeneration::k1_13;
    } else if (version == "2") {
      wo.generation = TorchGeneration::k2;
    } else {
      return InvalidArgumentError("--torch-version '" + version + "': expected 1.13 or 2");
    }
    FC_ASSIGN_OR_RETURN(torch_writer, TorchDcpWriter::Create(options.output_dir, plan, wo));
  } else {
    FC_ASSIGN_OR_RETURN(fc_writer, FcDistcpWriter::Create(options.output_dir, plan));
  }
  auto write_chunk = [&](size_t f, size_t c, uint64_t offset, std::span<const std::byte> b) {
    return torch_writer ? torch_writer->WriteChunk(f, c, offset, b) : fc_writer->WriteChunk(f, c, offset, b);
  };
  ChunkReader reader(index);
  for (size_t o = 0; o < objects.size(); ++o) {
    // Objects are copied byte for byte.
    const ObjectEntry& obj = *objects[o];
    FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, reader.File(obj.file));
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, f->ReadAt(obj.byte_offset, obj.byte_length));
    FC_RETURN_IF_ERROR(torch_writer ? torch_writer->WriteObject(0, o, 0, bytes)
                                    : fc_writer->WriteObject(0, o, 0, bytes));
  }
  Progress progress("converting", total_bytes, options.progress);
  std::vector<std::vector<std::byte>> buffers(static_cast<size_t>(threads));  // per worker
  Status status = ParallelFor(tasks.size(), threads, [&](size_t i, int worker) -> Status {
    std::vector<std::byte>& buffer = buffers[static_cast<size_t>(worker)];
    const ChunkTask& task = tasks[i];
    buffer.resize(static_cast<size_t>(task.region.num_elements()) * DTypeSize(task.dtype));
    FC_RETURN_IF_ERROR(AssembleRegion(reader, task.target->name, task.target->pieces,
                                      task.region, task.dtype, buffer.data()));
    FC_RETURN_IF_ERROR(write_chunk(task.file, task.chunk, task.byte_offset, buffer));
    progress.Add(buffer.size());
    return Status::Ok();
  });
  if (status.ok()) status = torch_writer ? torch_writer->Finish() : fc_writer->Finish();
  progress.Finish(status.ok());
  if (!status.ok()) {
    if (torch_writer) torch_writer->Abort();
    if (fc_writer) fc_writer->Abort();
    return status;
  }
  return summary;
}

}  // namespace fc
