// Per-param optimizer states out of Megatron-Core's distributed optimizer saved in its flat
// forms by torch_dist: dp_reshardable (Megatron-Core 0.14 on; the default of 0.14 and 0.15)
// and dp_zero_gather_scatter (0.8 to 0.13 without fully parallel save; earlier releases'
// default).
//
// dp_reshardable saves, for each data-parallel group (`dp_group_idx_<i>`, one per TP x PP rank),
// param-and-grad buffer (`gbuf_idx_<g>`) and bucket (`bucket_idx_<b>`), one 1-D tensor per
// state: `[chained_<k>.]optimizer.distributed.dp_group_idx_<i>.gbuf_idx_<g>.dtype_(<param
// dtype>, <grad dtype>).bucket_idx_<b>.{param,exp_avg,exp_avg_sq}`, as long as the bucket
// without its end padding. Each DP rank saves each param's piece of its share of the bucket,
// and each gap between params (alignment padding, garbage), as a chunk of its own. Nothing
// names the params: their places follow from the order the model registered them in, which
// the checkpoint does not record. dp_zero_gather_scatter saves, per data-parallel group, one
// object `[chained_<k>.]optimizer.distributed.dp_group_idx_<i>.param_state/shard_0_1`: a
// torch.save of the dict get_parameter_state_dp_zero returns, one fp32 tensor per buffer and
// state holding every bucket without its end padding, back to back (the "buckets_coalesced"
// form Megatron writes since February 2024; the older per-bucket lists are not read). Its
// tensors are read in place from the object's storage records, and the object leaves the
// index once mapped.
//
// They are found here from the data, as Megatron's own invariant allows: a param's saved
// model weight is its fp32 master rounded to the model dtype. Walking a bucket from its
// start, the param at position p is the one (of the model's local params: a chunk of a
// model tensor, or SwiGLU's gate and up chunks of linear_fc1 together) whose weight equals
// the masters at p rounded, checked on 8 elements spread over it and on every element when
// two candidates pass; it must end where a stored piece ends (dp_reshardable), and the next
// param starts right after it (no alignment before Megatron-Core 0.8; the next bucket of a
// coalesced tensor) or at the next multiple of 64 from its bucket's start (Megatron's
// alignment), the first of the two where a param is found, until the bucket's end. Candidates whose
// weights are identical (layer norms early in training) are told apart only when they are
// layers of one stacked tensor: the buffer holds params in the reverse of registration
// order, so the highest layer comes first; otherwise the buckets are left as they are. A
// param replicated over TP ranks is in every one of their groups: the lowest group's copy is
// taken (TP rank 0's, the one Megatron's fully_reshardable form keeps).
//
// When every bucket maps, the bucket tensors are replaced by
// `optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<key>` in each model tensor's global
// shape (the names of the per-param forms), every chunk a flattened range of a local param's
// box read in place from the bucket's files: the stored piece itself, still unlocated if it
// was (its item is a 1-D tensor of the range's length), or, for a piece that covers both
// SwiGLU halves, two located chunks; from a coalesced tensor, each part a located packed box.
// Otherwise the index is left unchanged.
//
// Cost: reads 8 to 16 elements per param and one per model chunk (plus whole params where
// two candidates pass the samples), at open.
#ifndef FC_SRC_FORMAT_MEGATRON_MEGATRON_BUCKETS_H_
#define FC_SRC_FORMAT_MEGATRON_MEGATRON_BUCKETS_H_

#include <functional>
#include <string>

#include "fc/model/checkpoint_index.h"

namespace fc {

struct MegatronBucketsOutcome {
  bool found = false;   // the index holds dp_reshardable buckets or dp_zero_gather_scatter objects
  bool mapped = false;  // they were replaced by per-param states
  std::string note;     // what was done, or why not (the attribute megatron.optimizer_buckets)
};

// Maps the flat optimizer states of `index` (see above). Reads through a ChunkReader over
// `index`; a read error or a bucket that does not map leaves the index unchanged and is
// reported in the note, never as an error (the weights stay readable). `locate_now` says
// which stored pieces must be located before they change tensors (a torch DCP safetensors
// blob finds its entries by the DCP key).
MegatronBucketsOutcome MapMegatronOptimizerBuckets(
    CheckpointIndex& index, const std::function<bool(const Chunk&)>& locate_now);

}  // namespace fc

#endif  // FC_SRC_FORMAT_MEGATRON_MEGATRON_BUCKETS_H_
