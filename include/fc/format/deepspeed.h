// Reading DeepSpeed checkpoint directories (DeepSpeedEngine.save_checkpoint), without
// DeepSpeed and without running any pickle (shared/reference/deepspeed.md).
//
// Input: the save dir (its `latest` file names the tag directory to read) or a tag dir
// itself (pass <save_dir>/<tag> to read a tag other than `latest`). Files read, all
// torch.save zip archives (fc/format/torch_save.h):
//   ZeRO 0/1/2 and BF16_Optimizer:
//     mp_rank_XX_model_states.pt                           one per TP rank XX
//     [bf16_|fp16_]zero_pp_rank_N_mp_rank_XX_optim_states.pt one per (DP rank N, TP rank XX)
//   ZeRO 3:
//     [bf16_|fp16_]zero_pp_rank_N_mp_rank_XX_model_states.pt + ..._optim_states.pt
// Stage detection (deepspeed.md section 6): `fp32_flat_groups` in the optimizer state ->
// ZeRO-3; `zero_stage` (ZeroStageEnum 1/2) -> ZeRO-1/2; neither but
// `single_partition_of_fp32_groups` -> BF16_Optimizer (padded partitions, stage-1 layout).
// Without optimizer files (stage 0, or weights-only copies) only the module weights exist.
//
// Tensor names in the index (with TP degree > 1 every name is prefixed "mp_rank_XX."):
//   <param>                     best full weight: the fp32 master weight of a trainable
//                               param (ZeRO flat partitions, in param_shapes order); for
//                               frozen params the frozen_param_fragments tensor; buffers and
//                               other module tensors as saved (16-bit); tied aliases
//                               (`shared_params` alias -> owner) get the owner's chunks.
//                               Without optimizer files: the module tensors.
//   module.<name>               every non-empty tensor of the model states' `module` (the
//                               16-bit weights; ZeRO-3: buffers only, params are placeholders)
//   optimizer.exp_avg.<param>   Adam first moment, master dtype, shape of the param
//   optimizer.exp_avg_sq.<param>  Adam second moment
//   optimizer.step.<param>      the param group's step (0-d tensor, one per param, all
//                               pointing at the step tensor of DP rank 0); a step saved as a
//                               Python int becomes the attribute deepspeed.step.group<g>.
// Every chunk addresses the bytes in place: a flat partition contributes flattened-range
// chunks (Chunk::flat_range over the param's row-major flattening) of the params it covers;
// padding is never addressed.
//
// Attributes: deepspeed.tag, deepspeed.zero_stage (0-3), deepspeed.optimizer
// (zero | bf16_optimizer | zero3 | none), deepspeed.dp_degree, deepspeed.tp_degree,
// deepspeed.pp_degree, deepspeed.ds_version, deepspeed.module_dtype, deepspeed.master_dtype,
// deepspeed.universal_checkpoint_info (present|absent), deepspeed.opaque_globals (pickle
// globals outside the allow-list, kept as opaque objects: this is the warning).
//
// Pickle globals are interpreted through an allow-list, as plain data (torch tensor rebuild
// functions and storages, torch.Size, collections.OrderedDict, builtins set/frozenset,
// ZeroStageEnum -> int, LossScaler / DynamicLossScaler, fragment_address, SubparamShape,
// argparse.Namespace, numpy RNG state); nothing is ever executed. Other globals are kept
// opaque and listed in deepspeed.opaque_globals; they never make the read fail.
//
// Not read (kUnimplemented, exit 6): pipeline layer files (layer_XX-model_YY-...) and
// pp_degree > 1, MoE expert files and per-group partition counts, elastic optimizer state,
// legacy (non-zip) torch.save files, universal checkpoints (UCP), AutoEP/MiCS/hpZ layouts.
// TP shards are not merged (the index keeps one set of names per TP rank, and
// universal_checkpoint_info merge rules are not applied). Checked on read: file count ==
// partition_count, every partition's size against the padding rule, param_slice_mappings
// against the partition math, each tensor covered exactly once.
// Errors: kNotFound (no tag dir, missing files), kDataLoss (file counts, sizes or offsets
// that disagree, truncated archives; the message names the file and tensor).
//
// Thread-safety: pure functions.
#ifndef FC_FORMAT_DEEPSPEED_H_
#define FC_FORMAT_DEEPSPEED_H_

#include <string>
#include <string_view>

#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

// True when `dir` looks like a DeepSpeed save dir (a `latest` file naming a tag dir holding
// *_model_states.pt) or a tag dir (holding *_model_states.pt / *_optim_states.pt).
bool IsDeepSpeedCheckpointDir(const std::string& dir);

Result<CheckpointIndex> ReadDeepSpeedCheckpoint(const std::string& path);

// Which weights an export writes under the plain parameter names.
enum class DeepSpeedWeights {
  kFp32,    // the fp32 master weights (the index's <param> names); default
  kModule,  // the 16-bit module weights (module.<name>, renamed to <name>)
};
// "fp32" | "module". Errors: kInvalidArgument.
Result<DeepSpeedWeights> ParseDeepSpeedWeights(std::string_view name);

// Rewrites a DeepSpeed index for export: drops module.<name> (kFp32), or replaces <name> by
// module.<name> wherever the latter exists (kModule; ZeRO-3 params, which the model states
// hold only as placeholders, stay fp32). Optimizer names are kept. Tied aliases are written
// as separate copies (safetensors has no sharing).
// Errors: kUnimplemented when the TP degree is > 1 (shards are not merged; merging needs
// universal_checkpoint_info rules that fc does not apply yet); kInvalidArgument when the
// index is not a DeepSpeed one.
Status SelectDeepSpeedWeights(DeepSpeedWeights weights, CheckpointIndex* index);

}  // namespace fc

#endif  // FC_FORMAT_DEEPSPEED_H_
