#include "fc/ops/export.h"

#include <unistd.h>

#include <algorithm>
#include <regex>
#include <set>

#include <spdlog/spdlog.h>

#include "fc/core/checked_math.h"
#include "fc/core/flat_range.h"
#include "fc/exec/parallel.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/open.h"
#include "fc/format/safetensors.h"
#include "fc/io/file.h"
#include "fc/ops/report_format.h"
#include "fc/ops/targets.h"

namespace fc {

const std::vector<std::string> kDefaultOptimizerMarkers = {
    "optim.",      "optimizer.",  ".exp_avg",        ".exp_avg_sq",      ".fp32_param",
    ".moment1_0",  ".moment2_0",  ".w_0",            ".beta1_pow_acc_0", ".beta2_pow_acc_0",
    ".master_weight"};

namespace {

// One unit of work: a slab of one output tensor, contiguous in the output file.
struct SlabTask {
  size_t file;
  size_t tensor_in_file;
  const OutputTensor* tensor;
  DType dtype;
  Box region;
  uint64_t byte_offset;  // within the tensor's data
};

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
    FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, f->ReadAt(o.byte_offset, o.byte_length));
    const std::string name = SafeObjectFileName(o.key) +
                             (o.encoding == ObjectEncoding::kTorchSave ? ".pt" : ".bin");
    FC_ASSIGN_OR_RETURN(auto out, WritableFile::Create(JoinPath(dir, name)));
    FC_RETURN_IF_ERROR(out->Append(std::span<const std::byte>(bytes)));
    FC_RETURN_IF_ERROR(out->Close());
  }
  return Status::Ok();
}

class StagingDir {
 public:
  explicit StagingDir(std::string path) : path_(std::move(path)) {}
  ~StagingDir() {
    if (!committed_) (void)RemoveAll(path_);
  }
  const std::string& path() const { return path_; }
  void Committed() { committed_ = true; }

 private:
  std::string path_;
  bool committed_ = false;
};

}  // namespace

Result<ExportSummary> RunExport(const ExportOptions& options) {
  ExportSummary summary;
  FC_ASSIGN_OR_RETURN(CheckpointIndex index, OpenCheckpoint(options.input, options.format));
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
  std::vector<OutputTensor> outputs;
  for (OutputTensor& t : all) {
    if (!options.include_optimizer && IsOptimizerKey(t.name, markers)) {
      ++summary.skipped_optimizer;
      continue;
    }
    if (include && !std::regex_search(t.name, *include)) continue;
    if (exclude && std::regex_search(t.name, *exclude)) continue;
    if (options.dtype && IsFloating(t.dtype)) t.dtype = *options.dtype;
    outputs.push_back(std::move(t));
  }
  if (outputs.empty()) {
    return InvalidArgumentError(options.input + ": no tensors to export" +
                                (summary.skipped_optimizer
                                     ? " (optimizer states are left out; --include-optimizer)"
                                     : std::string(" (check --include/--exclude)")));
  }
  // Every source must be complete and every output fully covered before anything is written.
  std::set<const TensorEntry*> sources;
  for (const OutputTensor& t : outputs) {
    FC_RETURN_IF_ERROR(PiecesCover(t.name, t.pieces, Box::Whole(t.shape)));
    for (const SourcePiece& p : t.pieces) {
      if (p.source) sources.insert(p.source);
    }
  }
  for (const TensorEntry* s : sources) FC_RETURN_IF_ERROR(CheckSourceCoverage(*s));

  std::vector<std::pair<std::string, uint64_t>> tensor_bytes;
  for (const OutputTensor& t : outputs) {
    FC_ASSIGN_OR_RETURN(uint64_t bytes, CheckedByteSize(t.shape, DTypeSize(t.dtype)));
    tensor_bytes.emplace_back(t.name, bytes);
    summary.tensor_bytes += bytes;
  }
  FC_ASSIGN_OR_RETURN(HfShardAssignment shards,
                      AssignHfShards(tensor_bytes, options.max_shard_bytes));

  // Output directory: create it; refuse to mix with an earlier export.
  FC_RETURN_IF_ERROR(CreateDirectories(options.output_dir));
  FC_ASSIGN_OR_RETURN(std::vector<std::string> existing, ListDirectory(options.output_dir));
  for (const std::string& name : existing) {
    if ((name.rfind("model", 0) == 0 && name.find(".safetensors") != std::string::npos)) {
      return FailedPreconditionError(options.output_dir + " already holds " + name +
                                     "; remove the old export or choose another directory");
    }
  }
  if (!index.objects.empty()) {
    if (options.objects_dir.empty()) {
      summary.skipped_objects = index.objects.size();
      spdlog::info("skipping {} non-tensor object(s) (e.g. '{}'); --objects DIR dumps them",
                   index.objects.size(), index.objects.front().key);
    } else if (options.rank == 0) {
      FC_RETURN_IF_ERROR(DumpObjects(index, options.objects_dir).With("--objects"));
    }
  }

  StagingDir staging(JoinPath(options.output_dir, ".fc-export-" + std::to_string(getpid()) +
                                                      "-" + std::to_string(options.rank)));
  FC_RETURN_IF_ERROR(CreateDirectories(staging.path()));

  // Writers for this rank's files, and the slab tasks that fill them.
  const size_t num_files = shards.file_names.size();
  std::vector<std::vector<size_t>> file_tensors(num_files);
  for (size_t i = 0; i < outputs.size(); ++i) file_tensors[shards.tensor_file[i]].push_back(i);
  const int threads = WorkerThreads(options.threads);
  const uint64_t budget = options.memory_budget ? options.memory_budget : PhysicalMemoryBytes() / 4;
  // Per worker: the output slab plus up to two staging copies of a source block.
  const uint64_t per_worker = budget / static_cast<uint64_t>(threads) / 3;
  if (per_worker < 64) {
    return ResourceExhaustedError("--memory-budget " + std::to_string(budget) +
                                  " bytes is too small for " + std::to_string(threads) +
                                  " threads");
  }
  std::vector<std::unique_ptr<SafetensorsWriter>> writers(num_files);
  std::vector<SlabTask> tasks;
  uint64_t my_bytes = 0;
  for (size_t f = 0; f < num_files; ++f) {
    if (static_cast<int>(f % static_cast<size_t>(options.world)) != options.rank) continue;
    std::vector<SafetensorsTensorSpec> specs;
    for (size_t i : file_tensors[f]) specs.push_back({outputs[i].name, outputs[i].dtype, outputs[i].shape});
    SafetensorsWriteOptions wo;
    wo.atomic = false;
    FC_ASSIGN_OR_RETURN(writers[f],
                        SafetensorsWriter::Create(JoinPath(staging.path(), shards.file_names[f]),
                                                  std::move(specs), {{"format", "pt"}}, wo));
    for (size_t j = 0; j < file_tensors[f].size(); ++j) {
      const OutputTensor& t = outputs[file_tensors[f][j]];
      size_t widest = DTypeSize(t.dtype);
      for (const SourcePiece& p : t.pieces) {
        if (p.source) widest = std::max(widest, DTypeSize(p.source->dtype));
      }
      const int64_t max_elements =
          std::max<int64_t>(1, static_cast<int64_t>(per_worker / widest));
      for (Box& slab : ContiguousSlabs(Box::Whole(t.shape), max_elements)) {
        const int64_t first = slab.rank() ? Ravel(slab.global_offset, t.shape) : 0;
        const uint64_t offset = static_cast<uint64_t>(first) * DTypeSize(t.dtype);
        my_bytes += static_cast<uint64_t>(slab.num_elements()) * DTypeSize(t.dtype);
        tasks.push_back({f, j, &t, t.dtype, std::move(slab), offset});
      }
    }
  }

  Progress progress("exporting", my_bytes, options.progress);
  ChunkReader reader(index);
  // One output buffer per worker thread, reused across its slabs.
  std::vector<std::vector<std::byte>> buffers(static_cast<size_t>(threads));  // per worker
  Status status = ParallelFor(tasks.size(), threads, [&](size_t i, int worker) -> Status {
    std::vector<std::byte>& buffer = buffers[static_cast<size_t>(worker)];
    const SlabTask& task = tasks[i];
    buffer.resize(static_cast<size_t>(task.region.num_elements()) * DTypeSize(task.dtype));
    FC_RETURN_IF_ERROR(AssembleRegion(reader, task.tensor->name, task.tensor->pieces,
                                      task.region, task.dtype, buffer.data()));
    FC_RETURN_IF_ERROR(writers[task.file]->Write(task.tensor_in_file, task.byte_offset,
                                                 std::span<const std::byte>(buffer)));
    progress.Add(buffer.size());
    return Status::Ok();
  });
  for (size_t f = 0; f < num_files && status.ok(); ++f) {
    if (writers[f]) status = writers[f]->Finish();
  }
  progress.Finish(status.ok());
  if (options.barrier) {
    Status all = options.barrier(status);
    if (status.ok()) status = all;
  }
  FC_RETURN_IF_ERROR(status);

  // Commit: data files first, the index last, so a directory with an index is complete.
  for (size_t f = 0; f < num_files; ++f) {
    if (!writers[f]) continue;
    FC_RETURN_IF_ERROR(RenameDurably(JoinPath(staging.path(), shards.file_names[f]),
                                     JoinPath(options.output_dir, shards.file_names[f])));
  }
  if (options.barrier) FC_RETURN_IF_ERROR(options.barrier(Status::Ok()));
  summary.files = shards.file_names;
  if (num_files > 1 && options.rank == 0) {
    const std::string staged = JoinPath(staging.path(), std::string(kHfIndexFileName));
    FC_ASSIGN_OR_RETURN(auto out, WritableFile::Create(staged));
    FC_RETURN_IF_ERROR(out->Append(WriteHfIndexJson(tensor_bytes, shards)));
    FC_RETURN_IF_ERROR(out->Sync());
    FC_RETURN_IF_ERROR(out->Close());
    FC_RETURN_IF_ERROR(
        RenameDurably(staged, JoinPath(options.output_dir, std::string(kHfIndexFileName))));
    summary.files.push_back(std::string(kHfIndexFileName));
  }
  FC_RETURN_IF_ERROR(RemoveAll(staging.path()));
  staging.Committed();
  summary.tensors = outputs.size();
  return summary;
}

}  // namespace fc
