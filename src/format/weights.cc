// Contract: fc/format/weights.h.
#include "fc/format/weights.h"

#include <unordered_set>

#include "fc/format/deepspeed.h"
#include "fc/format/megatron.h"

namespace fc {

Result<WeightsSelected> SelectWeights(std::string_view weights, CheckpointIndex* index) {
  WeightsSelected selected;
  if (index->format == CheckpointFormat::kDeepSpeed) {
    // Plain names: fp32 master weights (default) or the 16-bit module weights.
    FC_ASSIGN_OR_RETURN(DeepSpeedWeights w,
                        ParseDeepSpeedWeights(weights.empty() ? "fp32" : weights));
    if (w == DeepSpeedWeights::kModule) {
      std::unordered_set<std::string> module_names;
      for (const TensorEntry& t : index->tensors) {
        if (t.key.starts_with("module.")) module_names.insert(t.key.substr(7));
      }
      for (const TensorEntry& t : index->tensors) {
        if (!t.key.starts_with("module.") && !t.key.starts_with("optimizer.") &&
            !module_names.count(t.key)) {
          selected.no_module_copy.push_back(t.key);
        }
      }
    }
    FC_RETURN_IF_ERROR(SelectDeepSpeedWeights(w, index));
  } else if (index->format == CheckpointFormat::kMegatronLegacy && !weights.empty()) {
    // Plain names: the model weights (default, what Megatron's converters export) or the
    // distributed optimizer's fp32 master weights.
    FC_ASSIGN_OR_RETURN(DeepSpeedWeights w, ParseDeepSpeedWeights(weights));
    if (w == DeepSpeedWeights::kFp32) FC_RETURN_IF_ERROR(SelectMegatronMasterWeights(index));
  } else if (!weights.empty()) {
    return InvalidArgumentError("--weights applies to DeepSpeed and Megatron checkpoints only");
  }
  return selected;
}

}  // namespace fc
