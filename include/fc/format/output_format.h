// The formats fc writes, in one table (src/format/output_format.cc), as open.h's detection
// table is the one list of formats it reads. fc-convert's --output-format names and help
// come from it, and RunConvert takes its planner from the entry's shape; every shape runs
// through the one job path (src/ops/job.h): the plan (fc/plan/plan.h) assigns its files to
// processes (mpirun), each process writes its files as the executor streams their bytes,
// and process 0 adds what else the output holds and commits the directory.
//
// Three shapes of output:
//   kTargetFiles  one data file per rank of a TargetLayout (fc distcp, PyTorch DCP): a
//                 format that writes a target layout's files plugs its TargetFilesWriter in
//                 here, and the planner and executor stay as they are.
//   kDeepSpeed*   a DeepSpeed checkpoint restructured (a Universal Checkpoint, or the ZeRO
//                 files re-partitioned for another data-parallel size): no target layout;
//                 the files' structure follows the DeepSpeed input (fc/format/ucp_writer.h,
//                 fc/format/deepspeed_writer.h, planned by src/ops/convert_ucp.cc and
//                 src/ops/convert_deepspeed.cc).
// (fc-export's output, HF safetensors shards, is another kind of target, with its own file
// plan: fc/format/safetensors.h.)
#ifndef FC_FORMAT_OUTPUT_FORMAT_H_
#define FC_FORMAT_OUTPUT_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/status.h"
#include "fc/format/fc_distcp.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

// One process's part of a kTargetFiles output: the plan files it was given (indices into
// FcDistcpPlan::files), written into the staging directory every process shares. Writes may
// come from several threads at once (distinct ranges). Destroyed before FinishDataFiles
// succeeded, it removes its files; after that it leaves them for the committing process.
class TargetFilesWriter {
 public:
  virtual ~TargetFilesWriter() = default;
  // `bytes` at `byte_offset` (from the chunk's first stored element) of chunk `chunk` of
  // plan file `file`. kInvalidArgument for a file this part does not write, a range out of
  // bounds or bytes written twice; kIoError.
  virtual Status WriteChunk(size_t file, size_t chunk, uint64_t byte_offset,
                            std::span<const std::byte> bytes) = 0;
  // The whole of object `object` of plan file 0.
  virtual Status WriteObject(size_t object, std::span<const std::byte> bytes) = 0;
  // Completes, syncs and closes this part's files (kFailedPrecondition naming the first
  // missing byte range). Returns what the committing process needs from this part as bytes
  // (fc distcp: the chunk checksums; empty where the format needs nothing).
  virtual Result<std::string> FinishDataFiles() = 0;
  // Process 0 only, after every part's FinishDataFiles: `parts` holds every process's
  // result (any order; empty for a process without files). Writes the metadata file and
  // renames the staging directory to the output directory.
  virtual Status Commit(std::span<const std::string> parts) = 0;
};

// The user's choices for the output beyond its format.
struct OutputSettings {
  // torch-dcp: "1.13", "2.0" (torch 2.0-2.3) or "2" (2.4+); empty: the source's generation
  // (`source_torch_generation`, a torch DCP input's "torch_generation" attribute), else "2".
  std::string torch_version;
  std::string source_torch_generation;
  // torch-dcp with version 2: "safetensors" or "torch-save" (empty: torch-save).
  std::string torch_serialization;
  // fc distcp: bytes of slabs written ahead of the bytes before them in their chunk (several
  // workers on one chunk) that a part may keep to hash each chunk as it is written
  // (FcDistcpWriterOptions::reorder_limit); past it a chunk is hashed from the file at the
  // end. fc-convert gives ReorderAllowance (fc/plan/plan.h), as the executor gives the
  // reader.
  uint64_t reorder_bytes = 0;
};

enum class OutputShape { kTargetFiles, kDeepSpeedUniversal, kDeepSpeedRepartitioned };

struct OutputFormat {
  std::string_view name;     // --output-format NAME
  std::string_view summary;  // one line: what it writes
  OutputShape shape;

  // kTargetFiles only (null otherwise).
  // The data file of target rank `rank`.
  std::string (*file_name)(int64_t rank) = nullptr;
  // Whether an object of this encoding can be stored (one that cannot is left out, with a
  // warning naming it).
  bool (*stores_object)(ObjectEncoding encoding) = nullptr;
  // Settings and the whole plan checked as the writer would, before any output exists, so
  // that --dry-run refuses what the run would, with the same message (kInvalidArgument).
  Status (*check)(const FcDistcpPlan& plan, const OutputSettings& settings) = nullptr;
  // This process's part: `files` of `plan` into `staging_dir` (from CreateStagingDir, shared
  // by every process), to be renamed to `out_dir` by the commit.
  Result<std::unique_ptr<TargetFilesWriter>> (*create)(const std::string& out_dir,
                                                       const FcDistcpPlan& plan,
                                                       std::vector<size_t> files,
                                                       const std::string& staging_dir,
                                                       const OutputSettings& settings) = nullptr;
};

// Every output format, the default (fc distcp) first.
std::span<const OutputFormat> OutputFormats();

// The entry named `name`. kInvalidArgument listing the names for an unknown one.
Result<const OutputFormat*> FindOutputFormat(std::string_view name);

// "fc, torch-dcp, ucp, deepspeed": the names, for help texts and messages.
std::string OutputFormatNames();

}  // namespace fc

#endif  // FC_FORMAT_OUTPUT_FORMAT_H_
