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
#include "src/ops/claim_output.h"
#include "src/ops/plan_report.h"
#include "src/ops/shared_input.h"

namespace fc {
namespace {

constexpr uint64_t kCopyBlock = uint64_t{16} << 20;

std::string Attr(const CheckpointIndex& index, const std::string& key) {
  auto it = index.attributes.find(key);
  return it == index.attributes.end() ? std::string() : it->second;
}

Status CheckOptions(const ConvertOptions& o) {
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
  if (o.comm != nullptr && o.comm->size() > 1) {
    return UnimplementedError("--output-format deepspeed is written by one process (not under "
                              "mpirun)");
  }
  if (o.dry_run && o.simulate_processes > 0) {
    return UnimplementedError("--output-format deepspeed: --simulate-processes does not apply "
                              "(one process)");
  }
  return Status::Ok();
}

// What the reader says about the source, refused before any file is laid out.
Status CheckSource(const CheckpointIndex& index, const std::string& input) {
  if (index.format != CheckpointFormat::kDeepSpeed) {
    return UnimplementedError(input + ": --output-format deepspeed re-partitions DeepSpeed "
                              "checkpoints only (input is " +
                              std::string(CheckpointFormatName(index.format)) + ")");
  }
  const std::string optimizer = Attr(index, "deepspeed.optimizer");
  if (optimizer == "universal") {
    return UnimplementedError(input + ": a Universal Checkpoint is loaded at any DP size "
                              "(load_universal); nothing to re-partition");
  }
  if (!Attr(index, "deepspeed.moe").empty() && optimizer == "not read (MoE)") {
    return UnimplementedError(input + ": MoE checkpoint whose optimizer files fc does not read "
                              "(deepspeed.moe): not re-partitioned (MoE: ZeRO 1/2 or BF16_Optimizer at one "
                              "model-parallel rank)");
  }
  return Status::Ok();
}

struct DsJob {
  CheckpointIndex index;  // the reader's (checks only)
  DsRepartition layout;
  std::vector<size_t> plan_archive;               // plan file -> archive
  std::vector<std::vector<size_t>> slot_record;   // plan file -> slot -> record
  Plan plan;
};

Status BuildJob(const ConvertOptions& options, DsJob& job) {
  FC_ASSIGN_OR_RETURN(job.layout, PlanDeepSpeedRepartition(options.input, options.degrees.dp));
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
  request.processes = 1;
  request.threads = WorkerThreads(options.threads);
  request.memory_budget =
      options.memory_budget ? options.memory_budget : PhysicalMemoryBytes() / 4;
  FC_RETURN_IF_ERROR(CheckNeededFilesVisible(request, job.layout.source));
  FC_ASSIGN_OR_RETURN(job.plan, BuildPlan(std::move(request)));
  return Status::Ok();
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

Status CopyFile(const std::string& from, const std::string& to, uint64_t block_bytes) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in, RandomAccessFile::Open(from));
  FC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, WritableFile::Create(to));
  std::vector<std::byte> block(
      static_cast<size_t>(std::max<uint64_t>(1, std::min<uint64_t>(block_bytes, in->size()))));
  for (uint64_t at = 0; at < in->size(); at += block.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), in->size() - at));
    std::span<std::byte> part(block.data(), n);
    FC_RETURN_IF_ERROR(in->ReadAt(at, part));
    FC_RETURN_IF_ERROR(out->Append(std::span<const std::byte>(part)));
  }
  FC_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

class DsSink : public PlanSink {
 public:
  DsSink(DsArchiveWriter& writer, const DsJob& job) : writer_(writer), job_(job) {}
  Status Write(uint32_t file, uint32_t slot, uint64_t byte_offset,
               std::span<const std::byte> bytes) override {
    return writer_.Write(job_.plan_archive[file], job_.slot_record[file][slot], byte_offset,
                         bytes);
  }

 private:
  DsArchiveWriter& writer_;
  const DsJob& job_;
};

Result<ExecuteStats> WriteStaging(const ConvertOptions& options, const DsJob& job,
                                  const std::string& staging) {
  const uint64_t block = std::min(kCopyBlock, std::max<uint64_t>(job.plan.memory.budget, 4096));
  FC_ASSIGN_OR_RETURN(std::unique_ptr<DsArchiveWriter> writer,
                      DsArchiveWriter::Create(staging, job.layout.archives));
  ChunkReader reader(job.layout.source);
  DsSink sink(*writer, job);
  ExecuteOptions eo;
  eo.what = "converting";
  eo.progress = options.progress;
  FC_ASSIGN_OR_RETURN(ExecuteStats stats, Execute(job.plan, reader, sink, eo));
  FC_RETURN_IF_ERROR(writer->Finish(block));
  for (const auto& [from, to] : job.layout.copies) {
    const std::string dst = JoinPath(staging, to);
    FC_RETURN_IF_ERROR(CreateDirectories(Dirname(dst)));
    FC_RETURN_IF_ERROR(CopyFile(from, dst, block).With(from));
  }
  // `latest` last: a temporary file renamed onto it.
  const std::string tmp = JoinPath(staging, "latest.fc-tmp-" + std::to_string(::getpid()));
  {
    FC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, WritableFile::Create(tmp));
    FC_RETURN_IF_ERROR(f->Append(job.layout.tag));
    FC_RETURN_IF_ERROR(f->Sync());
    FC_RETURN_IF_ERROR(f->Close());
  }
  FC_RETURN_IF_ERROR(RenameDurably(tmp, JoinPath(staging, "latest")).With("latest"));
  return stats;
}

}  // namespace

Result<ConvertSummary> RunConvertDeepSpeed(const ConvertOptions& options, std::ostream& out) {
  RunStatsMeter meter;
  FC_RETURN_IF_ERROR(CheckOptions(options));
  auto job = std::make_unique<DsJob>();
  FC_ASSIGN_OR_RETURN(job->index, OpenCheckpoint(options.input, options.format));
  FC_RETURN_IF_ERROR(CheckSource(job->index, options.input));
  FC_RETURN_IF_ERROR(BuildJob(options, *job));
  ConvertSummary summary;
  summary.ranks = static_cast<uint64_t>(job->layout.dp);
  summary.chunks = job->layout.archives.size();
  summary.bytes_written = job->plan.bytes_written + CopiedBytes(*job);
  summary.objects = job->layout.copies.size();
  if (options.dry_run) {
    FC_RETURN_IF_ERROR(CheckOutputClaimable(options.output_dir, options.input,
                                            SingleProcessCommunicator(), options.overwrite));
    PrintPlan(*job, options, out);
    return summary;
  }
  Communicator& comm = SingleProcessCommunicator();
  FC_ASSIGN_OR_RETURN(ClaimedOutput claimed,
                      ClaimOutput(options.output_dir, options.input, comm, options.overwrite));
  FC_ASSIGN_OR_RETURN(ExecuteStats executed, WriteStaging(options, *job, claimed.staging));
  meter.InputsDone();
  FC_RETURN_IF_ERROR(claimed.dir->Commit());
  if (!options.stats_file.empty()) {
    FC_RETURN_IF_ERROR(WriteRunStats(options.stats_file, "fc-convert", job->plan.bytes_needed,
                                     meter.Finish(executed.peak_buffer_bytes, 0, 0), comm));
  }
  return summary;
}

}  // namespace fc
