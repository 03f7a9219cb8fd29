#include "fc/ops/export.h"

#include <algorithm>
#include <regex>
#include <set>

#include <spdlog/spdlog.h>

#include "fc/comm/communicator.h"
#include "fc/core/checked_math.h"
#include "fc/core/flat_range.h"
#include "fc/exec/execute.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/deepspeed.h"
#include "fc/format/open.h"
#include "fc/format/safetensors.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"
#include "fc/ops/report_format.h"
#include "fc/ops/run_stats.h"
#include "src/ops/claim_output.h"
#include "fc/plan/plan.h"
#include "fc/ops/targets.h"

namespace fc {

const std::vector<std::string> kDefaultOptimizerMarkers = {
    "optim.",      "optimizer.",  ".exp_avg",        ".exp_avg_sq",      ".fp32_param",
    ".moment1_0",  ".moment2_0",  ".w_0",            ".beta1_pow_acc_0", ".beta2_pow_acc_0",
    ".master_weight"};

namespace {

bool IsOptimizerKey(const std::string& key, const std::vector<std::string>& markers) {
  for (const std::string& m : markers) {
    if (key.find(m) != std::string::npos) return true;
  }
  return false;
}

Result<std::optional<std::regex>> CompileRegex(const std::string& flag, const std::string& text) {
  if (text.empty()) return std::optional<std::regex>();
  try {
    return std::optional<std::regex>(std::regex(text));
  } catch (const std::regex_error& e) {
    return InvalidArgumentError(flag + " '" + text + "': " + e.what());
  }
}

std::string SafeObjectFileName(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '/') {
      out += "%2F";
    } else if (c == '%') {
      out += "%25";
    } else {
      out += c;
    }
  }
  return out;
}

Status DumpObjects(const CheckpointIndex& index, const std::string& dir) {
  FC_RETURN_IF_ERROR(CreateDirectories(dir));
  ChunkReader reader(index);
  for (const ObjectEntry& o : index.objects) {
    FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, reader.File(o.file));
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadObjectBytes(*f, o));
    const std::string name = SafeObjectFileName(o.key) +
                             (o.encoding == ObjectEncoding::kTorchSave ? ".pt" : ".bin");
    FC_ASSIGN_OR_RETURN(auto out, WritableFile::Create(JoinPath(dir, name)));
    FC_RETURN_IF_ERROR(out->Append(std::span<const std::byte>(bytes)));
    FC_RETURN_IF_ERROR(out->Close());
  }
  return Status::Ok();
}

// What every process of an export decides from the metadata alone (the same everywhere).
// Not movable: outputs point into `index`.
struct ExportPlan {
  CheckpointIndex index;
  std::vector<OutputTensor> outputs;
  std::vector<std::pair<std::string, uint64_t>> tensor_bytes;  // per output, in order
  HfShardAssignment shards;
  std::vector<std::vector<size_t>> file_tensors;  // output indices per file
  Plan plan;                                       // files = shards, slots = tensors
  ExportSummary summary;
};

Status BuildExportPlan(const ExportOptions& options, int processes, ExportPlan& p) {
  FC_ASSIGN_OR_RETURN(p.index, OpenCheckpoint(options.input, options.format));
  if (p.index.format == CheckpointFormat::kDeepSpeed) {
    // Plain names: fp32 master weights (default) or the 16-bit module weights.
    FC_ASSIGN_OR_RETURN(DeepSpeedWeights w, ParseDeepSpeedWeights(options.weights.empty()
                                                                      ? "fp32"
                                                                      : options.weights));
    FC_RETURN_IF_ERROR(SelectDeepSpeedWeights(w, &p.index));
  } else if (!options.weights.empty()) {
    return InvalidArgumentError("--weights applies to DeepSpeed checkpoints only");
  }
  const CheckpointIndex& index = p.index;
  FC_ASSIGN_OR_RETURN(auto include, CompileRegex("--include", options.include_regex));
  FC_ASSIGN_OR_RETURN(auto exclude, CompileRegex("--exclude", options.exclude_regex));
  const std::vector<std::string>& markers =
      options.optimizer_markers.empty() ? kDefaultOptimizerMarkers : options.optimizer_markers;

  std::vector<OutputTensor> all;
  if (options.aoa_file.empty()) {
    all = IdentityOutputs(index);
  } else {
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> text, ReadWholeFile(options.aoa_file, 64 << 20));
    FC_ASSIGN_OR_RETURN(all, AoaOutputs(index, std::string(reinterpret_cast<const char*>(text.data()),
                                                           text.size()),
                                        options.aoa_file));
  }
  for (OutputTensor& t : all) {
    if (!options.include_optimizer && IsOptimizerKey(t.name, markers)) {
      ++p.summary.skipped_optimizer;
      continue;
    }
    if (include && !std::regex_search(t.name, *include)) continue;
    if (exclude && std::regex_search(t.name, *exclude)) continue;
    if (options.dtype && IsFloating(t.dtype)) t.dtype = *options.dtype;
    p.outputs.push_back(std::move(t));
  }
  if (p.outputs.empty()) {
    return InvalidArgumentError(options.input + ": no tensors to export" +
                                (p.summary.skipped_optimizer
                                     ? " (optimizer states are left out; --include-optimizer)"
                                     : std::string(" (check --include/--exclude)")));
  }
  // Every source must be complete and every output fully covered before anything is written.
  std::set<const TensorEntry*> sources;
  for (const OutputTensor& t : p.outputs) {
    FC_RETURN_IF_ERROR(PiecesCover(t.name, t.pieces, Box::Whole(t.shape)));
    for (const SourcePiece& piece : t.pieces) {
      if (piece.source) sources.insert(piece.source);
    }
  }
  for (const TensorEntry* s : sources) FC_RETURN_IF_ERROR(CheckSourceCoverage(*s));

  for (const OutputTensor& t : p.outputs) {
    FC_ASSIGN_OR_RETURN(uint64_t bytes, CheckedByteSize(t.shape, DTypeSize(t.dtype)));
    p.tensor_bytes.emplace_back(t.name, bytes);
    p.summary.tensor_bytes += bytes;
  }
  FC_ASSIGN_OR_RETURN(p.shards, AssignHfShards(p.tensor_bytes, options.max_shard_bytes));
  p.file_tensors.resize(p.shards.file_names.size());
  for (size_t i = 0; i < p.outputs.size(); ++i) {
    p.file_tensors[p.shards.tensor_file[i]].push_back(i);
  }
  p.summary.skipped_objects = options.objects_dir.empty() ? index.objects.size() : 0;

  PlanRequest request;
  request.kind = PlanKind::kExport;
  for (const OutputTensor& t : p.outputs) request.tensors.push_back({t.name, t.dtype, t.shape, t.pieces});
  for (size_t f = 0; f < p.shards.file_names.size(); ++f) {
    PlanRequest::File file{p.shards.file_names[f], {}};
    for (size_t i : p.file_tensors[f]) {
      file.slots.push_back({static_cast<uint32_t>(i), Box::Whole(p.outputs[i].shape), std::nullopt});
    }
    request.files.push_back(std::move(file));
  }
  request.processes = processes;
  request.threads = WorkerThreads(options.threads);
  request.memory_budget =
      options.memory_budget ? options.memory_budget : PhysicalMemoryBytes() / 4;
  FC_ASSIGN_OR_RETURN(p.plan, BuildPlan(std::move(request)));
  return Status::Ok();
}

// Process 0, before anyone writes (the output directory is already claimed, OutputDir):
// objects are dumped when asked for; a --objects directory inside OUT goes into the
// staging directory, so it appears with the export.
Status PrepareOutput(const ExportOptions& options, const ExportPlan& p, const std::string& staging) {
  if (p.index.objects.empty()) return Status::Ok();
  if (options.objects_dir.empty()) {
    spdlog::info("skipping {} non-tensor object(s) (e.g. '{}'); --objects DIR dumps them",
                 p.index.objects.size(), p.index.objects.front().key);
    return Status::Ok();
  }
  const std::string out = StripTrailingSlashes(options.output_dir) + "/";
  std::string dir = StripTrailingSlashes(options.objects_dir);
  if (dir.compare(0, out.size(), out) == 0) dir = JoinPath(staging, dir.substr(out.size()));
  return DumpObjects(p.index, dir).With("--objects");
}

// --dry-run: a short summary and one line per output file, or the plan as JSON.
void PrintPlan(const ExportPlan& p, const ExportOptions& options, std::ostream& out) {
  const Plan& plan = p.plan;
  if (options.json) {
    out << PlanJson(plan, p.index, false);
    return;
  }
  out << "export plan: " << p.outputs.size() << " tensor(s) into " << plan.files.size()
      << " file(s), " << HumanBytes(plan.bytes_written) << " to write, "
      << HumanBytes(plan.bytes_needed) << " to read, " << plan.processes << " process(es) x "
      << plan.threads << " thread(s)\n";
  out << "memory: budget " << HumanBytes(plan.memory.budget) << ", expected peak "
      << HumanBytes(plan.memory.peak) << ", minimum " << HumanBytes(plan.memory.minimum) << "\n";
  TextTable table({"FILE", "PROCESS", "TENSORS", "BYTES", "READ"});
  for (const PlanFile& f : plan.files) {
    uint64_t read = 0;
    for (const SourceFileBytes& r : f.reads) read += r.bytes;
    table.AddRow({f.name, std::to_string(f.process), std::to_string(f.slots.size()),
                  HumanBytes(f.bytes), HumanBytes(read)});
  }
  table.Print(out);
}

// The export's writers: one safetensors file per plan file this process writes.
class ExportSink : public PlanSink {
 public:
  Status Open(const ExportPlan& p, const std::vector<uint32_t>& files, const std::string& staging) {
    writers_.resize(p.shards.file_names.size());
    for (uint32_t f : files) {
      std::vector<SafetensorsTensorSpec> specs;
      for (size_t i : p.file_tensors[f]) {
        specs.push_back({p.outputs[i].name, p.outputs[i].dtype, p.outputs[i].shape});
      }
      SafetensorsWriteOptions wo;
      wo.atomic = false;
      FC_ASSIGN_OR_RETURN(writers_[f],
                          SafetensorsWriter::Create(JoinPath(staging, p.shards.file_names[f]),
                                                    std::move(specs), {{"format", "pt"}}, wo));
    }
    return Status::Ok();
  }
  Status Write(uint32_t file, uint32_t slot, uint64_t byte_offset,
               std::span<const std::byte> bytes) override {
    return writers_[file]->Write(slot, byte_offset, bytes);
  }
  Status Finish(const std::vector<uint32_t>& files) {
    for (uint32_t f : files) FC_RETURN_IF_ERROR(writers_[f]->Finish());
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<SafetensorsWriter>> writers_;
};

// This process's files, written completely under `staging` (not yet renamed into place).
Result<ExecuteStats> WriteFiles(const ExportOptions& options, const ExportPlan& p, int me,
                                const std::string& staging) {
  const std::vector<uint32_t>& files = p.plan.per_process[static_cast<size_t>(me)].files;
  ExportSink sink;
  FC_RETURN_IF_ERROR(sink.Open(p, files, staging));
  ChunkReader reader(p.index);
  ExecuteOptions eo;
  eo.process = me;
  eo.what = "exporting";
  eo.progress = options.progress;
  FC_ASSIGN_OR_RETURN(ExecuteStats stats, Execute(p.plan, reader, sink, eo));
  FC_RETURN_IF_ERROR(sink.Finish(files));
  return stats;
}

}  // namespace

Result<ExportSummary> RunExport(const ExportOptions& options, std::ostream& out) {
  RunStatsMeter meter;
  Communicator* comm = options.comm ? options.comm : &SingleProcessCommunicator();
  const int me = comm->rank();
  // Every step that can fail on one process alone ends in an agreement, so that no process
  // waits for one that has given up.
  auto p = std::make_unique<ExportPlan>();
  FC_RETURN_IF_ERROR(comm->AllOk(BuildExportPlan(options, comm->size(), *p)));
  if (options.dry_run) {
    if (me == 0) PrintPlan(*p, options, out);
    p->summary.tensors = p->outputs.size();
    return p->summary;
  }
  // Process 0 claims OUT (lock, checks, a staging directory next to it: fc/io/output_dir.h);
  // every process writes its files into that one staging directory; process 0 adds the
  // index and renames the directory onto OUT, so OUT holds nothing or the whole export.
  FC_ASSIGN_OR_RETURN(ClaimedOutput claimed,
                      ClaimOutput(options.output_dir, options.input, *comm));
  std::unique_ptr<OutputDir>& output = claimed.dir;
  const std::string& staging = claimed.staging;
  FC_RETURN_IF_ERROR(comm->AllOk(me == 0 ? PrepareOutput(options, *p, staging) : Status::Ok()));

  // Whole files per process, balanced by bytes (the plan's assignment).
  const HfShardAssignment& shards = p->shards;
  ExecuteStats executed;
  Status written = [&]() -> Status {
    Result<ExecuteStats> run = WriteFiles(options, *p, me, staging);
    meter.InputsDone();
    FC_ASSIGN_OR_RETURN(executed, std::move(run));
    return Status::Ok();
  }();
  FC_RETURN_IF_ERROR(comm->AllOk(written));

  p->summary.files = shards.file_names;
  Status committed = [&]() -> Status {
    if (me != 0) return Status::Ok();
    if (shards.file_names.size() > 1) {
      const std::string staged = JoinPath(staging, std::string(kHfIndexFileName));
      FC_ASSIGN_OR_RETURN(auto index_file, WritableFile::Create(staged));
      FC_RETURN_IF_ERROR(index_file->Append(WriteHfIndexJson(p->tensor_bytes, shards)));
      FC_RETURN_IF_ERROR(index_file->Sync());
      FC_RETURN_IF_ERROR(index_file->Close());
    }
    return output->Commit();
  }();
  FC_RETURN_IF_ERROR(comm->AllOk(committed));
  if (shards.file_names.size() > 1) p->summary.files.push_back(std::string(kHfIndexFileName));
  p->summary.tensors = p->outputs.size();
  if (!options.stats_file.empty()) {
    FC_RETURN_IF_ERROR(WriteRunStats(options.stats_file, "fc-export", p->plan.bytes_needed,
                                     meter.Finish(executed.peak_buffer_bytes), *comm));
  }
  return p->summary;
}

}  // namespace fc
