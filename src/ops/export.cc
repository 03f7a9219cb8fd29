#include "fc/ops/export.h"
#include "fc/ops/hf_family.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "fc/comm/communicator.h"
#include "fc/core/checked_math.h"
#include "fc/core/flat_range.h"
#include "fc/core/glob.h"
#include "fc/exec/execute.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/open.h"
#include "fc/format/optimizer_names.h"
#include "fc/format/safetensors.h"
#include "fc/format/weights.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"
#include "fc/ops/report_format.h"
#include "fc/ops/run_stats.h"
#include "src/ops/job.h"
#include "src/ops/job_memory.h"
#include "src/ops/plan_report.h"
#include "src/ops/time_estimate.h"
#include "src/ops/shared_input.h"
#include "fc/plan/plan.h"
#include "fc/ops/targets.h"

namespace fc {

namespace {

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Tensor data, indexes and metadata of checkpoints: never copied by --copy-from (the export
// writes its own), and names the export writes.
bool IsCheckpointFileName(const std::string& name) {
  for (std::string_view suffix : {".safetensors", ".bin", ".pt", ".pth", ".distcp", ".index.json",
                                  ".metadata", ".fc-lock"}) {
    if (EndsWith(name, suffix)) return true;
  }
  return name == "fc.metadata.json" || name == kHfIndexFileName;
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
  std::vector<std::string> skipped_optimizer;      // output names left out as optimizer state
  std::vector<std::string> no_module_copy;  // DeepSpeed --weights module: params left fp32
  std::vector<std::string> dropped_sources;        // source tensors no output reads
  std::vector<std::string> copy_files;             // --copy-from, process 0 only
  std::vector<std::vector<int>> visibility;        // as PlanRequest::source_visibility
};

// --objects: every object written to `dir` by process 0. Collective: each object is read by
// the lowest process that sees its file (with files on node-local disks it may not be
// process 0) and sent to process 0 (objects are small: iteration counters, RNG states,
// configs).
Status DumpObjects(const ExportPlan& p, const std::string& dir, Communicator& comm) {
  const int me = comm.rank();
  FC_RETURN_IF_ERROR(comm.AllOk(me == 0 ? CreateDirectories(dir) : Status::Ok()));
  ChunkReader reader(p.index);
  for (const ObjectEntry& o : p.index.objects) {
    const int reader_rank =
        p.visibility.empty() || o.file >= p.visibility.size() || p.visibility[o.file].empty()
            ? 0
            : p.visibility[o.file].front();
    Result<std::vector<std::byte>> bytes = std::vector<std::byte>();
    if (me == reader_rank) {
      bytes = [&]() -> Result<std::vector<std::byte>> {
        FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, reader.File(o.file));
        return ReadObjectBytes(*f, o);
      }();
    }
    FC_RETURN_IF_ERROR(comm.AllOk(bytes.status()));
    if (reader_rank != 0) {
      std::string message;
      if (me == reader_rank) message.assign(reinterpret_cast<const char*>(bytes->data()), bytes->size());
      comm.Broadcast(message, reader_rank);
      if (me == 0) {
        const auto* data = reinterpret_cast<const std::byte*>(message.data());
        bytes = std::vector<std::byte>(data, data + message.size());
      }
    }
    Status written = Status::Ok();
    if (me == 0) {
      written = [&]() -> Status {
        const std::string name = SafeObjectFileName(o.key) +
                                 (o.encoding == ObjectEncoding::kTorchSave ? ".pt" : ".bin");
        FC_ASSIGN_OR_RETURN(auto out, WritableFile::Create(JoinPath(dir, name)));
        FC_RETURN_IF_ERROR(out->Append(std::span<const std::byte>(*bytes)));
        return out->Close();
      }();
    }
    FC_RETURN_IF_ERROR(comm.AllOk(written));
  }
  return Status::Ok();
}

// Warnings for what the source holds and the output will not (shown unless --quiet).
void WarnNotCarried(const ExportPlan& p) {
  if (auto b = p.index.attributes.find("deepspeed.tp_buffers_per_rank");
      b != p.index.attributes.end()) {
    // Module buffers whose TP copies differ: no one tensor stands for them.
    spdlog::warn("{}: module buffer(s) whose TP copies differ, exported per rank as "
                 "mp_rank_XX.<name>: {}", p.index.root, b->second);
  }
  if (!p.no_module_copy.empty()) {
    // ZeRO-3 saves only empty placeholders in the module state dict: the only values are
    // the fp32 masters. Said, rather than fp32 handed out under "--weights module" silently.
    spdlog::warn("--weights module: {} param(s) have no values in the module state dict "
                 "(ZeRO-3 saves empty placeholders), exported as their fp32 master weights: {}",
                 p.no_module_copy.size(), FirstNames(p.no_module_copy));
  }
  if (!p.skipped_optimizer.empty()) {
    spdlog::warn("leaving out {} optimizer state tensor(s) (--include-optimizer exports them): {}",
                 p.skipped_optimizer.size(), FirstNames(p.skipped_optimizer));
  }
  if (!p.dropped_sources.empty()) {
    spdlog::warn("{} source tensor(s) are in no output of the AOA program: {}",
                 p.dropped_sources.size(), FirstNames(p.dropped_sources));
  }
}

// `p.index` is open; `visibility` as PlanRequest::source_visibility.
// `job`: the process as measured once the index was open; `budget_given`: --memory-budget
// was set (then the job's bookkeeping is charged to it: job_memory.h).
Status BuildExportPlan(const ExportOptions& options, int processes,
                       std::vector<std::vector<int>> visibility, const JobMemory& job,
                       bool budget_given, ExportPlan& p) {
  FC_ASSIGN_OR_RETURN(WeightsSelected weights, SelectWeights(options.weights, &p.index));
  p.no_module_copy = std::move(weights.no_module_copy);
  if (options.include_optimizer) {
    if (const std::string why = UnreadOptimizerStates(p.index); !why.empty()) {
      spdlog::warn("{}: the optimizer states are not exported: {}", p.index.root, why);
    }
  }
  const CheckpointIndex& index = p.index;
  FC_ASSIGN_OR_RETURN(NameFilter filter, NameFilter::Compile(options.include, options.exclude));
  const std::vector<std::string>& markers =
      options.optimizer_markers.empty() ? kDefaultOptimizerMarkers : options.optimizer_markers;

  std::vector<OutputTensor> all;
  if (!options.hf_family.empty()) {
    if (!options.aoa_file.empty()) return InvalidArgumentError("--hf-family and --aoa exclude each other");
    FC_ASSIGN_OR_RETURN(std::string text, HfFamilyProgram(index, options.hf_family, options.copy_from));
    FC_ASSIGN_OR_RETURN(all, AoaOutputs(index, text, "--hf-family " + options.hf_family));
  } else if (options.aoa_file.empty()) {
    all = IdentityOutputs(index);
  } else {
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> text, ReadWholeFile(options.aoa_file, 64 << 20));
    FC_ASSIGN_OR_RETURN(all, AoaOutputs(index, std::string(reinterpret_cast<const char*>(text.data()),
                                                           text.size()),
                                        options.aoa_file));
  }
  // Source tensors no output reads (an AOA program removed or consumed them): reported.
  std::set<const TensorEntry*> read;
  for (const OutputTensor& t : all) {
    for (const SourcePiece& piece : t.pieces) read.insert(piece.source);
  }
  for (const TensorEntry& t : index.tensors) {
    if (!read.count(&t)) p.dropped_sources.push_back(t.key);
  }
  p.summary.dropped_by_aoa = p.dropped_sources.size();
  for (OutputTensor& t : all) {
    if (!options.include_optimizer && IsOptimizerKey(t.name, markers)) {
      ++p.summary.skipped_optimizer;
      p.skipped_optimizer.push_back(t.name);
      continue;
    }
    if (!filter.Passes(t.name)) continue;
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
  SetWorkerResources(options, request);
  request.verify_checksums = DefaultVerifyChecksums();
  p.visibility = visibility;
  request.source_visibility = std::move(visibility);
  FC_RETURN_IF_ERROR(CheckNeededFilesVisible(request, p.index));
  ChargeJobMemory(job, 0, budget_given, request);
  FC_ASSIGN_OR_RETURN(p.plan, BuildPlan(std::move(request)));
  return Status::Ok();
}

// Process 0, before anyone writes (the output directory is already claimed, OutputDir):
// --copy-from files are staged. (Objects are dumped next, by every process: DumpObjects; a
// --objects directory inside OUT goes into the staging directory, so it appears with the
// export.)
Status PrepareOutput(const ExportOptions& options, const ExportPlan& p, const std::string& staging) {
  for (const std::string& name : p.copy_files) {
    // Read through the IO policy again: the file may have changed since it was listed.
    FC_RETURN_IF_ERROR(CopyWholeFile(JoinPath(options.copy_from, name), JoinPath(staging, name),
                                     kMaxCopyFromBytes)
                           .With("--copy-from"));
  }
  if (!p.index.objects.empty() && options.objects_dir.empty()) {
    spdlog::info("skipping {} non-tensor object(s) (e.g. '{}'); --objects DIR dumps them",
                 p.index.objects.size(), p.index.objects.front().key);
  }
  return Status::Ok();
}

// Where --objects goes: the directory, or its place in the staging directory when it lies
// inside OUT.
std::string ObjectsDir(const ExportOptions& options, const std::string& staging) {
  const std::string out = StripTrailingSlashes(options.output_dir) + "/";
  std::string dir = StripTrailingSlashes(options.objects_dir);
  if (dir.compare(0, out.size(), out) == 0) dir = JoinPath(staging, dir.substr(out.size()));
  return dir;
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
  if (!p.copy_files.empty()) {
    // One line of at most 120 columns, whatever the directory and file names.
    out << ElideMiddle("copy from " + ElideMiddle(options.copy_from, 50) + ": " +
                           std::to_string(p.copy_files.size()) + " file(s): " +
                           FirstNames(p.copy_files),
                       120)
        << "\n";
  }
  out << "memory: budget " << HumanBytes(plan.memory.budget) << ", expected peak "
      << HumanBytes(plan.memory.peak) << ", minimum " << HumanBytes(plan.memory.minimum)
      << BookkeepingNote(plan.memory) << "\n";
  PrintTimeEstimate(plan, MeasureThroughputs(p.index, plan), out);
  TextTable table({"FILE", "PROCESS", "TENSORS", "BYTES", "READ"});
  for (const PlanFile& f : plan.files) {
    uint64_t read = 0;
    for (const SourceFileBytes& r : f.reads) read += r.bytes;
    table.AddRow({f.name, std::to_string(f.process), std::to_string(f.slots.size()),
                  HumanBytes(f.bytes), HumanBytes(read)});
  }
  table.Print(out);
  PrintProcessReport(plan, out);
}

// One process's part: a safetensors file per plan file it writes.
class ExportPart : public JobPart {
 public:
  Status Open(const ExportPlan& p, const std::vector<uint32_t>& files, const std::string& staging) {
    files_ = files;
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
  Result<std::string> Finish() override {
    for (uint32_t f : files_) FC_RETURN_IF_ERROR(writers_[f]->Finish());
    return std::string();
  }

 private:
  std::vector<uint32_t> files_;
  std::vector<std::unique_ptr<SafetensorsWriter>> writers_;
};

// The export as a job of the one job path (src/ops/job.h): whole files per process,
// balanced by bytes (the plan's assignment); process 0 adds the index and renames the
// staging directory onto OUT, so OUT holds nothing or the whole export.
class ExportJob : public OutputJob {
 public:
  explicit ExportJob(const ExportOptions& options) : options_(options) {}
  ExportPlan& export_plan() { return p_; }

  const Plan& plan() const override { return p_.plan; }
  const CheckpointIndex& source() const override { return p_.index; }
  void PrintPlan(std::ostream& out) const override { fc::PrintPlan(p_, options_, out); }
  Result<std::unique_ptr<JobPart>> CreatePart(const std::string& staging,
                                              const std::vector<uint32_t>& files,
                                              int /*process*/) const override {
    if (files.empty()) return std::unique_ptr<JobPart>();
    auto part = std::make_unique<ExportPart>();
    FC_RETURN_IF_ERROR(part->Open(p_, files, staging));
    return std::unique_ptr<JobPart>(std::move(part));
  }
  // --copy-from's files (process 0) and --objects (collective).
  Status WriteBeforeExecute(JobPart*, const std::string& staging, ChunkReader&,
                            Communicator& comm) const override {
    FC_RETURN_IF_ERROR(
        comm.AllOk(comm.rank() == 0 ? PrepareOutput(options_, p_, staging) : Status::Ok()));
    if (!p_.index.objects.empty() && !options_.objects_dir.empty()) {
      FC_RETURN_IF_ERROR(
          DumpObjects(p_, ObjectsDir(options_, staging), comm).With("--objects"));
    }
    return Status::Ok();
  }
  Status Commit(JobPart*, std::span<const std::string>, OutputDir& output,
                const std::string& staging) const override {
    if (p_.shards.file_names.size() > 1) {
      const std::string staged = JoinPath(staging, std::string(kHfIndexFileName));
      FC_ASSIGN_OR_RETURN(auto index_file, WritableFile::Create(staged));
      FC_RETURN_IF_ERROR(index_file->Append(WriteHfIndexJson(p_.tensor_bytes, p_.shards)));
      FC_RETURN_IF_ERROR(index_file->Sync());
      FC_RETURN_IF_ERROR(index_file->Close());
    }
    return output.Commit();
  }

 private:
  ExportOptions options_;
  ExportPlan p_;
};


}  // namespace

Result<std::vector<std::string>> CopyFromFiles(const std::string& dir) {
  Env* env = DefaultEnv();
  const EnvFileType type = env->Type(dir, /*follow=*/true);
  if (type == EnvFileType::kMissing) return NotFoundError("--copy-from " + dir + ": no such directory");
  if (type != EnvFileType::kDirectory) {
    return InvalidArgumentError("--copy-from " + dir + ": not a directory");
  }
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  std::vector<std::string> files;
  for (const std::string& name : names) {
    if (name.empty() || name[0] == '.' || IsCheckpointFileName(name)) continue;
    const std::string path = JoinPath(dir, name);
    if (env->Type(path, /*follow=*/true) != EnvFileType::kRegular) continue;  // dirs, FIFOs
    // Opening applies the read policy: a symlink out of `dir` is refused (kInvalidArgument)
    // unless --follow-symlinks.
    FC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f,
                        RandomAccessFile::Open(path).With("--copy-from"));
    if (f->size() > kMaxCopyFromBytes) {
      spdlog::info("--copy-from: skipping {} ({}, over {})", path, HumanBytes(f->size()),
                   HumanBytes(kMaxCopyFromBytes));
      continue;
    }
    files.push_back(name);
  }
  return files;
}

Result<std::vector<std::string>> ListCopyFromOnProcess0(const std::string& dir,
                                                        Communicator& comm) {
  std::vector<std::string> files;
  if (dir.empty()) return files;
  Status listed = Status::Ok();
  if (comm.rank() == 0) {
    Result<std::vector<std::string>> found = CopyFromFiles(dir);
    if (found.ok()) {
      files = std::move(*found);
    } else {
      listed = found.status();
    }
  }
  FC_RETURN_IF_ERROR(comm.AllOk(listed));
  return files;
}

Result<ExportSummary> RunExport(const ExportOptions& options, std::ostream& out) {
  Communicator* comm = options.comm ? options.comm : &SingleProcessCommunicator();
  const int me = comm->rank();
  // Every step that can fail on one process alone ends in an agreement, so that no process
  // waits for one that has given up.
  auto job = std::make_unique<ExportJob>(options);
  ExportPlan* p = &job->export_plan();
  // The input as every process sees it (fc/ops/shared_input.h), opened everywhere.
  FC_ASSIGN_OR_RETURN(SharedInput input, ShareInput(options.input, *comm));
  FC_ASSIGN_OR_RETURN(p->index, OpenSharedCheckpoint(input, OpenOptions{.format = options.format, .source_split = options.source_split}, *comm));
  FC_ASSIGN_OR_RETURN(std::vector<std::vector<int>> visibility,
                      ShareVisibility(p->index, input, *comm));
  const JobMemory memory = MeasureJobMemory(*comm, options.memory_budget > 0);
  FC_RETURN_IF_ERROR(
      comm->AllOk(BuildExportPlan(PlannedWith(options, *comm), comm->size(),
                                  std::move(visibility), memory, options.memory_budget > 0, *p)));
  if (me == 0) {
    // -v: what the plan rests on, before any byte is read.
    spdlog::debug("{}: {}, {} tensor(s), {} object(s) in {} file(s)", options.input,
                  CheckpointFormatName(p->index.format), p->index.tensors.size(),
                  p->index.objects.size(), p->index.files.size());
    for (const PlanFile& f : p->plan.files) {
      spdlog::debug("output {}: process {}, {} tensor(s), {}, reads {} source file(s)", f.name,
                    f.process, f.slots.size(), HumanBytes(f.bytes), f.reads.size());
    }
    WarnNotCarried(*p);
  }
  FC_ASSIGN_OR_RETURN(p->copy_files, ListCopyFromOnProcess0(options.copy_from, *comm));
  const JobRun run{.tool = "fc-export", .what = "exporting", .output_dir = options.output_dir,
                   .input = input.local_path, .overwrite = options.overwrite,
                   .dry_run = options.dry_run, .progress = options.progress,
                   .stats_file = options.stats_file};
  FC_RETURN_IF_ERROR(RunJob(*job, run, *comm, out));
  p->summary.tensors = p->outputs.size();
  if (options.dry_run) return p->summary;
  p->summary.files = p->shards.file_names;
  if (p->shards.file_names.size() > 1) p->summary.files.push_back(std::string(kHfIndexFileName));
  p->summary.copied = p->copy_files;
  return p->summary;
}

}  // namespace fc
