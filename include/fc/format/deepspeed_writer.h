// Writing a DeepSpeed checkpoint of another data-parallel size (ZeRO stage 1/2, the
// BF16_Optimizer variant and ZeRO-3; shared/reference/deepspeed.md sections 1-4), so that
// training resumes on a different GPU count. TP and PP degrees stay: every model-parallel rank XX of
// the source gets its own files, re-partitioned independently.
//
// Output (relative to OUT, written by fc-convert --output-format deepspeed --dp N):
//   latest                                 the source tag (written last)
//   <tag>/mp_rank_XX_model_states.pt       the source's dict re-pickled with dp_world_size = N;
//                                          every other key as the source had it (module,
//                                          param_shapes, frozen_*, shared_params,
//                                          buffer_names, ds_config, ds_version, client state);
//                                          every storage record copied byte for byte, so
//                                          views, strides and shared storages stay
//   <tag>/[bf16_|fp16_]zero_pp_rank_R_mp_rank_XX_optim_states.pt   for R < N:
//       source DP rank 0's dict re-pickled with, in optimizer_state_dict:
//         single_partition_of_fp32_groups[g]  rank R's partition of group g's flat buffer
//             (deepspeed.md 3.1 for N: alignment 2N, zero tail padding), a view of its
//             padding stripped (ZeRO) or padded (BF16_Optimizer: no zero_stage key); the
//             storage always holds the padded partition
//         base_optimizer_state.state[g].exp_avg / exp_avg_sq   padded partition length,
//             the padding zero; `step` and param_groups as DP rank 0 had them
//         group_paddings, partition_count (= N), param_slice_mappings (fragment_address
//             objects, from param_shapes of the model states)
//       every other key (zero_stage, loss_scaler, clip_grad, ds_config, ...) as source DP
//       rank 0 had it.
//   ZeRO-3 (4.1), for R < N:
//   <tag>/[prefix]zero_pp_rank_R_mp_rank_XX_model_states.pt   DP rank 0's dict with
//       dp_world_size = N and frozen_param_fragments[name] = rank R's ceil(numel / N) slice
//       (tail padded with zeros); module placeholders, buffers, param_shapes kept
//   <tag>/[prefix]zero_pp_rank_R_mp_rank_XX_optim_states.pt   DP rank 0's dict with
//       partition_count = N, fp32_flat_groups[k] and optimizer_state_dict.state[k].exp_avg /
//       exp_avg_sq = the concatenated ceil(numel / N) slices of sub-group k's params; the
//       sub-groups (param_shapes) kept as the source had them: refused (kUnimplemented) when
//       the ds_config's sub_group_size reproduces the source's split at its DP size but
//       splits differently at N (DeepSpeed would regroup).
//   MoE (expert files; ZeRO 1/2 or BF16_Optimizer, one mp rank, no pipeline): the groups laid out as fc's
//   reader reads them (fc/format/deepspeed.h): dense groups over N, each expert group of
//   ep_size E per expert-parallel rank e over N / E ranks (N % E != 0: kInvalidArgument);
//   new rank R holds e = R % E, partition R / E (use_data_before_expert_parallelism in
//   ds_config: e = R / (N/E), partition R % (N/E)); partition_count the list of the new
//   counts; param_slice_mappings under the local expert names; the params of each (group, e)
//   from the source's param_slice_mappings (required: no param_shapes). The expert files
//   and expp_rank_* files are copied.
//   <tag>/layer_LL-model_YY-model_states.pt   pipeline layer files, copied byte for byte
//   zero_to_fp32.py                         copied from the save dir when there
// Archives are torch.save zips (records <name>/data.pkl, byteorder, data/<k>, version; <name>
// the file name up to its first '.', as torch.save names them) with storage keys renumbered
// 0.. in the pickle's order (sources in either torch.save serialization, zip or legacy
// (checkpoint_serialization: false), are written as zips, which torch.load reads alike); pickles are protocol 2, re-emitted from
// the parsed value trees (DeepSpeed's classes as the same GLOBAL / REDUCE / NEWOBJ / BUILD
// opcodes, sets as builtins.set REDUCE, bytes as _codecs.encode), nothing executed.
//
// How the data moves: the partitions' element ranges are plain data here (DsStreamPart); the
// caller plans and streams them (a Plan over `source`, whose tensors are the source's 1-D
// partitions, one chunk each, read in place, padding never read).
//
// Refused (kUnimplemented): Universal Checkpoints, MoE other than the above, AutoEP,
// round_robin_gradients (its param order depends on the DP size),
// elastic optimizer state, pickled values fc does not re-emit (big ints, NEWOBJ_EX). Checked (kDataLoss, naming file, group and
// values): the DP rank files against partition_count, every partition's length and
// group_paddings against the padding rule for the source DP size.
//
// The archives are written by DsArchiveWriter (fc/format/ds_archive_writer.h).
//
// Thread-safety: pure functions.
#ifndef FC_FORMAT_DEEPSPEED_WRITER_H_
#define FC_FORMAT_DEEPSPEED_WRITER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/format/ds_archive_writer.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

struct DsRepartition {
  std::string tag;       // the tag directory's name
  std::string tag_dir;   // the source tag directory
  int64_t source_dp = 0;
  int64_t dp = 0;
  int64_t mp = 0;        // model-parallel ranks (source files mp_rank_XX)
  // "zero" (stage 1/2), "bf16_optimizer", "zero3" or "none" (no optimizer files)
  std::string variant;
  CheckpointIndex source;  // root = tag_dir; one 1-D tensor per source partition piece
  std::vector<DsArchiveSpec> archives;  // paths "<tag>/..."
  // Files copied whole: source absolute path -> path relative to the output directory.
  std::vector<std::pair<std::string, std::string>> copies;
};

// Lays out the copy at `dp` of the source `input` (save dir with `latest`, or a tag dir),
// `opened` being the index the DeepSpeed reader returned for it (fc/format/deepspeed.h): the
// .pt files it parsed are taken from there, not opened again; files it did not parse (or
// all, for an index of another reader or built by hand) are read here. The tag dir is
// listed either way. Errors: kInvalidArgument for dp < 1; kUnimplemented for what is
// refused above; kNotFound / kDataLoss for missing or inconsistent source files.
Result<DsRepartition> PlanDeepSpeedRepartition(const std::string& input,
                                               const CheckpointIndex& opened, int64_t dp);
// The same reading every source file here (no index opened).
Result<DsRepartition> PlanDeepSpeedRepartition(const std::string& input, int64_t dp);

}  // namespace fc

#endif  // FC_FORMAT_DEEPSPEED_WRITER_H_
