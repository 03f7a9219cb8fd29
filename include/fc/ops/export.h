// fc-export's library entry point: full (unsharded) tensors of any checkpoint fc reads,
// written as HuggingFace safetensors (model.safetensors, or model-0000i-of-0000N.safetensors
// + model.safetensors.index.json), streamed under a memory budget.
#ifndef FC_OPS_EXPORT_H_
#define FC_OPS_EXPORT_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "fc/comm/communicator.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/format/open.h"
#include "fc/exec/progress.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

struct ExportOptions {
  std::string input;                       // checkpoint directory or file
  std::optional<CheckpointFormat> format;  // forced input format
  SourceSplit source_split;  // --source-layout (fc/format/open.h)
  std::string output_dir;                  // must not exist, or be an empty directory
  // --overwrite: output_dir may hold a checkpoint, replaced once the new output is complete
  // (fc/io/output_dir.h; src/ops/claim_output.h CheckReplaceable).
  bool overwrite = false;
  std::string aoa_file;                    // AOA program (outputs = leaves of the program)
  // --hf-family NAME: the AOA program generated from the checkpoint and copy_from/config.json
  // (fc/ops/hf_family.h); not with aoa_file.
  std::string hf_family;
  std::optional<DType> dtype;              // cast floating-point tensors to this type
  uint64_t max_shard_bytes = 5'000'000'000;  // HF "5GB"
  std::vector<std::string> include;        // globs (fc/core/glob.h): keep only names matching one
  std::vector<std::string> exclude;        // globs: drop names matching any
  bool include_optimizer = false;          // optimizer states are left out by default
  std::vector<std::string> optimizer_markers;  // empty: kDefaultOptimizerMarkers
                                               // (fc/format/optimizer_names.h)
  uint64_t memory_budget = 0;              // bytes; 0: a quarter of physical memory
  int threads = 0;                         // 0: hardware concurrency (at most 8)
  std::string objects_dir;                 // dump non-tensor objects here (else skipped)
  // Copy the small non-tensor files of this directory (config.json, tokenizer files, ...;
  // see CopyFromFiles) into OUT with the export. Empty: none.
  std::string copy_from;
  // DeepSpeed and Megatron legacy input only: "fp32" (DeepSpeed's default: fp32 master
  // weights where the optimizer files hold them) or "module" (the 16-bit module weights).
  // See fc/format/weights.h.
  std::string weights;
  Progress::Mode progress = Progress::Mode::kAuto;
  bool dry_run = false;                    // plan only: print it to `out`, write nothing
  bool json = false;                       // the dry-run plan as JSON (fc-plan(5))
  std::string stats_file;                  // --stats: measured figures as JSON after the run
  // Multi-process runs (mpirun): every process calls RunExport with the same options and
  // its communicator; each writes whole output files (shared out by bytes, BalanceByBytes),
  // and process 0 writes the index once every file is in place. Every process returns the
  // same status. nullptr: one process.
  Communicator* comm = nullptr;
};

// --copy-from: the files of `dir` (top level only, sorted) that go into OUT with an export:
// regular files (or symlinks to them) of at most kMaxCopyFromBytes that are not tensor data
// or indexes (*.safetensors, *.bin, *.pt, *.pth, *.distcp, *.index.json, .metadata,
// *.metadata, fc.metadata.json), not hidden and not named like an export output. Larger
// files are skipped with a note. Errors: kNotFound / kInvalidArgument when `dir` is not a
// directory; kInvalidArgument for a symlink resolving outside `dir` unless
// IoPolicy::follow_symlinks (--follow-symlinks), naming the file.
inline constexpr uint64_t kMaxCopyFromBytes = 64ull << 20;
Result<std::vector<std::string>> CopyFromFiles(const std::string& dir);
// Collective: CopyFromFiles(dir) listed by process 0 (process 0 copies them), the others get
// an empty list; the outcome agreed. Empty `dir`: none.
Result<std::vector<std::string>> ListCopyFromOnProcess0(const std::string& dir,
                                                        Communicator& comm);

struct ExportSummary {
  std::vector<std::string> files;  // written, in order (index last when present)
  uint64_t tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t skipped_objects = 0;
  uint64_t skipped_optimizer = 0;
  uint64_t dropped_by_aoa = 0;       // source tensors no output reads (an AOA program's)
  std::vector<std::string> copied;   // --copy-from files, by name
};

// Runs the export. output_dir holds nothing or the complete export: it is claimed with
// OutputDir (fc/io/output_dir.h: lock, staging directory next to it, one rename at the
// end, index included). Errors: those of opening the input; kNotFound for a missing source
// chunk or an AOA name that does not exist; kInvalidArgument for bad options and for an
// output_dir that is, lies inside or contains the input; kFailedPrecondition when the output
// exists and is not empty, or another run holds its lock; kIoError for write failures (disk
// full, not writable) and after a signal (RequestCancel).
Result<ExportSummary> RunExport(const ExportOptions& options, std::ostream& out);

}  // namespace fc

#endif  // FC_OPS_EXPORT_H_
