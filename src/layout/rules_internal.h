// Private to src/layout: LayoutRules with every regex compiled. Not installed; include as
// "src/layout/rules_internal.h".
#ifndef FC_SRC_LAYOUT_RULES_INTERNAL_H_
#define FC_SRC_LAYOUT_RULES_INTERNAL_H_

#include <optional>
#include <regex>
#include <vector>

#include "fc/layout/layout_rules.h"

namespace fc::layout_internal {

struct CompiledRules {
  std::vector<std::regex> tensor_parallel;  // parallel to LayoutRules::tensor_parallel
  std::optional<std::regex> layer;
  std::vector<std::regex> first_stage;
  std::vector<std::regex> last_stage;
  std::optional<std::regex> expert;
  std::vector<std::regex> states;
  std::vector<std::regex> per_rank_replicas;
};

// ValidateLayoutRules's checks, keeping the compiled regexes.
Result<CompiledRules> CompileRules(const LayoutRules& rules);

}  // namespace fc::layout_internal

#endif  // FC_SRC_LAYOUT_RULES_INTERNAL_H_
