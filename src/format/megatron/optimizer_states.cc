// Optimizer state names (optimizer_states.h).
#include "src/format/megatron/optimizer_states.h"

#include <string>

namespace fc::megatron_internal {

std::string_view ParamNameOf(std::string_view name) {
  for (std::string_view role : kOptimRoles) {
    const std::string prefix = "optimizer." + std::string(role) + ".";
    if (name.starts_with(prefix)) return name.substr(prefix.size());
  }
  return name;
}

bool IsFp32OptimizerState(const PV& opt) {
  return opt.Find("state") != nullptr && opt.Find("param_groups") != nullptr &&
         opt.Find("optimizer") == nullptr && opt.Find("fp32_from_fp16_params") == nullptr;
}

}  // namespace fc::megatron_internal
