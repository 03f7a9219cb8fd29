#include "fc/ops/convert.h"

#include <map>
#include <set>

#include <spdlog/spdlog.h>

#include "fc/comm/communicator.h"
#include "fc/core/checked_math.h"
#include "fc/core/flat_range.h"
#include "fc/exec/assemble.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/codec/json_writer.h"
#include "fc/format/open.h"
#include "fc/format/torch_dcp_writer.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"
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

// Everything RunConvert decides before writing a byte. Every process of a multi-process
// run builds the same plan from the same inputs. Not movable: targets point into `index`.
struct ConvertPlan {
  CheckpointIndex index;
  std::vector<OutputTensor> targets;
  FcDistcpPlan write_plan;                  // one data file per target rank, objects in file 0
  std::vector<const ObjectEntry*> objects;  // plan.files[0].objects[i] comes from objects[i]
  std::vector<ChunkTask> tasks;
  std::vector<RankPlan> rank_plans;         // per target rank (= per plan file)
  uint64_t peak_memory = 0;
  int threads = 1;
  ConvertSummary summary;
};

Status BuildPlan(const ConvertOptions& options, bool write_manifest, ConvertPlan& p) {
  FC_ASSIGN_OR_RETURN(p.index, OpenCheckpoint(options.input, options.format));
  const CheckpointIndex& index = p.index;
  std::string aoa_text;
  if (!options.aoa_file.empty()) {
    FC_ASSIGN_OR_RETURN(aoa_text, ReadTextFile(options.aoa_file));
  }
  FC_ASSIGN_OR_RETURN(TargetLayout layout, ResolveLayout(index, options, aoa_text));
  if (write_manifest && !options.emit_manifest.empty()) {
    FC_ASSIGN_OR_RETURN(auto file, WritableFile::Create(options.emit_manifest));
    FC_RETURN_IF_ERROR(file->Append(ManifestJson(layout)));
    FC_RETURN_IF_ERROR(file->Close());
  }
  if (options.aoa_file.empty()) {
    FC_ASSIGN_OR_RETURN(p.targets, IdentityTargets(index, layout));
  } else {
    FC_ASSIGN_OR_RETURN(p.targets, AoaConvertOutputs(index, aoa_text, options.aoa_file, layout));
  }
  std::map<std::string, const OutputTensor*> by_key;
  std::set<const TensorEntry*> sources;
  for (const OutputTensor& t : p.targets) {
    FC_RETURN_IF_ERROR(PiecesCover(t.name, t.pieces, Box::Whole(t.shape)));
    for (const SourcePiece& piece : t.pieces) {
      if (piece.source) sources.insert(piece.source);
    }
    by_key[t.name] = &t;
  }
  for (const TensorEntry* s : sources) FC_RETURN_IF_ERROR(CheckSourceCoverage(*s));

  // The write plan: one data file per target rank, objects with rank 0.
  FcDistcpPlan& plan = p.write_plan;
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
  for (const ObjectEntry& o : index.objects) {
    if (torch_out && o.encoding != ObjectEncoding::kTorchSave) {
      // torch DCP stores non-tensor values as torch.save items; raw bytes have no such form.
      if (write_manifest) {
        spdlog::warn("object '{}' is raw bytes, not a torch.save value: left out of the torch "
                     "DCP output", o.key);
      }
      continue;
    }
    p.objects.push_back(&o);
    plan.files.front().objects.push_back({o.key, o.encoding, o.byte_length});
  }

  // Tasks: every target chunk, cut into contiguous slabs under the memory budget.
  p.threads = WorkerThreads(options.threads);
  const uint64_t budget = options.memory_budget ? options.memory_budget : PhysicalMemoryBytes() / 4;
  const uint64_t per_worker = budget / static_cast<uint64_t>(p.threads) / 3;
  if (per_worker < 64) {
    return ResourceExhaustedError("--memory-budget " + std::to_string(budget) +
                                  " bytes is too small for " + std::to_string(p.threads) +
                                  " threads");
  }
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
      for (const SourcePiece& piece : target.pieces) {
        if (piece.source) widest = std::max(widest, DTypeSize(piece.source->dtype));
      }
      const int64_t max_elements = std::max<int64_t>(
          1, static_cast<int64_t>(std::min(per_worker, kMaxSlabBytes) / widest));
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
          p.tasks.push_back({f, c, &target, dtype, std::move(slab),
                             (element_offset + static_cast<uint64_t>(first)) * esize});
        }
        element_offset += static_cast<uint64_t>(stored.num_elements());
      }
      total_bytes += static_cast<uint64_t>(chunk.flat_range ? chunk.flat_range->size()
                                                             : chunk.box.num_elements()) * esize;
    }
    p.rank_plans.push_back(std::move(rp));
  }
  const size_t busy_workers = std::min<size_t>(p.threads, std::max<size_t>(p.tasks.size(), 1));
  p.peak_memory = largest_slab * 3 * static_cast<uint64_t>(busy_workers);
  p.summary.ranks = layout.ranks.size();
  for (const RankPlan& r : p.rank_plans) p.summary.chunks += r.chunks;
  p.summary.bytes_written = total_bytes;
  p.summary.objects = p.objects.size();
  return Status::Ok();
}

// Digests travel between processes as little-endian u64 words:
// count, then per file: file index, chunk count, chunk digests, object count, object digests.
std::string SerializeDigests(const std::vector<FcDistcpFileDigests>& digests) {
  std::vector<uint64_t> words{digests.size()};
  for (const FcDistcpFileDigests& d : digests) {
    words.push_back(d.file);
    words.push_back(d.chunk_xxh3.size());
    words.insert(words.end(), d.chunk_xxh3.begin(), d.chunk_xxh3.end());
    words.push_back(d.object_xxh3.size());
    words.insert(words.end(), d.object_xxh3.begin(), d.object_xxh3.end());
  }
  std::string bytes(words.size() * 8, '\0');
  for (size_t i = 0; i < words.size(); ++i) {
    for (int b = 0; b < 8; ++b) bytes[i * 8 + b] = static_cast<char>(words[i] >> (8 * b));
  }
  return bytes;
}

Status ParseDigests(const std::string& bytes, std::vector<FcDistcpFileDigests>& out) {
  if (bytes.empty()) return Status::Ok();  // a process that wrote no file
  if (bytes.size() % 8 != 0) {
    return InternalError("digest message of " + std::to_string(bytes.size()) + " bytes");
  }
  std::vector<uint64_t> words(bytes.size() / 8);
  for (size_t i = 0; i < words.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      words[i] |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i * 8 + b])) << (8 * b);
    }
  }
  size_t at = 0;
  auto next = [&](uint64_t& v) {
    if (at >= words.size()) return false;
    v = words[at++];
    return true;
  };
  auto list = [&](std::vector<uint64_t>& v) {
    uint64_t n = 0;
    if (!next(n) || n > words.size() - at) return false;
    const auto first = words.begin() + static_cast<std::ptrdiff_t>(at);
    v.assign(first, first + static_cast<std::ptrdiff_t>(n));
    at += n;
    return true;
  };
  uint64_t count = 0;
  next(count);
  for (uint64_t i = 0; i < count; ++i) {
    FcDistcpFileDigests d;
    uint64_t file = 0;
    if (!next(file) || !list(d.chunk_xxh3) || !list(d.object_xxh3)) {
      return InternalError("truncated digest message");
    }
    d.file = static_cast<size_t>(file);
    out.push_back(std::move(d));
  }
  if (at != words.size()) return InternalError("digest message has trailing words");
  return Status::Ok();
}

// One process's part of the output: its target files, written through the writer of the
// chosen format on a staging directory shared by all processes.
class OutputPart {
 public:
  static Result<std::unique_ptr<OutputPart>> Create(const ConvertOptions& options,
                                                    const ConvertPlan& p,
                                                    const std::string& staging,
                                                    std::vector<size_t> files,
                                                    const std::string& source_torch_generation) {
    auto part = std::unique_ptr<OutputPart>(new OutputPart());
    if (options.output_format == ConvertOutputFormat::kTorchDcp) {
      TorchDcpWriteOptions wo;
      std::string version = options.torch_version;
      if (version.empty()) version = source_torch_generation;
      if (version.empty()) version = "2";
      if (version == "1.13") {
        wo.generation = TorchGeneration::k1_13;
      } else if (version == "2") {
        wo.generation = TorchGeneration::k2;
      } else {
        return InvalidArgumentError("--torch-version '" + version + "': expected 1.13 or 2");
      }
      wo.files = std::move(files);
      wo.staging_dir = staging;
      FC_ASSIGN_OR_RETURN(part->torch_,
                          TorchDcpWriter::Create(options.output_dir, p.write_plan, wo));
    } else {
      FcDistcpWriterOptions wo;
      wo.files = std::move(files);
      wo.staging_dir = staging;
      FC_ASSIGN_OR_RETURN(part->fc_, FcDistcpWriter::Create(options.output_dir, p.write_plan, wo));
    }
    return part;
  }

  Status WriteChunk(size_t f, size_t c, uint64_t offset, std::span<const std::byte> b) {
    return torch_ ? torch_->WriteChunk(f, c, offset, b) : fc_->WriteChunk(f, c, offset, b);
  }
  Status WriteObject(size_t o, std::span<const std::byte> b) {
    return torch_ ? torch_->WriteObject(0, o, 0, b) : fc_->WriteObject(0, o, 0, b);
  }
  // Finishes this part's files; the digests (fc distcp) go to the committing process.
  Result<std::string> FinishDataFiles() {
    if (torch_) {
      FC_RETURN_IF_ERROR(torch_->FinishDataFiles());
      return std::string();
    }
    FC_ASSIGN_OR_RETURN(std::vector<FcDistcpFileDigests> digests, fc_->FinishDataFiles());
    return SerializeDigests(digests);
  }
  // Process 0 only, after every part finished: .metadata / fc.metadata.json and the rename.
  Status Commit(const ConvertOptions& options, const ConvertPlan& p, const std::string& staging,
                const std::vector<std::string>& messages) {
    if (torch_) return torch_->CommitMetadata();
    std::vector<FcDistcpFileDigests> digests;
    for (const std::string& m : messages) FC_RETURN_IF_ERROR(ParseDigests(m, digests));
    return CommitFcDistcpMetadata(options.output_dir, staging, p.write_plan, digests);
  }

 private:
  OutputPart() = default;
  std::unique_ptr<FcDistcpWriter> fc_;
  std::unique_ptr<TorchDcpWriter> torch_;
};

// This process's files: objects (with file 0) and the slab tasks, streamed under the budget.
Status WritePart(const ConvertOptions& options, const ConvertPlan& p,
                 const std::vector<size_t>& files, OutputPart& part) {
  std::vector<bool> mine(p.write_plan.files.size(), false);
  uint64_t my_bytes = 0;
  for (size_t f : files) {
    mine[f] = true;
    my_bytes += p.rank_plans[f].bytes_written;
  }
  ChunkReader reader(p.index);
  if (mine[0]) {
    for (size_t o = 0; o < p.objects.size(); ++o) {
      // Objects are copied byte for byte.
      const ObjectEntry& obj = *p.objects[o];
      FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, reader.File(obj.file));
      FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes,
                          f->ReadAt(obj.byte_offset, obj.byte_length));
      FC_RETURN_IF_ERROR(part.WriteObject(o, bytes));
    }
  }
  std::vector<size_t> tasks;
  for (size_t i = 0; i < p.tasks.size(); ++i) {
    if (mine[p.tasks[i].file]) tasks.push_back(i);
  }
  Progress progress("converting", my_bytes, options.progress);
  std::vector<std::vector<std::byte>> buffers(static_cast<size_t>(p.threads));  // per worker
  Status status = ParallelFor(tasks.size(), p.threads, [&](size_t i, int worker) -> Status {
    std::vector<std::byte>& buffer = buffers[static_cast<size_t>(worker)];
    const ChunkTask& task = p.tasks[tasks[i]];
    buffer.resize(static_cast<size_t>(task.region.num_elements()) * DTypeSize(task.dtype));
    FC_RETURN_IF_ERROR(AssembleRegion(reader, task.target->name, task.target->pieces,
                                      task.region, task.dtype, buffer.data()));
    FC_RETURN_IF_ERROR(part.WriteChunk(task.file, task.chunk, task.byte_offset, buffer));
    progress.Add(buffer.size());
    return Status::Ok();
  });
  progress.Finish(status.ok());
  return status;
}

}  // namespace

Result<ConvertSummary> RunConvert(const ConvertOptions& options, std::ostream& out) {
  Communicator* comm = options.comm ? options.comm : &SingleProcessCommunicator();
  const int me = comm->rank();
  // Every process plans (planning reads metadata only); the write plan and the file
  // assignment come out the same everywhere (slab sizes may differ with each machine's
  // threads and memory). Agreeing on the outcome keeps a process that failed alone (an
  // unreadable file) from leaving the others waiting.
  auto p = std::make_unique<ConvertPlan>();
  FC_RETURN_IF_ERROR(comm->AllOk(BuildPlan(options, me == 0, *p)));
  if (options.dry_run) {
    if (me == 0) PrintPlan(p->index, p->rank_plans, p->peak_memory, options, out);
    return p->summary;
  }
  // Target files shared out by bytes; process 0 always has one, so it can commit.
  std::vector<uint64_t> file_bytes;
  for (const RankPlan& r : p->rank_plans) file_bytes.push_back(r.bytes_written);
  const std::vector<std::vector<size_t>> assignment = BalanceByBytes(file_bytes, comm->size());

  // Process 0 claims OUT (lock, checks, a staging directory next to it: fc/io/output_dir.h),
  // everyone writes into the staging directory, process 0 commits it. Until then, and on
  // any failure, `output` removes the staging directory.
  std::unique_ptr<OutputDir> output;
  std::string staging;
  Status made = Status::Ok();
  if (me == 0) {
    auto opened = OutputDir::Open(options.output_dir, options.input);
    if (opened.ok()) {
      output = std::move(*opened);
      staging = output->staging();
    } else {
      made = opened.status();
    }
  }
  FC_RETURN_IF_ERROR(comm->AllOk(made));
  comm->Broadcast(staging, 0);

  const std::vector<size_t>& files = assignment[static_cast<size_t>(me)];
  std::unique_ptr<OutputPart> part;
  std::string digests;
  Status written = [&]() -> Status {
    if (files.empty()) return Status::Ok();  // more processes than target files
    auto generation = p->index.attributes.find("torch_generation");
    FC_ASSIGN_OR_RETURN(part, OutputPart::Create(options, *p, staging, files,
                                                 generation == p->index.attributes.end()
                                                     ? std::string()
                                                     : generation->second));
    FC_RETURN_IF_ERROR(WritePart(options, *p, files, *part));
    FC_ASSIGN_OR_RETURN(digests, part->FinishDataFiles());
    return Status::Ok();
  }();
  // A failed part removes its own files now, before process 0 removes the directory.
  if (!written.ok()) part.reset();
  FC_RETURN_IF_ERROR(comm->AllOk(written));
  const std::vector<std::string> messages = comm->Gather(digests, 0);
  Status committed = Status::Ok();
  if (me == 0) {
    committed = part ? part->Commit(options, *p, staging, messages)
                     : InternalError("process 0 was assigned no target file");
  }
  if (me == 0 && committed.ok()) output->MarkCommitted();  // the writer renamed it
  FC_RETURN_IF_ERROR(comm->AllOk(committed));
  return p->summary;
}

}  // namespace fc
