// How TP > 1 shards merge, as universal_checkpoint_info says (deepspeed.md 5.5/5.6): the
// pattern lists of each rule, the sub-param shapes and widths, the vocabulary size.
#ifndef FC_SRC_FORMAT_DEEPSPEED_TP_RULES_H_
#define FC_SRC_FORMAT_DEEPSPEED_TP_RULES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <re2/re2.h>

#include "fc/core/status.h"
#include "src/format/deepspeed/pt_file.h"

namespace fc::deepspeed_internal {

// universal_checkpoint_info merge rules (deepspeed.md 5.5/5.6). Patterns are Python regexes
// applied with re.match (anchored at the start only); RE2 runs them in linear time and
// refuses what it cannot run (backreferences, lookaround): such a checkpoint is refused.
// Bounds on the sub-param tables (sizes and widths are dims of real tensors, the tables have
// one entry per sub-param or TP rank): sums of them stay far from int64 overflow.
inline constexpr int64_t kMaxSubParamSize = int64_t{1} << 40;
inline constexpr size_t kMaxSubParamEntries = 1 << 16;

// One entry of parameter_with_sub_params: SubparamShape(patterns, shape, partition_dim),
// saved as a dict (or the dataclass). `shape` lists per dim either a size (-1: whatever the
// element count leaves) or, at partition_dim, the sizes of the fused sub-params (a tuple);
// before UCP version 0.4 that entry may be a count of equal sub-params instead.
struct SubParamRule {
  std::vector<std::string> patterns;
  std::vector<std::unique_ptr<re2::RE2>> compiled;
  std::vector<std::vector<int64_t>> dims;  // per dim: {size} or the sub-param sizes
  std::vector<bool> tuple;                 // dims[d] was a tuple / list
  size_t partition_dim = 0;
};

struct TpRules {
  using Patterns = std::vector<std::unique_ptr<re2::RE2>>;
  Patterns replicated, average, two_sub_params, sub_params, row_parallel, vocabulary;
  std::vector<SubParamRule> sub_param_rules;
  // sub_param_shard_widths (version >= 0.4): pattern -> per sub-param, per TP rank widths.
  std::map<std::string, std::vector<std::vector<int64_t>>> shard_widths;
  double version = 0.0;  // universal_checkpoint_version
  std::optional<int64_t> original_vocab_size;
  std::string source;  // the file the rules came from

  // DeepSpeed's get_matched_sub_params_pattern: the first entry with a pattern that
  // re.match-es `name`, and that pattern.
  std::pair<const SubParamRule*, std::string> MatchSubParams(const std::string& name) const {
    for (const SubParamRule& r : sub_param_rules) {
      for (size_t i = 0; i < r.compiled.size(); ++i) {
        if (r.compiled[i]->Match(name, 0, name.size(), re2::RE2::ANCHOR_START, nullptr, 0)) {
          return {&r, r.patterns[i]};
        }
      }
    }
    return {nullptr, std::string()};
  }

  static bool Matches(const Patterns& ps, const std::string& name) {
    for (const auto& p : ps) {
      if (p->Match(name, 0, name.size(), re2::RE2::ANCHOR_START, nullptr, 0)) return true;
    }
    return false;
  }
};


// The rules of universal_checkpoint_info `info` in the model states `model`.
// Errors: kDataLoss for malformed entries, kUnimplemented for patterns RE2 cannot run and
// for autotp_unsupported_parameter_patterns.
Result<TpRules> ParseTpRules(const PtFile& model, const PV* info);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_TP_RULES_H_
