// fc-export --weights: which copy of each weight a checkpoint's plain names carry, for the
// formats whose readers keep two copies (DeepSpeed: the fp32 master weights <p> and the
// 16-bit module weights module.<p>; Megatron legacy: the model weights <p> and the
// optimizer's fp32 masters optimizer.fp32.<p>). A fact of the readers, kept here beside
// them (fc/format/deepspeed.h SelectDeepSpeedWeights, fc/format/megatron.h
// SelectMegatronMasterWeights), so that the operations do not switch on the format.
//
// Thread-safety: pure functions of the index.
#ifndef FC_FORMAT_WEIGHTS_H_
#define FC_FORMAT_WEIGHTS_H_

#include <string>
#include <string_view>
#include <vector>

#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

struct WeightsSelected {
  // DeepSpeed with "module": the params the module state dict holds no copy of (their
  // plain names stay the fp32 master weights).
  std::vector<std::string> no_module_copy;
};

// Rewrites `index` for `weights` ("fp32" | "module"; empty: the format's default, DeepSpeed
// "fp32" and Megatron legacy its model weights). Errors: kInvalidArgument "--weights
// applies to DeepSpeed and Megatron checkpoints only" for another format given `weights`;
// those of ParseDeepSpeedWeights, SelectDeepSpeedWeights and SelectMegatronMasterWeights.
Result<WeightsSelected> SelectWeights(std::string_view weights, CheckpointIndex* index);

}  // namespace fc

#endif  // FC_FORMAT_WEIGHTS_H_
