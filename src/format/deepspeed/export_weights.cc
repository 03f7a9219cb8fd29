// Export weight selection of a DeepSpeed index (ParseDeepSpeedWeights,
// SelectDeepSpeedWeights). Contract: include/fc/format/deepspeed.h.
#include <string>

#include "fc/format/deepspeed.h"

namespace fc {

Result<DeepSpeedWeights> ParseDeepSpeedWeights(std::string_view name) {
  if (name == "fp32" || name == "master") return DeepSpeedWeights::kFp32;
  if (name == "module" || name == "16bit") return DeepSpeedWeights::kModule;
  return InvalidArgumentError("unknown --weights '" + std::string(name) +
                              "' (expected fp32 or module)");
}

Status SelectDeepSpeedWeights(DeepSpeedWeights weights, CheckpointIndex* index) {
  if (index->format != CheckpointFormat::kDeepSpeed) {
    return InvalidArgumentError("--weights applies to DeepSpeed checkpoints only (input is " +
                                std::string(CheckpointFormatName(index->format)) + ")");
  }
  auto tp = index->attributes.find("deepspeed.tp_degree");
  auto merge = index->attributes.find("deepspeed.tp_merge");
  if (tp != index->attributes.end() && tp->second != "1" &&
      (merge == index->attributes.end() ||
       (merge->second != "universal_checkpoint_info" &&
        !merge->second.starts_with("tensor_parallel rules of ")))) {
    return UnimplementedError(
        index->root + ": DeepSpeed checkpoint with tensor parallelism (tp_degree " + tp->second +
        ") but no universal_checkpoint_info in its model states: nothing says how the TP "
        "shards concatenate (column/row parallel, vocabulary padding, replicated params); "
        "export refused. fc-inspect shows the per-rank tensors (mp_rank_XX.<name>); "
        "--source-layout FILE (a layout file's tensor_parallel rules) says how to merge them");
  }
  auto optimizer = index->attributes.find("deepspeed.optimizer");
  if (optimizer != index->attributes.end() && optimizer->second == "not read (MoE)" &&
      weights == DeepSpeedWeights::kFp32) {
    return UnimplementedError(index->root + ": MoE DeepSpeed checkpoint: fc reads its 16-bit "
                              "module and expert weights only (its optimizer files, which hold "
                              "the fp32 master weights, are not read); export with --weights "
                              "module");
  }
  if (auto u = index->attributes.find("deepspeed.tp_unmerged"); u != index->attributes.end()) {
    return UnimplementedError(index->root + ": DeepSpeed TP shards that fc does not merge: " +
                              u->second + "; export refused (fc-inspect shows them as "
                              "mp_rank_XX.<name>)");
  }
  FoldPrefixedTensors(index, "module.", weights == DeepSpeedWeights::kModule);
  return Status::Ok();
}

}  // namespace fc
