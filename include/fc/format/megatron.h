// Reading Megatron-LM legacy checkpoints (one torch.save per model-parallel rank), without
// Megatron and without running any pickle (shared/reference/formats-recent.md, "Megatron
// legacy").
//
// Input: the save dir (its latest_checkpointed_iteration.txt holds an iteration number N ->
// iter_{N:07d}, or "release" -> release/) or an iteration / release dir itself (pass
// <save_dir>/iter_NNNNNNN to read another iteration). Files, one per rank:
//   mp_rank_TT/model_optim_rng.pt              PP = 1, EP = 1
//   mp_rank_TT_PPP/model_optim_rng.pt          PP > 1
//   mp_rank_TT_EEE/model_optim_rng.pt          PP = 1, EP > 1 (told apart from _PPP by args:
//                                              _EEE when pipeline_model_parallel_size <= 1
//                                              and expert_model_parallel_size > 1, else _PPP)
//   mp_rank_TT_PPP_EEE/model_optim_rng.pt      PP > 1, EP > 1
//   distrib_optim.pt beside it (distributed optimizer): read, see DISTRIBUTED OPTIMIZER.
// TT: TP rank (2 digits), PPP: pipeline stage, EEE: expert-parallel rank (3 digits). The
// ranks must form a full TP x PP x EP grid (a missing one: kNotFound naming its file).
// Each file is a torch.save zip (torch >= 1.6); legacy (non-zip) torch.save files are
// refused (kUnimplemented). Its pickle (generate_state_dict) holds:
//   args                  argparse.Namespace, read as plain data: tensor/pipeline/expert
//                         _model_parallel_size, virtual_pipeline_model_parallel_size,
//                         num_layers, num_experts, swiglu, expert_tensor_parallel_size
//   checkpoint_version, iteration
//   model | model0, model1, ...   the rank's state dict (nested dicts are flattened with
//                         "."); model<v>: virtual pipeline chunk v
//   optimizer, opt_param_scheduler, rng_state, ...: not read (see below)
// Degrees come from the directory names and must agree with args (kDataLoss, naming both).
//
// GLOBAL TENSORS. Every model tensor is exposed once under its global name:
//   Pipeline: the layer number after the first "layers" component is local to the stage
//   (and virtual chunk); it becomes offset + local, where offset counts the layers of the
//   chunks before it in Megatron's order (chunk v of stage p follows all chunks v' < v, and
//   chunk v of the stages before p): for an even split that is num_layers / (pp * vpp) *
//   (v * pp + p). The total must equal args.num_layers. Other tensors (embedding,
//   final_layernorm, output_layer) are read from the first stage holding them.
//   Experts: "...experts.local_experts.I.<rest>" (SequentialMLP) and
//   "...experts.<module>.weightI" / ".biasI" (TEGroupedMLP) of EP rank e become expert
//   e * L + I, L = num_experts / EP (or the local count when args has no num_experts).
//   Tensors outside the experts are read from EP rank 0 (the other copies are not compared).
//   Tensor parallelism: the built-in table below, keyed on the last two name components
//   (<module>.<param>, digits at the end of param ignored), Megatron-Core GPT names of the
//   local and Transformer-Engine layers, and the legacy (pre-Core) names:
//     column, concatenated along dim 0:
//       word_embeddings.weight, output_layer.weight (vocabulary rows, padding kept),
//       linear_qkv.{weight,bias}, query_key_value.{weight,bias},
//       linear_fc1.{weight,bias}, dense_h_to_4h.{weight,bias}  (SwiGLU: see below)
//     row, concatenated along dim 1:
//       linear_proj.weight, linear_fc2.weight, dense_4h_to_h.weight,
//       <attention>.dense.weight (<attention>: self_attention, inter_attention, attention)
//     replicated, TP rank 0's copy (the others are not compared):
//       *norm*.* (input_layernorm, pre_mlp_layernorm, final_layernorm, q_layernorm, ...),
//       *.layer_norm_weight / *.layer_norm_bias (TE fused norms), linear_proj.bias,
//       linear_fc2.bias, dense_4h_to_h.bias, <attention>.dense.bias, router.*,
//       position_embeddings.weight
//   SwiGLU (args.swiglu true): each TP rank's linear_fc1 / dense_h_to_4h holds
//   [gate_r; up_r]; the global tensor is the gate halves of all ranks, then the up halves
//   (Megatron's checkpoint converters' order, and what a TP 1 checkpoint holds). With TP > 1
//   and args lacking `swiglu`, reading fails (kUnimplemented, naming the param).
//   Names outside the table, with TP > 1, are not merged: they stay per rank as
//   "mp_rank_TT.<name>" and are listed in megatron.tp_unmerged. A layout file's
//   tensor_parallel rules replace the table (MegatronReadOptions::tp_axis, the tools'
//   --source-layout): a name no rule matches is then replicated.
//   Skipped: TE "_extra_state" entries (FP8 metadata, usually io.BytesIO), non-tensor values.
// A merge only places each rank's bytes at their offset in the global tensor (chunks
// address the torch.save storage records in place, strides and storage offsets honoured;
// the SwiGLU split narrows a chunk to rows of its box); nothing is copied.
//
// DISTRIBUTED OPTIMIZER. Each rank dir's distrib_optim.pt (DistributedOptimizer.
// save_parameter_state: the states of all DP ranks gathered by DP rank 0) holds, per
// param-and-grad buffer (one per model chunk and param dtype, chunks in order), flat fp32
// "param" (the master weights), "exp_avg" and "exp_avg_sq" tensors in the coalesced form
// Megatron writes since February 2024 ({"buckets_coalesced": True, i: {(param dtype, grad
// dtype) or grad dtype: {..., "numel_unpadded"}}}, or a ChainedOptimizer's list of those:
// [dense] or, with MoE, [dense, expert], or with overlap_param_gather_with_optimizer_step
// and virtual pipeline chunks one dense optimizer per chunk [chunk 0, chunk 1, ...(,
// expert)], each with its chunk's buffers from index 0; None where the saving process was
// not DP rank 0 of that optimizer's group; dense states are read from EP rank 0, the expert params, in
// buffers of their own, from every EP rank); or the older forms: per-bucket lists of
// tensors each padded to a multiple of DP (Megatron-Core 0.4/0.5, "per_bucket_numel",
// checked against the bucket tensors' sizes when it has its usual shape) and one tensor per
// state of the whole grad buffer padded at its end (Megatron-LM before buckets, 2023; no
// alignment, one bucket). Positions follow Megatron-Core's ParamAndGradBuffer layout
// (src/format/megatron/distrib_optim_layout.h): params in reverse state-dict order, starts
// aligned to 64 elements (Megatron-Core >= 0.8) or not (older), buckets from args
// (overlap_grad_reduce, ddp_bucket_size, ddp_num_buckets: the rank's parameter count over
// it, else max(40M, 1M x DP), none after the first stage / chunk), a bucket of its own for each shared embedding (tied embeddings, PP > 1).
// The older forms try the layouts without alignment padding of a shared embedding's start,
// with and without its bucket of its own.
// Every candidate layout is checked before use: the sizes must add up to numel_unpadded (older
// forms: the bucket count, each bucket tensor its bucket plus less than DP x CP padding), and
// at both ends of every param the fp32 master value must round to the saved model weight
// (Megatron copies master to model weights after each step). The states become
//   optimizer.fp32.<name>, optimizer.exp_avg.<name>, optimizer.exp_avg_sq.<name>
// (float32, the param's global shape, merged over TP like the weights). The Adam step is per
// param group in model_optim_rng.pt (the groups' param lists are dropped): attribute
// megatron.optimizer_step (the distinct values). When any file does not fit (missing, an
// unknown form, a list of optimizers of another length, frozen params or a
// layout that fails the check), no state is
// exposed and megatron.distrib_optim says why; the weights are unaffected.
//
// Attributes: megatron.iteration, megatron.checkpoint_dir (iter_NNNNNNN | release),
// megatron.checkpoint_version, megatron.tp_degree, megatron.pp_degree, megatron.ep_degree,
// megatron.vpp_degree, megatron.num_layers, megatron.swiglu (true|false|unknown),
// megatron.args.<name> (the model facts of args: num_attention_heads, num_query_groups,
// group_query_attention, kv_channels, hidden_size, ffn_hidden_size, padded_vocab_size,
// add_qkv_bias, add_bias_linear, untie_embeddings_and_output_weights, num_experts,
// normalization, position_embedding_type; those args holds as ints, bools or strings),
// megatron.tp_merge, megatron.tp_unmerged, megatron.optimizer (what was found, read or not),
// megatron.distrib_optim ("N files, read (<layout rules>)" or "N files, not read: <why>"),
// megatron.optimizer_step, megatron.skipped (how many _extra_state /
// non-tensor entries), megatron.opaque_globals (pickle globals outside the allow-list, kept
// as opaque objects: this is the warning).
//
// Pickle globals are interpreted through an allow-list as plain data (torch tensor rebuild
// functions and storages, torch dtypes, torch.Size, collections.OrderedDict,
// argparse.Namespace, numpy RNG state, builtins set/frozenset, _codecs.encode); nothing is
// ever executed. Other globals (Megatron enums, io.BytesIO, ...) are kept opaque and listed
// in megatron.opaque_globals; they never make the read fail.
//
// FLOAT16 OPTIMIZER (no distributed optimizer): model_optim_rng.pt's 'optimizer' is
// Float16OptimizerWithFloat16Params.state_dict() ({optimizer: torch Adam's state_dict,
// fp32_from_fp16_params: per param group, the 16-bit params' fp32 masters}), or a
// ChainedOptimizer's [dense, expert] list with expert parallelism. Megatron groups the
// trainable params by (wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr), no weight
// decay for ".bias" and 1-D params, each group in named_parameters order over the model
// chunks; the saved groups keep those keys (the oldest form: two groups, weight decay first),
// so each param goes to the group whose keys fit it, whatever the groups' order. Checked:
// group sizes, every state's shape, and every master rounding to its model weight at both
// ends. Same names as above; when anything does not fit (lr_mult != 1, frozen params, a
// param without a state yet), megatron.optimizer says "..., not read: <why>".
//
// Not read: the RNG states and the scheduler. checkpoint_version < 2.0 (the old QKV ordering) is refused
// (kUnimplemented), as is expert_tensor_parallel_size != tensor_model_parallel_size.
// Errors: kNotFound (no iteration dir, a missing rank dir or file), kDataLoss (degrees, layer
// counts, shapes or iterations that disagree; truncated archives; the message names the file
// and tensor).
//
// Thread-safety: pure functions.
#ifndef FC_FORMAT_MEGATRON_H_
#define FC_FORMAT_MEGATRON_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

// True when `dir` is a Megatron legacy save dir (latest_checkpointed_iteration.txt naming a
// dir that holds mp_rank_* dirs) or iteration dir (mp_rank_*/model_optim_rng.pt).
bool IsMegatronLegacyCheckpointDir(const std::string& dir);

struct MegatronReadOptions {
  // When set, replaces the built-in TP table: for each tensor's global name, the dim along
  // which the TP ranks' pieces are concatenated, or nullopt for a replicated tensor (TP rank
  // 0's copy). SwiGLU halves (above) still apply to the fc1 names split along dim 0.
  // fc-* --source-layout FILE builds it from a layout file's tensor_parallel rules.
  std::function<std::optional<int64_t>(std::string_view name)> tp_axis;
  std::string tp_axis_origin;  // names the rules in messages and megatron.tp_merge
};

Result<CheckpointIndex> ReadMegatronLegacyCheckpoint(const std::string& path,
                                                     MegatronReadOptions options = {});

// fc-export --weights fp32 on a Megatron index: each param's fp32 master weight
// (optimizer.fp32.<name>) replaces its model weight <name>; the optimizer.fp32.* entries are
// dropped, the Adam moments kept; per-rank (unmerged) masters mp_rank_TT.optimizer.fp32.<name>
// replace mp_rank_TT.<name>. Errors: kUnimplemented naming why the optimizer states were not
// read (megatron.distrib_optim or megatron.optimizer) when the index has no master weights;
// kInvalidArgument for another format.
Status SelectMegatronMasterWeights(CheckpointIndex* index);

}  // namespace fc

#endif  // FC_FORMAT_MEGATRON_H_
