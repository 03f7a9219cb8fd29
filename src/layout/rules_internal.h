// Private to src/layout: LayoutRules with every regex compiled. Not installed; include as
// "src/layout/rules_internal.h".
#ifndef FC_SRC_LAYOUT_RULES_INTERNAL_H_
#define FC_SRC_LAYOUT_RULES_INTERNAL_H_

#include <memory>
#include <optional>
#include <vector>

#include <re2/re2.h>

#include "fc/layout/layout_rules.h"

namespace fc::layout_internal {

// A compiled rule pattern. RE2 (linear-time, bounded memory) rather than std::regex: the
// patterns come from users and are matched against names from checkpoint files, and
// std::regex backtracks exponentially and recurses once per character. RE2 objects cannot be
// copied or moved, hence the shared_ptr.
using Pattern = std::shared_ptr<const re2::RE2>;

// Longest accepted pattern and the compile-memory cap per pattern (RE2's max_mem).
inline constexpr size_t kMaxPatternBytes = 4096;
inline constexpr int64_t kMaxPatternMemory = int64_t{8} << 20;

struct CompiledRules {
  std::vector<Pattern> tensor_parallel;  // parallel to LayoutRules::tensor_parallel
  Pattern layer;                         // null: no pipeline section
  std::vector<Pattern> first_stage;
  std::vector<Pattern> last_stage;
  Pattern expert;                        // null: no experts section
  std::vector<Pattern> states;
  std::vector<Pattern> per_rank_replicas;
};

// ValidateLayoutRules's checks, keeping the compiled regexes.
Result<CompiledRules> CompileRules(const LayoutRules& rules);

}  // namespace fc::layout_internal

#endif  // FC_SRC_LAYOUT_RULES_INTERNAL_H_
