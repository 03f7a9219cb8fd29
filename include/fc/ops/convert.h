// fc-convert's library entry point: reshard a checkpoint into another parallel layout
// (optionally through an AOA program) and write it as fc distcp or PyTorch DCP.
#ifndef FC_OPS_CONVERT_H_
#define FC_OPS_CONVERT_H_

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
#include "fc/layout/layout_rules.h"

namespace fc {

struct ConvertOptions {
  std::string input;
  std::optional<CheckpointFormat> format;      // forced input format
  SourceSplit source_split;  // --source-layout (fc/format/open.h)
  std::string output_dir;                      // must not exist, or be an empty directory
  // --overwrite: output_dir may hold a checkpoint, replaced once the new output is complete
  // (fc/io/output_dir.h; src/ops/claim_output.h CheckReplaceable).
  bool overwrite = false;
  // Exactly one target: an existing checkpoint, a rules file, a preset, or a manifest.
  std::string target_like;
  std::string target_layout_file;
  std::string preset;
  ParallelDegrees degrees;                     // with preset; kDeepSpeed: dp is the new DP size
  std::string target_manifest;
  std::string emit_manifest;                   // write the resolved per-rank chunk list here
  std::string aoa_file;                        // structure changes (convert mode)
  // --hf-family NAME: instead of aoa_file, the program fc-export --hf-family generates
  // (fc/ops/hf_family.h) from the checkpoint's facts and copy_from/config.json.
  std::string hf_family;
  // --from-hf-family NAME: the reverse, an HF checkpoint of that family -> Megatron-Core GPT
  // (fc/ops/hf_family.h HfFamilyReverseProgram): config.json from the input directory, the
  // target's vocabulary rows, norm names and key form from --target-like when given; with
  // torch-dcp output and a --target-like holding Megatron's metadata.json / common.pt, those
  // are copied into OUT (dist_checkpointing.load reads them).
  std::string from_hf_family;
  // --copy-from DIR: DIR's config.json, tokenizer files and other small non-tensor files
  // (CopyFromFiles, fc/ops/export.h) are copied into OUT (fc and torch-dcp output).
  std::string copy_from;
  // Target tensors kept: globs (fc/core/glob.h) on target names. A tensor left out is in
  // no rank of the output (nor in --emit-manifest).
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  std::optional<DType> dtype;                  // cast floating-point target tensors to this
  // A name from the output table (fc/format/output_format.h): "fc", "torch-dcp" (the
  // target's files), "ucp" (a DeepSpeed Universal Checkpoint from a DeepSpeed checkpoint,
  // src/ops/convert_ucp.h; no target: every param whole) or "deepspeed" (the DeepSpeed
  // checkpoint re-partitioned for data-parallel size degrees.dp, src/ops/convert_deepspeed.h;
  // no target).
  std::string output_format = "fc";
  std::string torch_version;  // "1.13", "2.0" (2.0-2.3) or "2" (2.4+); empty: like a torch source, else 2
  // torch DCP output with torch_version 2: "safetensors" writes the SAFETENSORS serialization
  // (fc/format/torch_dcp_writer.h); empty or "torch-save": one torch.save archive per chunk.
  std::string torch_serialization;
  // kUcp: TP > 1 without universal_checkpoint_info: concatenate every param's TP slices
  // along dim 0 (ds_to_universal.py --inject_missing_state) instead of refusing.
  bool ucp_inject_missing_state = false;
  // kUcp from a source DeepSpeed did not write: the ZeRO-3 form (raw flat param files, no
  // step.pt, zero_pp_rank_0_mp_rank_00_model_states.pt; SynthesizedUcpSource).
  bool ucp_zero3 = false;
  // kUcp from a source without Adam states: every floating-point tensor a param with zero
  // moments and step 0 (a fresh optimizer, as DeepSpeed's hf_to_universal.py writes).
  bool ucp_fresh_optimizer = false;
  // kUcp from a source that keeps no Adam step (PaddlePaddle: beta1/beta2 power accumulators
  // only; Megatron torch_dist without its common.pt): the step every param's step.pt gets.
  // Refused for a source that stores one.
  std::optional<int64_t> ucp_step;
  bool dry_run = false;                        // print the plan, write nothing
  // With dry_run: plan for this many processes without starting them (0: the real count);
  // each sees the files of its source ranks (rank of a file: the first number in its name,
  // modulo the processes), or every file when simulate_shared.
  int simulate_processes = 0;
  bool simulate_shared = false;
  bool json = false;                           // dry-run plan as JSON
  std::string stats_file;                      // --stats: measured figures as JSON after the run
  uint64_t memory_budget = 0;                  // 0: a quarter of physical memory
  int threads = 0;
  Progress::Mode progress = Progress::Mode::kAuto;
  // Multi-process runs (mpirun): every process calls RunConvert with the same options and
  // its communicator; each writes a share of the target files (balanced by bytes) into one
  // staging directory, and process 0 commits it. nullptr: one process.
  Communicator* comm = nullptr;
};

struct ConvertSummary {
  uint64_t ranks = 0;
  uint64_t chunks = 0;
  uint64_t bytes_written = 0;
  uint64_t objects = 0;
  uint64_t dropped = 0;  // source tensors the output does not carry (not counting --exclude)
};

// Plans, then (unless dry_run) writes. The plan (or its JSON) goes to `out` (process 0).
// With a communicator of several processes, every call is collective and every process
// returns the same status (a failure is reported as "rank R: ...").
// Errors: those of opening the input and target; kInvalidArgument for inconsistent targets
// (shape mismatch, dtype change without a cast) and bad options; kNotFound for a target
// tensor with no source or a source missing a chunk; kInvalidArgument also for an
// output_dir that is, lies inside or contains the input; kFailedPrecondition when the
// output exists and is not empty or another run holds its lock; kIoError for write failures
// and after a signal. A failed run leaves no output directory (OutputDir,
// fc/io/output_dir.h: a staging directory renamed at the end).
Result<ConvertSummary> RunConvert(const ConvertOptions& options, std::ostream& out);

}  // namespace fc

#endif  // FC_OPS_CONVERT_H_
