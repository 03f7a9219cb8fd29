// Opening a checkpoint of any supported format: detection from the directory contents, or
// a forced format. The single entry point tools use to get a CheckpointIndex.
#ifndef FC_FORMAT_OPEN_H_
#define FC_FORMAT_OPEN_H_

#include <optional>
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

}  // namespace fc

#endif  // FC_FORMAT_OPEN_H_
