// fc-convert --output-format deepspeed. Contract: src/ops/convert_deepspeed.h.
//
// The run is an export whose "tensors" are the new flat partitions: each one a 1-D plan
// tensor filled from ranges of the old partitions (and zero pieces for the new padding),
// one slot per storage record of the archive it lives in. The planner cuts them under the
// budget; the executor reads every needed old element once and the DsArchiveWriter puts
// the bytes at their final place. What is copied (model-state storages, layer files) goes in
// blocks of at most 16 MiB (or the budget, when smaller).
#include "src/ops/convert_deepspeed.h"

#include <unistd.h>

#include <algorithm>
#include <map>

#include "fc/exec/assemble.h"
#include "fc/exec/execute.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/deepspeed_writer.h"
#include "fc/format/open.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"
#include "fc/ops/report_format.h"
#include "fc/ops/run_stats.h"
#include "fc/plan/plan.h"
#include "src/ops/convert_job.h"
#include "src/ops/job.h"
#include "src/ops/plan_report.h"
#include "src/ops/shared_input.h"
#include "src/ops/staged_files.h"

namespace fc {
namespace {

constexpr uint64_t kCopyBlock = uint64_t{16} << 20;

}  // namespace

Status CheckDeepSpeedOptions(const ConvertOptions& o) {
  std::vector<std::string> given;
  if (!o.target_like.empty()) given.push_back("--target-like");
  if (!o.target_layout_file.empty()) given.push_back("--target-layout");
  if (!o.preset.empty()) given.push_back("--preset");
  if (!o.target_manifest.empty()) given.push_back("--target-manifest");
  if (!o.emit_manifest.empty()) given.push_back("--emit-manifest");
  if (!o.aoa_file.empty()) given.push_back("--aoa");
  if (!o.include.empty() || !o.exclude.empty()) given.push_back("--include/--exclude");
  if (o.dtype) given.push_back("--dtype");
  if (!o.torch_version.empty() || !o.torch_serialization.empty()) given.push_back("--torch-*");
  if (o.ucp_inject_missing_state) given.push_back("--inject-missing-state");
  if (o.ucp_zero3) given.push_back("--ucp-zero3");
  if (o.ucp_fresh_optimizer) given.push_back("--ucp-fresh-optimizer");
  if (!given.empty()) {
    return InvalidArgumentError("--output-format deepspeed re-partitions every file of the "
                                "checkpoint as it is, for --dp: " + given.front() +
                                " does not apply");
  }
  if (o.dry_run && o.simulate_processes > 0) {
    return UnimplementedError("--output-format deepspeed: --simulate-processes does not apply "
                              "(one process)");
  }
  return Status::Ok();
}

namespace {

// What the reader says about the source, refused before any file is laid out.
Status CheckSource(const CheckpointIndex& index, const std::string& input) {
  if (index.format != CheckpointFormat::kDeepSpeed) {
    return UnimplementedError(input + ": --output-format deepspeed re-partitions DeepSpeed "
                              "checkpoints only (input is " +
                              std::string(CheckpointFormatName(index.format)) + ")");
  }
  const std::string optimizer = index.Attribute("deepspeed.optimizer");
  if (optimizer == "universal") {
    return UnimplementedError(input + ": a Universal Checkpoint is loaded at any DP size "
                              "(load_universal); nothing to re-partition");
  }
  if (!index.Attribute("deepspeed.moe").empty() && optimizer == "not read (MoE)") {
    return UnimplementedError(input + ": MoE checkpoint whose optimizer files fc does not read "
                              "(deepspeed.moe): not re-partitioned (MoE: ZeRO 1/2 or BF16_Optimizer at one "
                              "model-parallel rank)");
  }
  return Status::Ok();
}

struct DsJob {
  CheckpointIndex index;  // the reader's: checks, and the parsed files the layout plans from
  DsRepartition layout;
  std::vector<size_t> plan_archive;               // plan file -> archive
  std::vector<std::vector<size_t>> slot_record;   // plan file -> slot -> record
  Plan plan;
};

// `options` as PlannedWith gives them. Collective: every process lays out the files (from
// the source's pickles its reader kept in job.index) and the files' visibility is shared.
Status BuildJob(const ConvertOptions& options, SharedInput& input, Communicator& comm,
                DsJob& job) {
  Result<DsRepartition> layout =
      PlanDeepSpeedRepartition(options.input, job.index, options.degrees.dp);
  FC_RETURN_IF_ERROR(comm.AllOk(layout.status()));
  job.layout = std::move(*layout);
  FC_ASSIGN_OR_RETURN(std::vector<std::vector<int>> visibility,
                      ShareVisibility(job.layout.source, input, comm));
  PlanRequest request;
  request.kind = PlanKind::kExport;
  const std::vector<TensorEntry>& sources = job.layout.source.tensors;
  for (size_t a = 0; a < job.layout.archives.size(); ++a) {
    const DsArchiveSpec& spec = job.layout.archives[a];
    PlanRequest::File file;
    file.name = spec.path;
    std::vector<size_t> records;
    for (size_t k = 0; k < spec.records.size(); ++k) {
      const DsRecord& rec = spec.records[k];
      if (rec.kind != DsRecord::Kind::kStream || rec.elements == 0) continue;
      PlanTensor t;
      t.name = spec.path + ": " + rec.name;
      t.dtype = rec.dtype;
      t.shape = {rec.elements};
      for (const DsStreamPart& part : rec.parts) {
        SourcePiece piece;
        piece.dst_box = Box{{part.dst_begin}, {part.length}};
        if (part.source >= 0) {
          piece.source = &sources[static_cast<size_t>(part.source)];
          piece.src_box = Box{{part.src_begin}, {part.length}};
          FC_RETURN_IF_ERROR(CheckSourceCoverage(*piece.source));
        }
        t.pieces.push_back(std::move(piece));
      }
      FC_RETURN_IF_ERROR(PiecesCover(t.name, t.pieces, Box::Whole(t.shape)));
      file.slots.push_back({static_cast<uint32_t>(request.tensors.size()),
                            Box::Whole(t.shape), std::nullopt});
      request.tensors.push_back(std::move(t));
      records.push_back(k);
    }
    if (file.slots.empty()) continue;
    request.files.push_back(std::move(file));
    job.plan_archive.push_back(a);
    job.slot_record.push_back(std::move(records));
  }
  request.processes = comm.size();
  SetWorkerResources(options, request);
  request.source_visibility = std::move(visibility);
  return comm.AllOk([&]() -> Status {
    FC_RETURN_IF_ERROR(CheckNeededFilesVisible(request, job.layout.source));
    FC_ASSIGN_OR_RETURN(job.plan, BuildPlan(std::move(request)));
    return Status::Ok();
  }());
}

uint64_t CopiedBytes(const DsJob& job) {
  uint64_t n = 0;
  for (const DsArchiveSpec& a : job.layout.archives) {
    for (const DsRecord& r : a.records) {
      if (r.kind == DsRecord::Kind::kCopy) n += r.bytes;
    }
  }
  return n;
}

void PrintPlan(const DsJob& job, const ConvertOptions& options, std::ostream& out) {
  if (options.json) {
    out << PlanJson(job.plan, job.layout.source, false) << "\n";
    return;
  }
  const DsRepartition& l = job.layout;
  const Plan& plan = job.plan;
  out << "deepspeed plan: " << l.variant << ", dp " << l.source_dp << " -> " << l.dp << ", "
      << l.mp << " model-parallel rank(s), tag " << l.tag << ": " << l.archives.size()
      << " archive(s), " << plan.tensors.size() << " partition(s) streamed, read "
      << HumanBytes(plan.bytes_needed) << ", write " << HumanBytes(plan.bytes_written) << ", "
      << plan.threads << " thread(s)\n";
  out << "memory: budget " << HumanBytes(plan.memory.budget) << ", estimated peak "
      << HumanBytes(plan.memory.peak) << ", minimum " << HumanBytes(plan.memory.minimum) << "\n";
  out << "also: " << HumanBytes(CopiedBytes(job)) << " of storages copied (module weights, "
      << "steps), " << l.copies.size() << " file(s) copied whole, then latest\n";
}

// Copies go in blocks of at most 16 MiB, or the budget when smaller.
uint64_t CopyBlock(const DsJob& job) {
  return std::min(kCopyBlock, std::max<uint64_t>(job.plan.memory.budget, 4096));
}

// One process's archives: those of the plan files assigned to it, and (process 0) the
// archives without streamed records.
class DsPart : public JobPart {
 public:
  DsPart(std::unique_ptr<DsArchiveWriter> writer, const DsJob& job,
         std::map<uint32_t, size_t> local)
      : writer_(std::move(writer)), job_(job), local_(std::move(local)) {}
  Status Write(uint32_t file, uint32_t slot, uint64_t byte_offset,
               std::span<const std::byte> bytes) override {
    auto it = local_.find(file);
    if (it == local_.end()) {
      return InternalError("archive plan file " + std::to_string(file) +
                           " is not this process's");
    }
    return writer_->Write(it->second, job_.slot_record[file][slot], byte_offset, bytes);
  }
  Result<std::string> Finish() override {
    FC_RETURN_IF_ERROR(writer_->Finish(CopyBlock(job_)));
    return std::string();
  }

 private:
  std::unique_ptr<DsArchiveWriter> writer_;
  const DsJob& job_;
  const std::map<uint32_t, size_t> local_;  // plan file -> the writer's archive
};

class DsOutputJob : public OutputJob {
 public:
  explicit DsOutputJob(const ConvertOptions& options) : options_(options) {}
  DsJob& job() { return job_; }

  const Plan& plan() const override { return job_.plan; }
  const CheckpointIndex& source() const override { return job_.layout.source; }
  void PrintPlan(std::ostream& out) const override { fc::PrintPlan(job_, options_, out); }
  Result<std::unique_ptr<JobPart>> CreatePart(const std::string& staging,
                                              const std::vector<uint32_t>& files,
                                              int process) const override {
    std::vector<DsArchiveSpec> archives;
    std::map<uint32_t, size_t> local;
    for (uint32_t f : files) {
      local[f] = archives.size();
      archives.push_back(job_.layout.archives[job_.plan_archive[f]]);
    }
    if (process == 0) {
      std::vector<bool> planned(job_.layout.archives.size(), false);
      for (size_t a : job_.plan_archive) planned[a] = true;
      for (size_t a = 0; a < planned.size(); ++a) {
        if (!planned[a]) archives.push_back(job_.layout.archives[a]);
      }
    }
    if (archives.empty()) return std::unique_ptr<JobPart>();
    FC_ASSIGN_OR_RETURN(std::unique_ptr<DsArchiveWriter> writer,
                        DsArchiveWriter::Create(staging, std::move(archives)));
    return std::unique_ptr<JobPart>(
        std::make_unique<DsPart>(std::move(writer), job_, std::move(local)));
  }
  // The files copied whole, then `latest` (a temporary file renamed onto it), then the
  // commit.
  Status Commit(JobPart*, std::span<const std::string>, OutputDir& output,
                const std::string& staging) const override {
    for (const auto& [from, to] : job_.layout.copies) {
      const std::string dst = JoinPath(staging, to);
      FC_RETURN_IF_ERROR(CreateDirectories(Dirname(dst)));
      FC_RETURN_IF_ERROR(CopyFileInBlocks(from, dst, CopyBlock(job_)).With(from));
    }
    const std::string tmp = JoinPath(staging, "latest.fc-tmp-" + std::to_string(::getpid()));
    FC_RETURN_IF_ERROR(WriteSmallFile(tmp, job_.layout.tag));
    FC_RETURN_IF_ERROR(RenameDurably(tmp, JoinPath(staging, "latest")).With("latest"));
    return output.Commit();
  }

 private:
  ConvertOptions options_;
  DsJob job_;
};

}  // namespace

Result<ConvertJob> PlanDeepSpeed(const ConvertOptions& options, const OutputFormat*,
                                 CheckpointIndex index, SharedInput& input, Communicator& comm) {
  auto out = std::make_unique<DsOutputJob>(options);
  DsJob& job = out->job();
  job.index = std::move(index);
  FC_RETURN_IF_ERROR(CheckSource(job.index, options.input));
  FC_RETURN_IF_ERROR(BuildJob(PlannedWith(options, comm), input, comm, job));
  ConvertSummary summary;
  summary.ranks = static_cast<uint64_t>(job.layout.dp);
  summary.chunks = job.layout.archives.size();
  summary.bytes_written = job.plan.bytes_written + CopiedBytes(job);
  summary.objects = job.layout.copies.size();
  return ConvertJob{std::move(out), summary};
}

}  // namespace fc
