// Reading DeepSpeed checkpoint directories (DeepSpeedEngine.save_checkpoint), without
// DeepSpeed and without running any pickle (shared/reference/deepspeed.md).
//
// Input: the save dir (its `latest` file names the tag directory to read; without `latest`,
// its `latest_universal` names a Universal Checkpoint) or a tag / UCP dir itself (pass
// <save_dir>/<tag> to read another tag). Files read: torch.save zip archives
// (fc/format/torch_save.h) or legacy torch.save files (checkpoint_serialization: false: five
// pickles back to back, the last the storage key list, then per storage its int64 element
// count and raw bytes; storages are addressed in place the same way):
//   ZeRO 0/1/2 and BF16_Optimizer:
//     mp_rank_XX_model_states.pt                           one per model-parallel rank XX
//     [bf16_|fp16_]zero_pp_rank_N_mp_rank_XX_optim_states.pt one per (DP rank N, rank XX)
//   ZeRO 3:
//     [bf16_|fp16_]zero_pp_rank_N_mp_rank_XX_model_states.pt + ..._optim_states.pt
//   Pipeline (PipelineModule): mp_rank_XX_model_states.pt with `module` None, and per layer
//     layer_LL-model_YY-model_states.pt (or layer_LL-model_states.pt: a topology without a
//     model axis) holding layer LL's state dict for TP rank YY.
//   MoE (DeepSpeedEngine._save_moe_checkpoint): layer_L_expert_E_mp_rank_XX_model_states.pt,
//     one expert's 16-bit weights under their full names (global expert id E), beside the
//     non-expert module of mp_rank_XX_model_states.pt (no param_shapes). With ZeRO 1/2 or
//     BF16_Optimizer, one model-parallel rank and no pipeline, the zero_pp_rank_R files are
//     read too: dense param
//     groups cut over all DP ranks, expert groups (ep_size_<E>, moe True) over the rank's
//     expert-data-parallel group (partition_count per group); rank R is expert-parallel rank
//     R % E, or R / (dp / E) with ds_config use_data_before_expert_parallelism; params named
//     by param_slice_mappings (required; local expert k of expert-parallel rank e is global
//     expert e * experts / E + k), shapes from the module and expert files. Attributes
//     deepspeed.moe, deepspeed.ep_degree, deepspeed.moe_topology. Other MoE optimizers
//     (ZeRO-3, TP / pipeline with MoE, the non-ZeRO expp_rank_* files) are
//     not read: deepspeed.optimizer "not read (MoE)", and an fp32 export is refused.
//   Universal Checkpoint (ds_to_universal.py): zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt,
//     zero/optimizer_state.pt and the copied model states (frozen params, buffers, module).
// Stage detection (deepspeed.md section 6): `fp32_flat_groups` in the optimizer state ->
// ZeRO-3; `zero_stage` (ZeroStageEnum 1/2) -> ZeRO-1/2; neither but
// `single_partition_of_fp32_groups` -> BF16_Optimizer (padded partitions, stage-1 layout).
// Without optimizer files (stage 0, or weights-only copies) only the module weights exist.
//
// Degrees: with layer files, TP = the number of their TP ranks YY; otherwise
// checkpoint_parallel_dimensions (when saved), else TP = the number of mp_rank ranks. The
// mp_rank files of a pipeline are stage-major: XX = stage * TP + TP rank.
//
// Tensor names in the index:
//   <param>                     best full weight: the fp32 master weight of a trainable
//                               param (ZeRO flat partitions, in param_shapes order; UCP:
//                               zero/<param>/fp32.pt); for frozen params the
//                               frozen_param_fragments tensor; buffers and other module
//                               tensors as saved (16-bit); tied aliases (`shared_params`
//                               alias -> owner) get the owner's chunks. Without optimizer
//                               files: the module tensors.
//   module.<name>               every non-empty tensor of the model states' `module` (the
//                               16-bit weights; ZeRO-3: buffers only, params are
//                               placeholders); pipeline: the layer files' tensors, named as
//                               PipelineModule names them, "<layer>.<local name>", or
//                               "tied_modules.<key>.<local name>" for a tied module's layer
//                               (the one param of the optimizer state with that ending)
//   optimizer.exp_avg.<param>   Adam first moment, master dtype, shape of the param
//   optimizer.exp_avg_sq.<param>  Adam second moment
//   optimizer.step.<param>      the param group's step (0-d tensor, one per param, all
//                               pointing at the step tensor of DP rank 0; UCP: step.pt); a
//                               step saved as a Python int becomes the attribute
//                               deepspeed.step.group<g> (UCP: deepspeed.step).
// Pipeline stages: names are the union over the stages; a param held by several stages (a
// tied module, DeepSpeed's pipeline_replicated_parameter_patterns) is read from the first
// stage holding it (the other copies are not compared), as ds_to_universal does.
//
// TP > 1: with `universal_checkpoint_info` in the model states (of mp_rank 0), every tensor
// is ONE global tensor merged by deepspeed.md 5.5's rules (patterns are Python regexes,
// re.match, run by RE2): tp_replicated_parameter_patterns -> TP rank 0's copy, once every
// other TP copy of what fc exports (the fp32 master, read through its flat-partition
// chunks; the 16-bit module weight; exp_avg, exp_avg_sq) is found equal to it element by
// element (torch.equal: equal bytes, or +0 and -0), read in pieces of
// DeepSpeedReadOptions::replica_piece_bytes; copies that differ are kDataLoss naming the
// tensor, the TP ranks, the first differing element, both values and their files
// (ds_to_universal's merge_tp_slices asserts the same); parameter_with_2_sub_params_cat_dim_0
// -> the first halves of every rank's slice, then the second halves (torch.chunk(2, dim 0));
// parameter_with_sub_params (fused params, e.g. QKV: SubparamShape(patterns, shape,
// partition_dim), shape holding the sub-param sizes at partition_dim) -> each rank's slice
// is its piece of every sub-param in order along partition_dim, the merged tensor per
// sub-param all ranks' pieces in rank order; the per-rank widths come from
// sub_param_shard_widths[matched pattern][sub-param][TP rank] (universal_checkpoint_version
// >= 0.4: uneven, GQA), before 0.4 from an even split (a count of equal sub-params at
// partition_dim is allowed); a -1 in shape is what the element count leaves; the slice must
// be the sub-param view itself (same rank and sizes; another view of the same elements is
// kUnimplemented); parameter_with_row_parallelism_patterns -> concatenation along dim 1;
// anything else -> along dim 0; then vocabulary_parameter_patterns -> rows cut to
// original_vocab_size. A merge only places each rank's chunks at their offset in the global
// tensor (no data is copied): a piece along dim 0 keeps its chunk's form, a piece along
// another dim becomes a strided chunk (a flattened range first split into its row-major
// blocks); the step is TP rank 0's (not compared, as in ds_to_universal). Params matching
// parameter_to_average_patterns (a mean fc
// does not compute) keep their per-rank names mp_rank_YY.<key> and are listed in
// deepspeed.tp_unmerged. Module buffers (buffer_names, in no optimizer group) do not take
// the default concatenation: a buffer that no explicit pattern matches, or that
// tp_replicated_parameter_patterns matches, is TP rank 0's copy when every TP copy has the
// same dtype, shape and values (read and compared in pieces, whatever the size), and
// otherwise stays per rank as mp_rank_YY.<name> / module.mp_rank_YY.<name>, listed with
// the reason and first differing element in deepspeed.tp_buffers_per_rank (a warning;
// export is not refused: ds_to_universal never compares buffers).
// Without universal_checkpoint_info every key is prefixed
// "mp_rank_YY." (YY: TP rank).
// Universal Checkpoints are already TP- and DP-merged: their cat_dim / vocab_tensor /
// sub_param_shape keys are not needed to read them (SubparamShape is allow-listed).
// Every chunk addresses the bytes in place: a flat partition contributes flattened-range
// chunks (Chunk::flat_range over the param's row-major flattening) of the params it covers;
// padding is never addressed.
//
// Attributes: deepspeed.tag, deepspeed.zero_stage (0-3), deepspeed.optimizer
// (zero | bf16_optimizer | zero3 | none | universal), deepspeed.dp_degree,
// deepspeed.tp_degree, deepspeed.pp_degree, deepspeed.ds_version, deepspeed.module_dtype,
// deepspeed.master_dtype, deepspeed.universal_checkpoint_info (present|absent),
// deepspeed.tp_merge (TP > 1: universal_checkpoint_info | none ...), deepspeed.tp_unmerged,
// deepspeed.tp_buffers_per_rank,
// deepspeed.moe,
// deepspeed.opaque_globals (pickle globals outside the allow-list, kept as opaque objects:
// this is the warning).
//
// Pickle globals are interpreted through an allow-list, as plain data (torch tensor rebuild
// functions and storages, torch.Size, collections.OrderedDict, builtins set/frozenset,
// ZeroStageEnum -> int, LossScaler / DynamicLossScaler, fragment_address, SubparamShape,
// argparse.Namespace, numpy RNG state); nothing is ever executed. Other globals are kept
// opaque and listed in deepspeed.opaque_globals; they never make the read fail.
//
// Not read (kUnimplemented, exit 6): MoE optimizer states other than ZeRO 1/2 and
// BF16_Optimizer at TP 1 / PP 1
// (the module and expert weights are still read), per-group partition counts without MoE,
// elastic optimizer state, big-endian legacy torch.save files, AutoEP/MiCS/hpZ layouts,
// universal_checkpoint_info patterns RE2 cannot run, autotp_unsupported_parameter_patterns.
// Checked on read: file count == partition_count, every partition's size against the
// padding rule, param_slice_mappings against the partition math, each tensor covered exactly
// once, TP slices' shapes against their merge rule, pipeline stages agreeing on shared
// params, degrees against checkpoint_parallel_dimensions.
// Errors: kNotFound (no tag dir, missing files), kDataLoss (file counts, sizes or offsets
// that disagree, truncated archives; the message names the file and tensor).
//
// Thread-safety: pure functions.
#ifndef FC_FORMAT_DEEPSPEED_H_
#define FC_FORMAT_DEEPSPEED_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "fc/codec/pickle.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

// True when `dir` looks like a DeepSpeed save dir (a `latest` or `latest_universal` file
// naming a tag dir holding *_model_states.pt), a tag dir (holding *_model_states.pt /
// *_optim_states.pt) or a Universal Checkpoint dir (zero/ beside the model states).
bool IsDeepSpeedCheckpointDir(const std::string& dir);

struct DeepSpeedReadOptions {
  // When set (fc-* --source-layout FILE), says how TP > 1 shards merge instead of
  // universal_checkpoint_info: for each param name, the dim the TP ranks' slices are
  // concatenated along, or nullopt (replicated: TP rank 0's copy, once every TP copy is
  // found equal to it; copies that differ are kDataLoss, the step excepted; a module buffer
  // without an axis follows the buffer rule above: per rank when its copies differ). No
  // vocabulary trimming,
  // sub-param or averaging rules then. deepspeed.tp_merge names the rules.
  std::function<std::optional<int64_t>(std::string_view name)> tp_axis;
  std::string tp_axis_origin;
  // TP copies that must be equal (replicated tensors, module buffers) are read and compared
  // in pieces of at most this many bytes per copy (a strided copy is read whole, as export
  // reads it). Tests set it small to cut tensors into several pieces.
  uint64_t replica_piece_bytes = uint64_t{4} << 20;
};

Result<CheckpointIndex> ReadDeepSpeedCheckpoint(const std::string& path,
                                                DeepSpeedReadOptions options = {});

// The object pickled in one DeepSpeed .pt file (zip or legacy torch.save) as a value tree,
// nothing run; tensors stay unresolved persistent ids. For the non-tensor parts of a file
// (optimizer state dicts, universal_checkpoint_info). Errors: those of reading the file.
Result<PickleValue> ReadDeepSpeedPickle(const std::string& path);

// One DeepSpeed .pt file as a writer that re-emits it needs it (fc/format/deepspeed_writer.h):
// the pickled object (nothing run, tensors unresolved) and, per storage key, the place of that
// storage's bytes in the file, [offset, + bytes): a zip's STORED data/<key> records, or a
// legacy file's raw storages. Errors: those of reading the file.
struct DeepSpeedPtFile {
  PickleValue root;
  bool legacy = false;  // legacy (non-zip) torch.save
  uint64_t size = 0;    // file bytes
  std::map<std::string, std::pair<uint64_t, uint64_t>> storages;
};
Result<DeepSpeedPtFile> ReadDeepSpeedPtFile(const std::string& path);

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
// Errors: kUnimplemented when the TP degree is > 1 and the checkpoint has no
// universal_checkpoint_info (nothing says how the shards concatenate), or when some params
// were left unmerged (deepspeed.tp_unmerged), or for kFp32 of a MoE checkpoint whose
// optimizer files were not read (deepspeed.optimizer "not read (MoE)"); kInvalidArgument when the index is not a DeepSpeed one.
Status SelectDeepSpeedWeights(DeepSpeedWeights weights, CheckpointIndex* index);

}  // namespace fc

#endif  // FC_FORMAT_DEEPSPEED_H_
