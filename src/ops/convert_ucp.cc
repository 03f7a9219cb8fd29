// fc-convert --output-format ucp. Contract: src/ops/convert_ucp.h.
//
// The run is an export whose files hold one tensor each: the planner cuts every param file
// into write items under the budget, the executor assembles them from the source's pieces
// (ZeRO flat partitions, TP slices: every byte read once) and the UcpWriter puts them at
// their final place in the staging directory. Everything else (optimizer_state.pt, the
// model states, an int step) is small or copied in bounded blocks.
#include "src/ops/convert_ucp.h"

#include <unistd.h>

#include <algorithm>
#include <set>

#include <spdlog/spdlog.h>

#include "fc/exec/assemble.h"
#include "fc/exec/execute.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/open.h"
#include "fc/format/ucp_writer.h"
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

constexpr const char* kStates[] = {"fp32", "exp_avg", "exp_avg_sq"};
constexpr uint64_t kCopyBlock = uint64_t{16} << 20;

std::string Attr(const CheckpointIndex& index, const std::string& key) {
  auto it = index.attributes.find(key);
  return it == index.attributes.end() ? std::string() : it->second;
}

// The source tensor holding `state` of `param` (deepspeed.h names).
std::string SourceKey(const std::string& param, std::string_view state) {
  return state == "fp32" ? param : "optimizer." + std::string(state) + "." + param;
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
  if (!given.empty()) {
    return InvalidArgumentError("--output-format ucp writes every param whole, in fp32, as "
                                "DeepSpeed's loader expects: " + given.front() +
                                " does not apply");
  }
  if (o.comm != nullptr && o.comm->size() > 1) {
    return UnimplementedError("--output-format ucp is written by one process (not under mpirun)");
  }
  if (o.dry_run && o.simulate_processes > 0) {
    return UnimplementedError("--output-format ucp: --simulate-processes does not apply (one process)");
  }
  return Status::Ok();
}

// The tensors a param's file is made of: one global tensor, or (TP > 1 without
// universal_checkpoint_info, with inject_missing_state) the TP ranks' slices, concatenated
// along dim 0 in rank order.
struct UcpParam {
  std::string name;
  std::vector<const TensorEntry*> states[3];  // fp32, exp_avg, exp_avg_sq (kStates order)
  const TensorEntry* step = nullptr;          // TP rank 0's
};

// The roles: which params the UCP holds, refused with what is missing.
Result<std::vector<UcpParam>> UcpParams(const CheckpointIndex& index,
                                        const ConvertOptions& options) {
  const std::string& input = options.input;
  if (index.format != CheckpointFormat::kDeepSpeed) {
    return InvalidArgumentError(
        input + ": --output-format ucp needs each param's fp32 master weight, exp_avg, "
        "exp_avg_sq and step, which fc knows by name in DeepSpeed checkpoints (ZeRO 1/2/3, "
        "BF16_Optimizer, UCP: include/fc/format/deepspeed.h); a " +
        std::string(CheckpointFormatName(index.format)) +
        " checkpoint's optimizer-state names are not mapped to them");
  }
  const std::string optimizer = Attr(index, "deepspeed.optimizer");
  if (optimizer.empty() || optimizer == "none") {
    return InvalidArgumentError(input + ": no fp32 master weights (no optimizer files: stage 0 "
                                "or a weights-only copy); a Universal Checkpoint needs them");
  }
  if (!Attr(index, "deepspeed.moe").empty()) {
    return UnimplementedError(input + ": MoE checkpoint (deepspeed.moe): its optimizer states "
                              "are not read, so no UCP can be written");
  }
  if (const std::string u = Attr(index, "deepspeed.tp_unmerged"); !u.empty()) {
    return UnimplementedError(input + ": TP shards fc does not merge (averaged params): " + u);
  }
  const std::string tp_text = Attr(index, "deepspeed.tp_degree");
  const int64_t tp = tp_text.empty() ? 1 : std::stoll(tp_text);
  if (constexpr std::string_view kByRules = "tensor_parallel rules of ";
      Attr(index, "deepspeed.tp_merge").starts_with(kByRules)) {
    return UnimplementedError(input + ": TP shards merged by " +
                              Attr(index, "deepspeed.tp_merge").substr(kByRules.size()) +
                              ": a Universal Checkpoint records its merge as "
                              "universal_checkpoint_info patterns, which fc does not derive "
                              "from layout rules; leave out --source-layout");
  }
  const bool per_rank = tp > 1 && Attr(index, "deepspeed.tp_merge") != "universal_checkpoint_info";
  if (per_rank && !options.ucp_inject_missing_state) {
    return UnimplementedError(input + ": TP degree " + tp_text + " without "
                              "universal_checkpoint_info: nothing says how the TP shards "
                              "concatenate (--inject-missing-state concatenates every param "
                              "along dim 0, as ds_to_universal.py --inject_missing_state)");
  }
  auto rank_key = [&](int64_t r, const std::string& key) {
    return per_rank ? std::string("mp_rank_") + (r < 10 ? "0" : "") + std::to_string(r) + "." + key
                    : key;
  };
  std::vector<UcpParam> params;
  std::set<std::string> seen;
  const std::string prefix = rank_key(0, "optimizer.exp_avg.");
  for (const TensorEntry& t : index.tensors) {
    if (!t.key.starts_with(prefix)) continue;
    UcpParam param;
    param.name = t.key.substr(prefix.size());
    if (!seen.insert(param.name).second) continue;
    for (size_t s = 0; s < 3; ++s) {
      for (int64_t r = 0; r < (per_rank ? tp : 1); ++r) {
        const std::string key = rank_key(r, SourceKey(param.name, kStates[s]));
        const TensorEntry* e = index.FindTensor(key);
        if (e == nullptr) {
          return InvalidArgumentError(input + ": param '" + param.name + "' has exp_avg but no " +
                                      key + " (" + kStates[s] + ")");
        }
        if (e->dtype != DType::kFloat32) {
          return InvalidArgumentError(input + ": " + key + " is " +
                                      std::string(DTypeName(e->dtype)) +
                                      ", not float32: no fp32 master weights / Adam states");
        }
        param.states[s].push_back(e);
      }
    }
    param.step = index.FindTensor(rank_key(0, "optimizer.step." + param.name));
    params.push_back(std::move(param));
  }
  if (params.empty()) {
    return InvalidArgumentError(input + ": no optimizer.exp_avg.<param> tensors: no Adam "
                                "states, nothing a Universal Checkpoint holds");
  }
  return params;
}

// A step saved as a Python int (attribute deepspeed.step[.group<g>]): the one value, when
// every group has the same one.
Result<std::optional<int64_t>> IntStep(const CheckpointIndex& index) {
  std::set<std::string> values;
  for (const auto& [k, v] : index.attributes) {
    if (k == "deepspeed.step" || k.starts_with("deepspeed.step.group")) values.insert(v);
  }
  if (values.empty()) return std::optional<int64_t>();
  if (values.size() > 1) {
    return UnimplementedError("the param groups' steps differ (Python ints: " +
                              *values.begin() + ", " + *values.rbegin() +
                              ") and fc does not know each param's group");
  }
  return std::optional<int64_t>(std::stoll(*values.begin()));
}

struct UcpJob {
  CheckpointIndex index;
  std::vector<UcpParam> params;
  UcpSource source;
  std::vector<UcpFileSpec> specs;       // plan file i == specs[i]
  std::vector<std::string> int_steps;   // step.pt paths holding the int step
  std::optional<int64_t> int_step;
  Plan plan;
};

Status BuildJob(const ConvertOptions& options, UcpJob& job) {
  const CheckpointIndex& index = job.index;
  FC_ASSIGN_OR_RETURN(job.params, UcpParams(index, options));
  std::vector<std::string> names;
  for (const UcpParam& p : job.params) names.push_back(p.name);
  FC_ASSIGN_OR_RETURN(job.source, ReadUcpSource(options.input, index, names));
  FC_ASSIGN_OR_RETURN(job.int_step, IntStep(index));
  const bool zero3 = Attr(index, "deepspeed.optimizer") == "zero3";
  PlanRequest request;
  request.kind = PlanKind::kExport;
  // One file of one tensor: the slices side by side along dim 0.
  auto add = [&](const std::string& path, const std::vector<const TensorEntry*>& slices,
                 UcpFileMeta meta) -> Status {
    const TensorEntry& first = *slices.front();
    Shape shape = first.global_shape;
    std::vector<SourcePiece> pieces;
    int64_t at = 0;
    for (const TensorEntry* src : slices) {
      FC_RETURN_IF_ERROR(CheckSourceCoverage(*src));
      const Shape& s = src->global_shape;
      if (slices.size() > 1 &&
          (s.empty() || s.size() != shape.size() ||
           !std::equal(s.begin() + 1, s.end(), shape.begin() + 1))) {
        return InvalidArgumentError(path + ": TP slices " + first.key + " " +
                                    Box::Whole(first.global_shape).ToString() + " and " +
                                    src->key + " " + Box::Whole(s).ToString() +
                                    " do not concatenate along dim 0");
      }
      SourcePiece piece;
      piece.source = src;
      piece.src_box = Box::Whole(s);
      piece.dst_box = piece.src_box;
      if (!s.empty()) {
        piece.dst_box.global_offset[0] = at;
        at += s[0];
      }
      pieces.push_back(std::move(piece));
    }
    if (!shape.empty()) shape[0] = at;
    const uint32_t t = static_cast<uint32_t>(request.tensors.size());
    FC_RETURN_IF_ERROR(PiecesCover(path, pieces, Box::Whole(shape)));
    request.tensors.push_back({first.key, first.dtype, shape, std::move(pieces)});
    PlanSlot slot{t, Box::Whole(shape), std::nullopt};
    UcpFileSpec spec{path, first.dtype, shape, std::move(meta)};
    if (spec.meta.form == UcpFileForm::kRawTensor && shape.size() != 1 &&
        !path.ends_with("/step.pt")) {
      // The stage-3 form: the param flattened (row-major) into one dimension.
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      slot.flat_range = FlatRange{0, n};
      spec.shape = {n};
    }
    request.files.push_back({path, {slot}});
    job.specs.push_back(std::move(spec));
    return Status::Ok();
  };
  for (const UcpParam& p : job.params) {
    for (size_t s = 0; s < 3; ++s) {
      FC_RETURN_IF_ERROR(add("zero/" + p.name + "/" + kStates[s] + ".pt", p.states[s],
                             job.source.meta.at(p.name + "/" + kStates[s])));
    }
    if (zero3) continue;  // the stage-3 form has no step.pt
    if (p.step != nullptr) {
      UcpFileMeta raw;
      raw.form = UcpFileForm::kRawTensor;
      FC_RETURN_IF_ERROR(add("zero/" + p.name + "/step.pt", {p.step}, std::move(raw)));
    } else if (job.int_step) {
      job.int_steps.push_back("zero/" + p.name + "/step.pt");
    }
  }
  request.processes = 1;
  request.threads = WorkerThreads(options.threads);
  request.memory_budget =
      options.memory_budget ? options.memory_budget : PhysicalMemoryBytes() / 4;
  FC_RETURN_IF_ERROR(CheckNeededFilesVisible(request, index));
  FC_ASSIGN_OR_RETURN(job.plan, BuildPlan(std::move(request)));
  return Status::Ok();
}

void PrintPlan(const UcpJob& job, const ConvertOptions& options, std::ostream& out) {
  if (options.json) {
    out << PlanJson(job.plan, job.index, false) << "\n";
    return;
  }
  const Plan& plan = job.plan;
  out << "ucp plan: " << job.params.size() << " param(s) into " << plan.files.size()
      << " tensor file(s), read " << HumanBytes(plan.bytes_needed) << ", write "
      << HumanBytes(plan.bytes_written) << ", " << plan.threads << " thread(s)\n";
  out << "memory: budget " << HumanBytes(plan.memory.budget) << ", estimated peak "
      << HumanBytes(plan.memory.peak) << ", minimum " << HumanBytes(plan.memory.minimum) << "\n";
  out << "also: zero/optimizer_state.pt ("
      << (job.source.optimizer_state_copy.empty() ? "from rank 0's optimizer state"
                                                  : "copied")
      << "), " << job.int_steps.size() << " int step file(s), copied from " << job.source.dir
      << ": " << (job.source.copy_files.empty() ? std::string("nothing")
                                                : FirstNames(job.source.copy_files))
      << "\n";
}

Status CopyFile(const std::string& from, const std::string& to) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in, RandomAccessFile::Open(from));
  FC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, WritableFile::Create(to));
  std::vector<std::byte> block(static_cast<size_t>(std::min<uint64_t>(kCopyBlock, in->size())));
  for (uint64_t at = 0; at < in->size(); at += block.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), in->size() - at));
    std::span<std::byte> part(block.data(), n);
    FC_RETURN_IF_ERROR(in->ReadAt(at, part));
    FC_RETURN_IF_ERROR(out->Append(std::span<const std::byte>(part)));
  }
  FC_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

Status WriteSmallFile(const std::string& path, std::string_view bytes) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, WritableFile::Create(path));
  FC_RETURN_IF_ERROR(out->Append(bytes));
  FC_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

class UcpSink : public PlanSink {
 public:
  explicit UcpSink(UcpWriter& writer) : writer_(writer) {}
  Status Write(uint32_t file, uint32_t, uint64_t byte_offset,
               std::span<const std::byte> bytes) override {
    return writer_.Write(file, byte_offset, bytes);
  }

 private:
  UcpWriter& writer_;
};

// Everything into the staging directory.
Result<ExecuteStats> WriteStaging(const ConvertOptions& options, const UcpJob& job,
                                  const std::string& staging) {
  FC_ASSIGN_OR_RETURN(std::unique_ptr<UcpWriter> writer, UcpWriter::Create(staging, job.specs));
  ChunkReader reader(job.index);
  UcpSink sink(*writer);
  ExecuteOptions eo;
  eo.what = "converting";
  eo.progress = options.progress;
  FC_ASSIGN_OR_RETURN(ExecuteStats stats, Execute(job.plan, reader, sink, eo));
  FC_RETURN_IF_ERROR(writer->Finish());
  if (job.int_step) {
    PickleValue v;
    v.kind = PickleValue::Kind::kInt;
    v.int_value = *job.int_step;
    FC_ASSIGN_OR_RETURN(std::string archive, PlainValueArchive(v));
    for (const std::string& path : job.int_steps) {
      FC_RETURN_IF_ERROR(WriteSmallFile(JoinPath(staging, path), archive));
    }
  }
  FC_RETURN_IF_ERROR(CreateDirectories(JoinPath(staging, "zero")));
  const std::string osd = JoinPath(staging, "zero/optimizer_state.pt");
  if (!job.source.optimizer_state_copy.empty()) {
    FC_RETURN_IF_ERROR(CopyFile(job.source.optimizer_state_copy, osd));
  } else if (!job.source.optimizer_state_archive.empty()) {
    FC_RETURN_IF_ERROR(WriteSmallFile(osd, job.source.optimizer_state_archive));
  }
  for (const std::string& name : job.source.copy_files) {
    FC_RETURN_IF_ERROR(CopyFile(JoinPath(job.source.dir, name), JoinPath(staging, name)));
  }
  return stats;
}

// <parent>/latest_universal, replaced atomically (a temporary file renamed onto it).
Status WriteLatestUniversal(const std::string& output_dir) {
  const std::string out = StripTrailingSlashes(output_dir);
  std::string parent = Dirname(out);
  if (parent.empty()) parent = ".";
  const std::string tmp =
      JoinPath(parent, "latest_universal.fc-tmp-" + std::to_string(::getpid()));
  Status s = WriteSmallFile(tmp, Basename(out));
  if (s.ok()) s = RenameDurably(tmp, JoinPath(parent, "latest_universal"));
  if (!s.ok()) (void)RemoveAll(tmp);
  return s.With("latest_universal");
}

}  // namespace

Result<ConvertSummary> RunConvertUcp(const ConvertOptions& options, std::ostream& out) {
  RunStatsMeter meter;
  FC_RETURN_IF_ERROR(CheckOptions(options));
  auto job = std::make_unique<UcpJob>();
  FC_ASSIGN_OR_RETURN(job->index, OpenCheckpoint(options.input, OpenOptions{.format = options.format, .source_split = options.source_split}));
  FC_RETURN_IF_ERROR(BuildJob(options, *job));
  ConvertSummary summary;
  summary.ranks = 0;
  summary.chunks = job->specs.size() + job->int_steps.size();
  summary.bytes_written = job->plan.bytes_written;
  summary.objects = job->source.copy_files.size() + 1;  // model states + optimizer_state.pt
  if (options.dry_run) {
    if (!options.output_dir.empty()) {
      FC_RETURN_IF_ERROR(CheckOutputNotNested(options.output_dir, options.input));
      FC_RETURN_IF_ERROR(CheckOutputFree(StripTrailingSlashes(options.output_dir)));
    }
    PrintPlan(*job, options, out);
    return summary;
  }
  Communicator& comm = SingleProcessCommunicator();
  FC_ASSIGN_OR_RETURN(ClaimedOutput claimed,
                      ClaimOutput(options.output_dir, options.input, comm));
  FC_ASSIGN_OR_RETURN(ExecuteStats executed, WriteStaging(options, *job, claimed.staging));
  meter.InputsDone();
  FC_RETURN_IF_ERROR(claimed.dir->Commit());
  FC_RETURN_IF_ERROR(WriteLatestUniversal(options.output_dir));
  if (!options.stats_file.empty()) {
    FC_RETURN_IF_ERROR(WriteRunStats(options.stats_file, "fc-convert", job->plan.bytes_needed,
                                     meter.Finish(executed.peak_buffer_bytes, 0, 0), comm));
  }
  return summary;
}

}  // namespace fc
