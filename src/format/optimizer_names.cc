// Contract: fc/format/optimizer_names.h.
#include "fc/format/optimizer_names.h"

#include <optional>

namespace fc {

std::vector<AdamNames> AdamNamesOf(std::string_view key) {
  // The middle of key between prefix and suffix, when it has both and a middle.
  auto middle = [key](std::string_view prefix, std::string_view suffix) {
    return key.size() > prefix.size() + suffix.size() && key.starts_with(prefix) &&
                   key.ends_with(suffix)
               ? std::optional<std::string>(std::string(
                     key.substr(prefix.size(), key.size() - prefix.size() - suffix.size())))
               : std::nullopt;
  };
  std::vector<AdamNames> names;
  // torch.distributed.checkpoint's flattened {"model", "optim"} state dict (and the same
  // under "optimizer"): <prefix><p>.exp_avg, .exp_avg_sq, .step.
  for (std::string_view prefix : {"optim.state.", "optimizer.state."}) {
    if (std::optional<std::string> p = middle(prefix, ".exp_avg")) {
      const std::string base = std::string(prefix) + *p;
      names.push_back({"torch", *p, base + ".exp_avg_sq", base + ".step",
                       {*p, "model." + *p, "module." + *p}, 0, {}});
    }
  }
  // Megatron-Core's dist checkpointing (torch_dist): optimizer.state.<state>.<sharded key>,
  // the fp32 master weight as state fp32_param (the distributed optimizer's
  // fully_sharded_model_space form, and the non-distributed optimizer) or param (its
  // fully_reshardable form, Megatron-Core 0.14 on); the step is in common.pt (the torch DCP
  // reader's megatron.optimizer_step), not a tensor.
  if (std::optional<std::string> p = middle("optimizer.state.exp_avg.", "")) {
    names.push_back({"Megatron torch_dist", *p, "optimizer.state.exp_avg_sq." + *p, "",
                     {"optimizer.state.fp32_param." + *p, "optimizer.state.param." + *p, *p},
                     2, {}});
  }
  // fc's DeepSpeed and Megatron legacy names (the fp32 master weight optimizer.fp32.<p>
  // where the weight <p> is 16-bit).
  if (std::optional<std::string> p = middle("optimizer.exp_avg.", "")) {
    names.push_back({"fc", *p, "optimizer.exp_avg_sq." + *p, "optimizer.step." + *p,
                     {"optimizer.fp32." + *p, *p, "module." + *p}, 1, {}});
  }
  // PaddlePaddle's optimizer state keys (semantics.md): <p>.moment1_0, .moment2_0, the
  // master weight <p>.w_0; no step, only its powers of beta1 and beta2.
  if (std::optional<std::string> p = middle("", ".moment1_0")) {
    names.push_back({"PaddlePaddle", *p, *p + ".moment2_0", "", {*p + ".w_0", *p}, 1,
                     {*p + ".beta1_pow_acc_0", *p + ".beta2_pow_acc_0"}});
  }
  return names;
}


const std::vector<std::string> kDefaultOptimizerMarkers = {
    "optim.",      "optimizer.",  ".exp_avg",        ".exp_avg_sq",      ".fp32_param",
    ".moment1_0",  ".moment2_0",  ".w_0",            ".beta1_pow_acc_0", ".beta2_pow_acc_0",
    ".master_weight"};

bool IsOptimizerKey(const std::string& key, const std::vector<std::string>& markers) {
  for (const std::string& m : markers) {
    if (key.find(m) != std::string::npos) return true;
  }
  return false;
}

std::string UnreadOptimizerStates(const CheckpointIndex& index) {
  if (index.format != CheckpointFormat::kMegatronLegacy) return "";
  const std::string optimizer = index.Attribute("megatron.optimizer");
  if (optimizer.find(", not read") == std::string::npos) return "";
  auto distrib = index.attributes.find("megatron.distrib_optim");
  return distrib != index.attributes.end() ? "distrib_optim.pt " + distrib->second : optimizer;
}

}  // namespace fc
