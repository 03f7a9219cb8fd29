// What Megatron-Core's dist checkpointing (torch_dist) adds to a torch DCP checkpoint, read
// by ReadTorchDcp (src/format/torch/torch_dcp.cc): the metadata's mcore_data (the N-D
// flattened reformulation of flat-range tensors, undone here), and common.pt beside the DCP
// files (iteration, the Adam step, the optimizer's sharding type, Megatron-LM's args). The
// distributed optimizer's flat buckets are megatron_buckets.h.
#ifndef FC_SRC_FORMAT_MEGATRON_TORCH_DIST_H_
#define FC_SRC_FORMAT_MEGATRON_TORCH_DIST_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fc/codec/pickle.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"

namespace fc::megatron_internal {

// Megatron-Core before 0.14 saved a ShardedTensor with a flattened range (the distributed
// optimizer's per-param states, fully_sharded_model_space; 1-D ones too in its later
// releases) "N-D reformulated" (dist_checkpointing/strategies/torch.py): a DCP tensor of
// shape axis_fragmentations + (numel of one fragment,), each DP rank's piece a chunk at
// (fragment index..., range start) of sizes (1, ..., 1, range length), and the original
// global shape in the metadata's mcore_data[key]["nd_reformulated_orig_global_shape"].
// Undone here: the tensor gets its original shape, each chunk its fragment's box and the
// range as the box's flat range, so that every tool sees the tensor Megatron saved. Returns
// how many tensors it restored; a shape that does not fit the DCP tensor is corrupt
// metadata (kDataLoss). `tensors`' chunk boxes are valid (equal ranks).
Result<int64_t> UndoMegatronReformulation(const PickleValue& mcore_data,
                                          std::vector<TensorEntry>& tensors);

// The attributes of the metadata's mcore_data: "mcore_data" (its size), and the original
// shapes of the reformulated keys that name no tensor of `index` (the others now have that
// shape: UndoMegatronReformulation).
void AddMcoreDataAttributes(const PickleValue& mcore_data, CheckpointIndex* index);

// common.pt of `dir` (which must exist): its iteration, Adam step, the distributed
// optimizer's param_state_sharding_type and Megatron-LM's args' model facts as attributes,
// and what was read in megatron_common_pt. Best effort: a common.pt fc cannot parse is
// reported in the attribute, not an error of the checkpoint.
void AddMegatronCommon(const std::string& dir, std::map<std::string, std::string>& a);

}  // namespace fc::megatron_internal

#endif  // FC_SRC_FORMAT_MEGATRON_TORCH_DIST_H_
