// Opening a checkpoint of any supported format: detection from the directory contents, or
// a forced format. The single entry point tools use to get a CheckpointIndex.
#ifndef FC_FORMAT_OPEN_H_
#define FC_FORMAT_OPEN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <string>

#include "fc/core/status.h"
#include "fc/format/open_problems.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

// Detection rules (one table of input formats in open.cc: how each is recognised and
// opened), first match wins:
//   a file named *.safetensors                         -> safetensors
//   a directory with fc.metadata.json                  -> fc distcp
//   a directory with .metadata (torch DCP, Megatron torch_dist) -> torch DCP
//   a directory with *.safetensors.index.json or *.safetensors  -> safetensors
//   a directory with <id>.metadata                     -> Paddle FlexCheckpoint
//   a DeepSpeed save dir (latest -> tag dir) or tag dir (*_model_states.pt) -> deepspeed
//   a Megatron save dir (latest_checkpointed_iteration.txt -> iter dir) or iter dir
//   (mp_rank_*/model_optim_rng.pt)                     -> megatron-legacy
// Errors: kNotFound (path missing), kUnimplemented for recognised but unsupported layouts
// (other "*.pt" directories), kInvalidArgument
// when nothing is recognised (the message lists what was looked for).
Result<CheckpointFormat> DetectCheckpointFormat(const std::string& path);

// Detects (or uses `forced`) and reads the metadata of the checkpoint at `path`.
// `lenient` (fc-inspect --verify): the torch DCP, safetensors and fc distcp readers record
// what they can step over there instead of failing (fc/format/open_problems.h; each
// reader's header says what); Paddle, DeepSpeed and Megatron legacy
// open as without it.
Result<CheckpointIndex> OpenCheckpoint(const std::string& path,
                                       std::optional<CheckpointFormat> forced = std::nullopt,
                                       OpenProblems* lenient = nullptr);

// How the TP ranks of a checkpoint merge, as the user says it (--source-layout FILE: a layout
// file's tensor_parallel rules, fc/layout/layout_rules.h TensorParallelAxisOf): for each
// tensor's global name, the dim the ranks' pieces are concatenated along, or nullopt
// (replicated). Replaces the Megatron legacy reader's built-in table and DeepSpeed's
// universal_checkpoint_info (or its absence); the other formats refuse it
// (kInvalidArgument), since their files say how their tensors are split.
struct SourceSplit {
  std::function<std::optional<int64_t>(std::string_view name)> tp_axis;
  std::string origin;  // names it in messages: "--source-layout rules.json"
  explicit operator bool() const { return static_cast<bool>(tp_axis); }
};

// What the user says about the input beyond its path.
struct OpenOptions {
  std::optional<CheckpointFormat> format;  // forced; detected when unset
  OpenProblems* lenient = nullptr;         // as above
  SourceSplit source_split;
};
Result<CheckpointIndex> OpenCheckpoint(const std::string& path, const OpenOptions& options);

}  // namespace fc

#endif  // FC_FORMAT_OPEN_H_
