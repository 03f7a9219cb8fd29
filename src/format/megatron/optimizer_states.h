// The optimizer states the Megatron legacy reader puts in the index: per param, its fp32
// master weight and Adam moments, named optimizer.{fp32,exp_avg,exp_avg_sq}.<param>; the
// keys Megatron saves them under; and the recognition of the FP32Optimizer's state dict.
#ifndef FC_SRC_FORMAT_MEGATRON_OPTIMIZER_STATES_H_
#define FC_SRC_FORMAT_MEGATRON_OPTIMIZER_STATES_H_

#include <array>
#include <string_view>

#include "src/format/megatron/pickle_values.h"

namespace fc::megatron_internal {

constexpr std::array<std::string_view, 3> kOptimRoles = {"fp32", "exp_avg", "exp_avg_sq"};
constexpr std::array<std::string_view, 3> kOptimKeys = {"param", "exp_avg", "exp_avg_sq"};

// The param an index name is about: <name> for optimizer.<role>.<name>.
std::string_view ParamNameOf(std::string_view name);

// Megatron's FP32Optimizer.state_dict() is the torch optimizer's own: {state, param_groups}
// at the top, where the Float16 and distributed optimizers nest it under "optimizer".
bool IsFp32OptimizerState(const PV& opt);

}  // namespace fc::megatron_internal

#endif  // FC_SRC_FORMAT_MEGATRON_OPTIMIZER_STATES_H_
