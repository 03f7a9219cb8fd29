#include "fc/ops/convert.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <unordered_map>
#include <set>

#include <spdlog/spdlog.h>

#include "fc/comm/communicator.h"
#include "fc/core/checked_math.h"
#include "fc/core/flat_range.h"
#include "fc/core/heap_bytes.h"
#include "fc/core/glob.h"
#include "fc/exec/assemble.h"
#include "fc/exec/execute.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/codec/json_writer.h"
#include "fc/format/open.h"
#include "fc/format/output_format.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"
#include "fc/layout/layout_rules.h"
#include "fc/layout/target_layout.h"
#include "fc/ops/export.h"
#include "fc/ops/hf_family.h"
#include "fc/ops/report_format.h"
#include "fc/ops/run_stats.h"
#include "src/ops/claim_output.h"
#include "src/ops/convert_deepspeed.h"
#include "src/ops/convert_job.h"
#include "src/ops/job.h"
#include "src/ops/job_memory.h"
#include "src/ops/convert_ucp.h"
#include "src/ops/plan_report.h"
#include "src/ops/time_estimate.h"
#include "src/ops/shared_input.h"
#include "fc/plan/plan.h"
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

// Where the AOA program comes from, as errors name it: the --aoa file, "--hf-family NAME"
// (the generated program), or empty for none.
std::string AoaOrigin(const ConvertOptions& options) {
  if (!options.aoa_file.empty()) return options.aoa_file;
  if (!options.hf_family.empty()) return "--hf-family " + options.hf_family;
  if (!options.from_hf_family.empty()) return "--from-hf-family " + options.from_hf_family;
  return "";
}

// The tensors the target holds before any layout: the source's, or the AOA program's leaves.
Result<std::vector<TargetTensor>> LogicalTensors(const CheckpointIndex& index,
                                                 const ConvertOptions& options,
                                                 const std::string& aoa_text) {
  if (AoaOrigin(options).empty()) return TargetTensorsFromIndex(index);
  FC_ASSIGN_OR_RETURN(std::vector<OutputTensor> outputs,
                      AoaOutputs(index, aoa_text, AoaOrigin(options)));
  std::vector<TargetTensor> tensors;
  for (const OutputTensor& o : outputs) tensors.push_back({o.name, o.dtype, o.shape});
  return tensors;
}

// `like_manifest`: the --target-like layout as process 0 read it (a manifest, ManifestJson),
// when it was shared (ShareTargetLike); null: read it here.
Result<TargetLayout> ResolveLayout(const CheckpointIndex& index, const ConvertOptions& options,
                                   const std::string& aoa_text,
                                   const std::string* like_manifest) {
  const int given = !options.target_like.empty() + !options.target_layout_file.empty() +
                    !options.preset.empty() + !options.target_manifest.empty();
  if (given != 1) {
    return InvalidArgumentError(
        "give exactly one target: --target-like CKPT, --target-layout FILE.json, --preset "
        "NAME (with --tp/--pp/...), or --target-manifest FILE");
  }
  if (!options.target_like.empty()) {
    if (StripTrailingSlashes(options.target_like) == StripTrailingSlashes(options.input)) {
      // Resharding in place of the same layout (a rewrite, a format change): the source's
      // metadata is already parsed; parsing it again doubles the planning time.
      return LayoutFromIndex(index).With("--target-like " + options.target_like);
    }
    if (like_manifest != nullptr) {
      return ParseManifest(*like_manifest).With("--target-like " + options.target_like);
    }
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
  const std::string which = options.preset.empty()
                                ? "--target-layout " + options.target_layout_file
                                : "--preset " + options.preset;
  FC_ASSIGN_OR_RETURN(TargetLayout layout, LayoutFromRules(rules, tensors).With(which));
  // Rules for another model, or degrees that leave a rank without data, are refused rather
  // than written as a checkpoint of replicas and empty files.
  FC_RETURN_IF_ERROR(CheckRulesFit(rules, tensors, layout).With(which));
  return layout;
}

// --include / --exclude on the target: the layout without the tensors left out (and their
// chunks). Ranks keep their numbers, even when they end up holding no chunk.
TargetLayout FilterLayout(TargetLayout layout, const NameFilter& filter) {
  // In place: a layout may hold millions of chunks, each with its key and box.
  std::erase_if(layout.tensors, [&](const TargetTensor& t) { return !filter.Passes(t.key); });
  for (TargetRank& r : layout.ranks) {
    std::erase_if(r.chunks, [&](const TargetChunk& c) { return !filter.Passes(c.key); });
  }
  return layout;
}

// Warns (unless --quiet) about source tensors the output does not carry: no target tensor
// reads them (the target layout lacks them, or the AOA program drops them). Tensors left
// out with --include/--exclude are the user's choice and not listed.
uint64_t WarnNotCarried(const CheckpointIndex& index, const std::vector<OutputTensor>& targets,
                        const NameFilter& filter, bool report) {
  std::set<const TensorEntry*> read;
  for (const OutputTensor& t : targets) {
    for (const SourcePiece& piece : t.pieces) read.insert(piece.source);
  }
  std::vector<std::string> dropped;
  for (const TensorEntry& t : index.tensors) {
    if (!read.count(&t) && filter.Passes(t.key)) dropped.push_back(t.key);
  }
  if (report && !dropped.empty()) {
    spdlog::warn("{} source tensor(s) are not in the output (no target tensor reads them): {}",
                 dropped.size(), FirstNames(dropped));
  }
  if (auto b = index.attributes.find("deepspeed.tp_buffers_per_rank");
      report && b != index.attributes.end()) {
    // As fc-export says it: no one tensor stands for these module buffers.
    spdlog::warn("{}: module buffer(s) whose TP copies differ, written per rank as "
                 "mp_rank_XX.<name>: {}", index.root, b->second);
  }
  return dropped.size();
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

// --dry-run: a summary, one line per target rank (file); or JSON: per rank (chunks, bytes
// written and read, source files) and the plan (fc-plan(5)).
void PrintPlan(const CheckpointIndex& index, const Plan& plan,
               const std::vector<int64_t>& ranks, const ConvertOptions& options,
               std::ostream& out) {
  auto file_read = [](const PlanFile& f) {
    uint64_t read = 0;
    for (const SourceFileBytes& r : f.reads) read += r.bytes;
    return read;
  };
  if (options.json) {
    JsonWriter j(JsonWriter::Style::kCompact);
    j.BeginObject();
    j.Key("source").String(options.input);
    j.Key("ranks").BeginArray();
    for (size_t f = 0; f < plan.files.size(); ++f) {
      const PlanFile& file = plan.files[f];
      j.BeginObject().Key("rank").Int(ranks[f]).Key("process").Int(file.process);
      j.Key("chunks").Uint(file.slots.size());
      j.Key("bytes_written").Uint(file.bytes).Key("bytes_read").Uint(file_read(file));
      j.Key("files_read").BeginArray();
      for (const SourceFileBytes& r : file.reads) {
        j.BeginObject(true).Key("file").String(index.files[r.file].path).Key("bytes").Uint(r.bytes);
        j.EndObject();
      }
      j.EndArray().EndObject();
    }
    j.EndArray();
    j.Key("bytes_read").Uint(plan.bytes_needed).Key("bytes_written").Uint(plan.bytes_written);
    j.Key("estimated_peak_memory").Uint(plan.memory.peak);
    j.Key("plan").RawValue(PlanJson(plan, index, false));
    j.EndObject();
    out << j.str() << "\n";
    return;
  }
  size_t chunks = 0;
  for (const PlanFile& f : plan.files) chunks += f.slots.size();
  out << "plan: " << plan.files.size() << " target rank(s), " << chunks << " chunk(s), read "
      << HumanBytes(plan.bytes_needed) << ", write " << HumanBytes(plan.bytes_written) << ", "
      << plan.processes << " process(es) x " << plan.threads << " thread(s)\n";
  out << "memory: budget " << HumanBytes(plan.memory.budget) << ", estimated peak "
      << HumanBytes(plan.memory.peak) << ", minimum " << HumanBytes(plan.memory.minimum)
      << BookkeepingNote(plan.memory) << "\n";
  PrintTimeEstimate(plan, MeasureThroughputs(index, plan), out);
  TextTable table({"RANK", "PROCESS", "CHUNKS", "WRITE", "READ", "FROM"});
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const PlanFile& file = plan.files[f];
    std::string from;
    if (file.reads.size() == 1) {
      from = ElideMiddle(index.files[file.reads[0].file].path, 60);
    } else if (!file.reads.empty()) {
      from = std::to_string(file.reads.size()) + " files";
    }
    table.AddRow({std::to_string(ranks[f]), std::to_string(file.process),
                  std::to_string(file.slots.size()), HumanBytes(file.bytes),
                  HumanBytes(file_read(file)), from});
  }
  table.Print(out);
  PrintProcessReport(plan, out);
}

// Everything RunConvert decides before writing a byte. Every process of a multi-process
// run builds the same plan from the same inputs. Not movable: targets point into `index`.
// An object copied from another checkpoint than the input, held in memory.
struct CarriedObject {
  std::string key;
  ObjectEncoding encoding = ObjectEncoding::kRaw;
  std::vector<std::byte> bytes;
};

struct ConvertPlan {
  const OutputFormat* format = nullptr;     // a kTargetFiles entry (fc/format/output_format.h)
  OutputSettings settings;
  CheckpointIndex index;
  std::vector<OutputTensor> targets;
  FcDistcpPlan write_plan;                  // one data file per target rank, objects in file 0
  std::vector<const ObjectEntry*> objects;  // plan.files[0].objects[i] comes from objects[i]
  // --from-hf-family with --target-like: the target's non-tensor objects, read by process 0
  // and shared (ShareTargetObjects); plan.files[0].objects[objects.size() + i] is
  // target_objects[i].
  std::vector<CarriedObject> target_objects;
  Plan plan;                                // files = target ranks, slots = their chunks
  std::vector<int64_t> ranks;               // target rank of each plan file
  ConvertSummary summary;
  std::vector<std::vector<int>> visibility;  // which processes see each source file (empty: all)
  std::optional<std::string> like_manifest;  // --target-like as process 0 read it (shared)
};

// --target-like under mpirun: process 0 reads the target checkpoint's metadata and sends its
// layout (as a manifest) to the others, so the target needs to exist on process 0's host
// only and its metadata is read once (as the input's is: fc/ops/shared_input.h). Not shared:
// one process, or the target is the input. Errors (process 0's, agreed by all): those of
// OpenCheckpoint and LayoutFromIndex.
Result<std::optional<std::string>> ShareTargetLike(const ConvertOptions& options,
                                                   Communicator& comm) {
  if (comm.size() <= 1 || options.target_like.empty() ||
      StripTrailingSlashes(options.target_like) == StripTrailingSlashes(options.input)) {
    return std::optional<std::string>();
  }
  std::string text;
  Status read = Status::Ok();
  if (comm.rank() == 0) {
    Result<CheckpointIndex> like = OpenCheckpoint(options.target_like);
    Result<TargetLayout> layout =
        like.ok() ? LayoutFromIndex(*like) : Result<TargetLayout>(like.status());
    if (layout.ok()) {
      text = ManifestJson(*layout);
    } else {
      read = layout.status().With("--target-like " + options.target_like);
    }
  }
  FC_RETURN_IF_ERROR(comm.AllOk(read));
  comm.Broadcast(text, 0);
  return std::optional<std::string>(std::move(text));
}

// Object `obj`'s bytes (of `index`, read through `reader`), checked against its checksum.
Result<std::vector<std::byte>> ReadObject(const CheckpointIndex& index, ChunkReader& reader,
                                          const ObjectEntry& obj) {
  FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, reader.File(obj.file));
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadObjectBytes(*f, obj));
  if (obj.xxh3_64 && DefaultVerifyChecksums()) {
    // As ChunkReader does for chunks (fc-distcp(5), CHECKSUMS).
    FC_ASSIGN_OR_RETURN(uint64_t sum, Xxh3OfFileRange(*f, obj.byte_offset, obj.byte_length));
    if (sum != *obj.xxh3_64) {
      return DataLossError(index.files[obj.file].path + ": object '" + obj.key +
                           "': checksum mismatch: xxh3-64 of the bytes is " + HexU64(sum) +
                           ", the metadata says " + HexU64(*obj.xxh3_64) +
                           " (damaged data; --no-verify-checksums reads it anyway)");
    }
  }
  return bytes;
}

// The most bytes of --target-like objects carried by --from-hf-family (Megatron's are its
// modules' _extra_state: a few hundred bytes each).
constexpr uint64_t kMaxTargetObjectBytes = 64ull << 20;

// --from-hf-family with --target-like: the target's non-tensor objects (a Megatron save's
// ShardedObjects: each module's _extra_state, ...), which Megatron-Core's
// dist_checkpointing.load requires beside the tensors. The HF input has none, so the output
// carries the target's, unchanged: the new run's own. Process 0 reads them and sends them
// to the others (the target need exist on process 0's host only, as ShareTargetLike).
// Errors (agreed by all): the target's OpenCheckpoint and object reads, checksum mismatches,
// more than kMaxTargetObjectBytes in all.
Result<std::vector<CarriedObject>> ShareTargetObjects(const ConvertOptions& options,
                                                      Communicator& comm) {
  std::vector<CarriedObject> objects;
  if (options.from_hf_family.empty() || options.target_like.empty()) return objects;
  Status read = Status::Ok();
  if (comm.rank() == 0) {
    read = [&]() -> Status {
      FC_ASSIGN_OR_RETURN(CheckpointIndex like, OpenCheckpoint(options.target_like));
      ChunkReader reader(like);
      uint64_t total = 0;
      for (const ObjectEntry& o : like.objects) {
        total += o.byte_length;
        if (total > kMaxTargetObjectBytes) {
          return InvalidArgumentError("its non-tensor objects hold more than " +
                                      HumanBytes(kMaxTargetObjectBytes) + " (at '" + o.key +
                                      "'): not a model's extra state");
        }
        FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadObject(like, reader, o));
        objects.push_back({o.key, o.encoding, std::move(bytes)});
      }
      return Status::Ok();
    }().With("--target-like " + options.target_like);
  }
  FC_RETURN_IF_ERROR(comm.AllOk(read));
  if (comm.size() <= 1) return objects;
  std::string count = std::to_string(objects.size());
  comm.Broadcast(count, 0);
  size_t n = 0;
  std::from_chars(count.data(), count.data() + count.size(), n);
  objects.resize(n);
  for (CarriedObject& o : objects) {
    std::string encoding(1, static_cast<char>(o.encoding));
    std::string bytes(reinterpret_cast<const char*>(o.bytes.data()), o.bytes.size());
    comm.Broadcast(o.key, 0);
    comm.Broadcast(encoding, 0);
    comm.Broadcast(bytes, 0);
    o.encoding = static_cast<ObjectEncoding>(encoding.at(0));
    const auto* data = reinterpret_cast<const std::byte*>(bytes.data());
    o.bytes.assign(data, data + bytes.size());
  }
  return objects;
}

// What the write plan holds (counted): it stays with the job while it runs.
uint64_t WritePlanBytes(const FcDistcpPlan& plan) {
  uint64_t n = HeapBytes(plan.tensors) + HeapBytes(plan.files);
  for (const FcDistcpTensorSpec& t : plan.tensors) n += HeapBytes(t.key) + HeapBytes(t.global_shape);
  for (const FcDistcpFileSpec& f : plan.files) {
    n += HeapBytes(f.name) + HeapBytes(f.chunks) + HeapBytes(f.objects);
    for (const FcDistcpChunkSpec& c : f.chunks) n += HeapBytes(c.key) + HeapBytes(c.box);
    for (const FcDistcpObjectSpec& o : f.objects) n += HeapBytes(o.key);
  }
  return n;
}

// The objects of file 0: the input's (left out with --hf-family, or where the format has
// no form for their encoding, with a warning when `report`), then the target's
// (--from-hf-family --target-like), both through --include / --exclude.
Status AddObjects(const ConvertOptions& options, const NameFilter& filter, bool report,
                  ConvertPlan& p) {
  // --hf-family: the output holds HF names; the Megatron save's non-tensor objects (its
  // modules' _extra_state, iteration, args, ...) belong to Megatron's names and are left out.
  if (!options.hf_family.empty() && !p.index.objects.empty()) {
    if (report) {
      spdlog::info("--hf-family {}: the source's {} non-tensor object(s) (e.g. '{}') are not "
                   "carried into the HF-named output", options.hf_family, p.index.objects.size(),
                   p.index.objects.front().key);
    }
  }
  for (const ObjectEntry& o : p.index.objects) {
    if (!options.hf_family.empty()) break;
    if (!p.format->stores_object(o.encoding)) {
      if (report) {
        spdlog::warn("object '{}' is {}: left out of the {} output (no such form there)", o.key,
                     o.encoding == ObjectEncoding::kRaw ? "raw bytes, not a torch.save value"
                                                        : "a torch.save value",
                     p.format->name);
      }
      continue;
    }
    p.objects.push_back(&o);
    p.write_plan.files.front().objects.push_back({o.key, o.encoding, o.byte_length});
  }
  // --include / --exclude choose among the target's objects as among its tensors.
  std::erase_if(p.target_objects,
                [&](const CarriedObject& o) { return !filter.Passes(o.key); });
  for (const CarriedObject& o : p.target_objects) {
    if (!p.format->stores_object(o.encoding)) {
      return InvalidArgumentError("--target-like " + options.target_like + ": object '" + o.key +
                                  "' has no form in the " + std::string(p.format->name) +
                                  " output; a Megatron target is written as torch-dcp");
    }
    for (const ObjectEntry* i : p.objects) {
      if (i->key == o.key) {
        return InvalidArgumentError("object '" + o.key + "' is both in the input and in "
                                    "--target-like " + options.target_like);
      }
    }
    p.write_plan.files.front().objects.push_back({o.key, o.encoding, o.bytes.size()});
  }
  return Status::Ok();
}

// `p.index` is open; `visibility` as PlanRequest::source_visibility; `job` and
// `budget_given` as for the export (job_memory.h).
Status BuildConvertPlan(const ConvertOptions& options, int processes, bool write_manifest,
                        std::vector<std::vector<int>> visibility, const JobMemory& job,
                        bool budget_given, ConvertPlan& p) {
  const CheckpointIndex& index = p.index;
  std::string aoa_text;
  std::optional<TargetLayout> like;  // --from-hf-family --target-like: read before the program
  if (!options.from_hf_family.empty()) {
    if (!options.aoa_file.empty() || !options.hf_family.empty()) {
      return InvalidArgumentError("--from-hf-family excludes --aoa and --hf-family");
    }
    if (!options.target_like.empty()) {
      FC_ASSIGN_OR_RETURN(like, ResolveLayout(index, options, "",
                                              p.like_manifest ? &*p.like_manifest : nullptr));
    }
    FC_ASSIGN_OR_RETURN(aoa_text, HfFamilyReverseProgram(index, options.from_hf_family,
                                                         HfDirOfInput(options.input),
                                                         like ? &like->tensors : nullptr));
  } else if (!options.hf_family.empty()) {
    if (!options.aoa_file.empty()) {
      return InvalidArgumentError("--hf-family and --aoa exclude each other");
    }
    FC_ASSIGN_OR_RETURN(aoa_text, HfFamilyProgram(index, options.hf_family, options.copy_from));
  } else if (!options.aoa_file.empty()) {
    FC_ASSIGN_OR_RETURN(aoa_text, ReadTextFile(options.aoa_file));
  }
  FC_ASSIGN_OR_RETURN(NameFilter filter, NameFilter::Compile(options.include, options.exclude));
  TargetLayout resolved;
  if (like) {
    resolved = std::move(*like);
  } else {
    FC_ASSIGN_OR_RETURN(resolved, ResolveLayout(index, options, aoa_text,
                                                p.like_manifest ? &*p.like_manifest : nullptr));
  }
  TargetLayout layout = FilterLayout(std::move(resolved), filter);
  if (layout.tensors.empty()) {
    return InvalidArgumentError("no target tensor left to write (check --include/--exclude)");
  }
  if (write_manifest && !options.emit_manifest.empty()) {
    FC_ASSIGN_OR_RETURN(auto file, WritableFile::Create(options.emit_manifest));
    FC_RETURN_IF_ERROR(file->Append(ManifestJson(layout)));
    FC_RETURN_IF_ERROR(file->Close());
  }
  if (options.dtype) {
    // --dtype decides the dtype of every floating-point target tensor (a dtype the target
    // layout declares included); the plan casts the pieces.
    for (TargetTensor& t : layout.tensors) {
      const TensorEntry* src = index.FindTensor(t.key);
      if ((t.dtype && IsFloating(*t.dtype)) || (!t.dtype && src && IsFloating(src->dtype))) {
        t.dtype.reset();
      }
    }
  }
  if (AoaOrigin(options).empty()) {
    FC_ASSIGN_OR_RETURN(p.targets, IdentityTargets(index, layout));
  } else {
    FC_ASSIGN_OR_RETURN(p.targets, AoaConvertOutputs(index, aoa_text, AoaOrigin(options), layout));
  }
  if (options.dtype) {
    for (OutputTensor& t : p.targets) {
      if (IsFloating(t.dtype)) t.dtype = *options.dtype;
    }
  }
  p.summary.dropped = WarnNotCarried(index, p.targets, filter, write_manifest);
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
  for (TargetRank& r : layout.ranks) {
    FcDistcpFileSpec file;
    file.name = p.format->file_name(r.rank);
    // Moved: the layout's chunks are not used again (the plan request reads these).
    file.chunks.reserve(r.chunks.size());
    for (TargetChunk& c : r.chunks) {
      file.chunks.push_back({std::move(c.key), std::move(c.box), c.flat_range, c.replica_id});
    }
    r.chunks.clear();
    r.chunks.shrink_to_fit();
    plan.files.push_back(std::move(file));
  }
  if (plan.files.empty()) return InvalidArgumentError("the target layout has no ranks");
  FC_RETURN_IF_ERROR(AddObjects(options, filter, write_manifest, p));
  // The writer's checks (torch DCP: no flattened ranges, chunks that tile each tensor,
  // dtypes of the torch generation, ...) run on the plan here, so that --dry-run refuses
  // what the real run would, with the same message, before any output exists.
  FC_RETURN_IF_ERROR(p.format->check(plan, p.settings));

  PlanRequest request;
  request.kind = PlanKind::kConvert;
  std::unordered_map<std::string, uint32_t> tensor_of;
  for (const TargetTensor& t : layout.tensors) {
    const OutputTensor& target = *by_key.at(t.key);
    tensor_of[t.key] = static_cast<uint32_t>(request.tensors.size());
    request.tensors.push_back({t.key, final_dtype.at(t.key), t.global_shape, target.pieces});
  }
  for (size_t f = 0; f < layout.ranks.size(); ++f) {
    PlanRequest::File file{plan.files[f].name, {}};
    file.slots.reserve(plan.files[f].chunks.size());
    for (const FcDistcpChunkSpec& chunk : plan.files[f].chunks) {
      file.slots.push_back({tensor_of.at(chunk.key), chunk.box, chunk.flat_range});
    }
    request.files.push_back(std::move(file));
    p.ranks.push_back(layout.ranks[f].rank);
  }
  request.processes = processes;
  SetWorkerResources(options, request);
  request.verify_checksums = DefaultVerifyChecksums();
  p.visibility = visibility;
  request.source_visibility = std::move(visibility);
  FC_RETURN_IF_ERROR(CheckNeededFilesVisible(request, p.index));
  ChargeJobMemory(job, WritePlanBytes(plan), budget_given, request);
  FC_ASSIGN_OR_RETURN(p.plan, BuildPlan(std::move(request)));
  p.summary.ranks = layout.ranks.size();
  for (const PlanFile& f : p.plan.files) p.summary.chunks += f.slots.size();
  p.summary.bytes_written = p.plan.bytes_written;
  p.summary.objects = p.objects.size() + p.target_objects.size();
  return Status::Ok();
}

// Objects (with file 0), copied byte for byte.
// Objects go into target file 0. Collective: with every file visible everywhere its writer
// reads them; otherwise each is read by the lowest process that sees its file and sent to
// the writer of file 0 (objects are small: iteration counters, RNG states, configs).
Status WriteObjects(const ConvertPlan& p, ChunkReader& reader, TargetFilesWriter* part,
                    Communicator& comm) {
  if ((p.objects.empty() && p.target_objects.empty()) || p.plan.files.empty()) {
    return Status::Ok();
  }
  const int me = comm.rank();
  const int writer = p.plan.files[0].process;

  for (size_t o = 0; o < p.objects.size(); ++o) {
    const uint32_t file = p.objects[o]->file;
    const int reader_rank = p.visibility.empty() || file >= p.visibility.size() ||
                                    p.visibility[file].empty()
                                ? writer
                                : p.visibility[file].front();
    Result<std::vector<std::byte>> bytes = std::vector<std::byte>();
    if (me == reader_rank) bytes = ReadObject(p.index, reader, *p.objects[o]);
    FC_RETURN_IF_ERROR(comm.AllOk(bytes.status()));
    if (reader_rank != writer) {
      std::string message;
      if (me == reader_rank) message.assign(reinterpret_cast<const char*>(bytes->data()), bytes->size());
      comm.Broadcast(message, reader_rank);
      if (me == writer) {
        const auto* data = reinterpret_cast<const std::byte*>(message.data());
        bytes = std::vector<std::byte>(data, data + message.size());
      }
    }
    Status written = Status::Ok();
    if (me == writer) {
      written = part ? part->WriteObject(o, *bytes)
                     : InternalError("the writer of target file 0 has no output part");
    }
    FC_RETURN_IF_ERROR(comm.AllOk(written));
  }
  // The target's objects: every process holds them (ShareTargetObjects).
  Status written = Status::Ok();
  if (me == writer && !p.target_objects.empty()) {
    if (part == nullptr) written = InternalError("the writer of target file 0 has no output part");
    for (size_t t = 0; written.ok() && t < p.target_objects.size(); ++t) {
      written = part->WriteObject(p.objects.size() + t, p.target_objects[t].bytes);
    }
  }
  return comm.AllOk(written);
}

}  // namespace

namespace {

// A Megatron-Core torch_dist save keeps, beside its torch DCP files, metadata.json (the
// sharded backend and its version) and common.pt (the state that is not sharded: args,
// iteration, the optimizer's param groups and step). dist_checkpointing.load needs both and
// reads any TP x PP from them (checked with Megatron-Core 0.16.1: tests/real/megatron), so a
// torch DCP output of such a source gets copies of the two, staged with the data files.
// Process 0 copies them; when it cannot see the source directory it warns instead.
// Each file is bounded by kMaxSidecarBytes (a common.pt holds no sharded tensor data).
constexpr uint64_t kMaxSidecarBytes = 64ull << 20;

Status CopyMegatronSidecars(const CheckpointIndex& index, const std::string& source_dir,
                           const std::string& staging) {
  if (index.format != CheckpointFormat::kTorchDcp) return Status::Ok();
  const std::string metadata_json = JoinPath(source_dir, "metadata.json");
  if (!PathExists(metadata_json)) {
    for (const auto& [key, value] : index.attributes) {
      if (key.ends_with("megatron_metadata_json")) {
        spdlog::warn("{}: Megatron's metadata.json and common.pt are not visible to process 0; "
                     "copy them into the output for dist_checkpointing.load",
                     source_dir);
        break;
      }
    }
    return Status::Ok();
  }
  for (const char* name : {"metadata.json", "common.pt"}) {
    const std::string from = JoinPath(source_dir, name);
    if (!PathExists(from)) continue;
    FC_RETURN_IF_ERROR(CopyWholeFile(from, JoinPath(staging, name), kMaxSidecarBytes));
    spdlog::debug("copied Megatron's {} from {}", name, source_dir);
  }
  return Status::Ok();
}

// --copy-from: process 0 stages DIR's files beside the data files, refusing a name the
// writer already put there.
Status CopyFromDir(const ConvertOptions& options, const std::vector<std::string>& names,
                   const std::string& staging) {
  for (const std::string& name : names) {
    const std::string to = JoinPath(staging, name);
    if (PathExists(to)) {
      return InvalidArgumentError("--copy-from " + options.copy_from + ": " + name +
                                  " would replace the output's own " + name);
    }
    // Read through the IO policy again: the file may have changed since it was listed.
    FC_RETURN_IF_ERROR(CopyWholeFile(JoinPath(options.copy_from, name), to, kMaxCopyFromBytes)
                           .With("--copy-from"));
  }
  return Status::Ok();
}

}  // namespace

namespace {

// A kTargetFiles part: the format's TargetFilesWriter of this process's target files.
class TargetFilesPart : public JobPart {
 public:
  explicit TargetFilesPart(std::unique_ptr<TargetFilesWriter> writer)
      : writer_(std::move(writer)) {}
  Status Write(uint32_t file, uint32_t slot, uint64_t byte_offset,
               std::span<const std::byte> bytes) override {
    return writer_->WriteChunk(file, slot, byte_offset, bytes);
  }
  Result<std::string> Finish() override { return writer_->FinishDataFiles(); }
  TargetFilesWriter& writer() { return *writer_; }

 private:
  std::unique_ptr<TargetFilesWriter> writer_;
};

// fc distcp and torch DCP output: one data file per target rank (ConvertPlan), objects with
// file 0, then the sidecars and --copy-from files, and the writer's metadata at the commit.
class TargetFilesJob : public OutputJob {
 public:
  TargetFilesJob(const ConvertOptions& options, std::string source_dir)
      : options_(options), source_dir_(std::move(source_dir)) {}
  ConvertPlan& convert_plan() { return p_; }
  std::vector<std::string>& copy_files() { return copy_files_; }

  const Plan& plan() const override { return p_.plan; }
  const CheckpointIndex& source() const override { return p_.index; }
  void PrintPlan(std::ostream& out) const override {
    fc::PrintPlan(p_.index, p_.plan, p_.ranks, options_, out);
  }
  // Target files shared out by bytes (the plan's assignment); process 0 always has one, so
  // it can commit. None: this process only reads.
  Result<std::unique_ptr<JobPart>> CreatePart(const std::string& staging,
                                              const std::vector<uint32_t>& planned,
                                              int /*process*/) const override {
    if (planned.empty()) return std::unique_ptr<JobPart>();
    const std::vector<size_t> files(planned.begin(), planned.end());
    FC_ASSIGN_OR_RETURN(std::unique_ptr<TargetFilesWriter> writer,
                        p_.format->create(options_.output_dir, p_.write_plan, files, staging,
                                          p_.settings));
    return std::unique_ptr<JobPart>(std::make_unique<TargetFilesPart>(std::move(writer)));
  }
  Status WriteBeforeExecute(JobPart* part, const std::string& /*staging*/, ChunkReader& reader,
                            Communicator& comm) const override {
    return WriteObjects(p_, reader,
                        part ? &static_cast<TargetFilesPart*>(part)->writer() : nullptr, comm);
  }
  Status Commit(JobPart* part, std::span<const std::string> parts, OutputDir& output,
                const std::string& staging) const override;

 private:
  ConvertOptions options_;
  std::string source_dir_;  // process 0's input path (Megatron's sidecars are beside it)
  ConvertPlan p_;
  std::vector<std::string> copy_files_;  // --copy-from's files, listed by process 0
};

Status TargetFilesJob::Commit(JobPart* part, std::span<const std::string> parts,
                              OutputDir& output, const std::string& staging) const {
  // Megatron's metadata.json and common.pt describe a Megatron save: not for HF names.
  if (p_.format->name == "torch-dcp" && options_.hf_family.empty() &&
      options_.from_hf_family.empty()) {
    FC_RETURN_IF_ERROR(CopyMegatronSidecars(p_.index, source_dir_, staging));
  }
  // --from-hf-family: the Megatron target's own metadata.json and common.pt (the new run's
  // step 0: its backend, iteration and common state), which dist_checkpointing.load reads.
  if (p_.format->name == "torch-dcp" && !options_.from_hf_family.empty() &&
      !options_.target_like.empty() &&
      PathExists(JoinPath(options_.target_like, "metadata.json"))) {
    for (const char* name : {"metadata.json", "common.pt"}) {
      const std::string from = JoinPath(options_.target_like, name);
      if (!PathExists(from)) continue;
      FC_RETURN_IF_ERROR(CopyWholeFile(from, JoinPath(staging, name), kMaxSidecarBytes)
                             .With("--from-hf-family: Megatron's " + std::string(name) +
                                   " of --target-like"));
    }
  }
  FC_RETURN_IF_ERROR(CopyFromDir(options_, copy_files_, staging));
  if (part == nullptr) return InternalError("process 0 was assigned no target file");
  FC_RETURN_IF_ERROR(static_cast<TargetFilesPart*>(part)->writer().Commit(parts));
  output.MarkCommitted();  // the writer renamed it
  return Status::Ok();
}

// Every process plans (planning reads metadata only); the write plan and the file
// assignment come out the same everywhere (write items may differ with each machine's
// threads and memory, not the files). Agreeing on the outcome keeps a process that failed
// alone (an unreadable file) from leaving the others waiting.
Result<ConvertJob> PlanTargetFiles(const ConvertOptions& options, const OutputFormat* format,
                                   CheckpointIndex index, SharedInput& input,
                                   Communicator& comm) {
  const int me = comm.rank();
  auto job = std::make_unique<TargetFilesJob>(options, input.local_path);
  ConvertPlan& p = job->convert_plan();
  p.format = format;
  p.index = std::move(index);
  FC_ASSIGN_OR_RETURN(std::vector<std::vector<int>> visibility,
                      ShareVisibility(p.index, input, comm));
  p.settings.torch_version = options.torch_version;
  p.settings.torch_serialization = options.torch_serialization;
  if (auto g = p.index.attributes.find("torch_generation"); g != p.index.attributes.end()) {
    p.settings.source_torch_generation = g->second;
  }
  int processes = comm.size();
  if (options.dry_run && options.simulate_processes > 0) {
    if (comm.size() > 1) {
      return InvalidArgumentError("--simulate-processes plans for processes that are not "
                                  "started: run it as one process, not under mpirun");
    }
    processes = options.simulate_processes;
    visibility = SimulatedVisibility(p.index, processes, options.simulate_shared);
  }
  FC_ASSIGN_OR_RETURN(p.like_manifest, ShareTargetLike(options, comm));
  FC_ASSIGN_OR_RETURN(p.target_objects, ShareTargetObjects(options, comm));
  const JobMemory memory = MeasureJobMemory(comm, options.memory_budget > 0);
  FC_RETURN_IF_ERROR(comm.AllOk(
      BuildConvertPlan(PlannedWith(options, comm), processes, me == 0, std::move(visibility),
                       memory, options.memory_budget > 0, p)));
  // Chunks several workers write at once are hashed as written (fc/format/output_format.h),
  // in what the budget leaves beyond the plan's own buffers.
  p.settings.reorder_bytes = ReorderAllowance(p.plan.memory);
  if (me == 0) {
    // -v: what the plan rests on, before any byte is read.
    spdlog::debug("{}: {}, {} tensor(s), {} object(s) in {} file(s)", options.input,
                  CheckpointFormatName(p.index.format), p.index.tensors.size(),
                  p.index.objects.size(), p.index.files.size());
    for (size_t f = 0; f < p.plan.files.size(); ++f) {
      const PlanFile& file = p.plan.files[f];
      spdlog::debug("target rank {} ({}): process {}, {} chunk(s), {}, reads {} source file(s)",
                    p.ranks[f], file.name, file.process, file.slots.size(), HumanBytes(file.bytes),
                    file.reads.size());
    }
  }
  FC_ASSIGN_OR_RETURN(job->copy_files(), ListCopyFromOnProcess0(options.copy_from, comm));
  ConvertSummary summary = p.summary;
  return ConvertJob{std::move(job), summary};
}

// The planner of each shape of the output table, with the flags it refuses before the
// input is opened and how it opens the input.
struct OutputPlanner {
  OutputShape shape;
  Status (*check)(const ConvertOptions& options);
  OpenOptions (*open)(const ConvertOptions& options);
  Result<ConvertJob> (*plan)(const ConvertOptions& options, const OutputFormat* format,
                             CheckpointIndex index, SharedInput& input, Communicator& comm);
};

Status NoChecks(const ConvertOptions&) { return Status::Ok(); }
OpenOptions OpenWithSplit(const ConvertOptions& o) {
  return OpenOptions{.format = o.format, .source_split = o.source_split};
}
OpenOptions OpenWithFormat(const ConvertOptions& o) { return OpenOptions{.format = o.format}; }

constexpr OutputPlanner kPlanners[] = {
    {OutputShape::kTargetFiles, NoChecks, OpenWithSplit, PlanTargetFiles},
    {OutputShape::kDeepSpeedUniversal, CheckUcpOptions, OpenWithSplit, PlanUcp},
    {OutputShape::kDeepSpeedRepartitioned, CheckDeepSpeedOptions, OpenWithFormat,
     PlanDeepSpeed},
};

}  // namespace



Result<ConvertSummary> RunConvert(const ConvertOptions& options, std::ostream& out) {
  FC_ASSIGN_OR_RETURN(const OutputFormat* format, FindOutputFormat(options.output_format));
  if (!options.from_hf_family.empty() && format->shape != OutputShape::kTargetFiles) {
    return InvalidArgumentError("--from-hf-family applies to --output-format fc and torch-dcp, "
                                "not " + std::string(format->name));
  }
  if ((!options.hf_family.empty() || !options.copy_from.empty()) &&
      format->shape != OutputShape::kTargetFiles) {
    return InvalidArgumentError(std::string(options.hf_family.empty() ? "--copy-from" : "--hf-family") +
                                " applies to --output-format fc and torch-dcp, not " +
                                std::string(format->name));
  }
  const OutputPlanner* planner = nullptr;
  for (const OutputPlanner& p : kPlanners) {
    if (p.shape == format->shape) planner = &p;
  }
  if (planner == nullptr) return InternalError("no planner for output format " + std::string(format->name));
  FC_RETURN_IF_ERROR(planner->check(options));
  Communicator& comm = options.comm ? *options.comm : SingleProcessCommunicator();
  // The input as every process sees it (fc/ops/shared_input.h), opened everywhere.
  FC_ASSIGN_OR_RETURN(SharedInput input, ShareInput(options.input, comm));
  FC_ASSIGN_OR_RETURN(CheckpointIndex index,
                      OpenSharedCheckpoint(input, planner->open(options), comm));
  FC_ASSIGN_OR_RETURN(ConvertJob planned,
                      planner->plan(options, format, std::move(index), input, comm));
  const JobRun run{.tool = "fc-convert", .output_dir = options.output_dir,
                   .input = input.local_path, .overwrite = options.overwrite,
                   .dry_run = options.dry_run, .progress = options.progress,
                   .stats_file = options.stats_file};
  FC_RETURN_IF_ERROR(RunJob(*planned.job, run, comm, out));
  return planned.summary;
}

}  // namespace fc
