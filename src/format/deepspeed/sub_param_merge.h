// parameter_with_sub_params (deepspeed.md 5.5 rule 4): fused params (QKV, GQA) whose TP
// slices hold a piece of every sub-param, merged per sub-param.
#ifndef FC_SRC_FORMAT_DEEPSPEED_SUB_PARAM_MERGE_H_
#define FC_SRC_FORMAT_DEEPSPEED_SUB_PARAM_MERGE_H_

#include <string>
#include <vector>

#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "src/format/deepspeed/tp_rules.h"

namespace fc::deepspeed_internal {

// parameter_with_sub_params (deepspeed.md 5.5 rule 4, ds_to_universal's merge): every TP
// slice is the sub-params' per-rank pieces side by side along partition_dim; the merged
// tensor is, per sub-param, all ranks' pieces in rank order. Widths: version >= 0.4 from
// sub_param_shard_widths[matched pattern] (uneven, GQA); before, an even split (a count at
// partition_dim: that many equal sub-params). Only the chunks' boxes move (AxisSlice).
// `name`, `key`: for messages. Errors: kDataLoss when the widths or shapes disagree with the
// slices, kUnimplemented for a sub-param view whose shape is not the slices' own.
Status MergeSubParams(const TpRules& rules, const SubParamRule& rule, const std::string& pattern,
                      const std::string& key, const std::vector<TensorEntry*>& parts,
                      TensorEntry* m);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_SUB_PARAM_MERGE_H_
