// Private to src/ops: fc-convert --output-format ucp (RunConvert hands the run here).
//
// Writes a DeepSpeed Universal Checkpoint (fc/format/ucp_writer.h; deepspeed.md section 5)
// from a DeepSpeed checkpoint (ZeRO 1/2/3, BF16_Optimizer, TP merged by
// universal_checkpoint_info, pipelines) or a UCP, in one pass: per trainable param (a
// <param> of the index with optimizer.exp_avg.<param>) its fp32 master weight, exp_avg and
// exp_avg_sq assembled by the planner from the source's pieces and streamed into
// OUT/zero/<param>/*.pt under the memory budget, step.pt, zero/optimizer_state.pt and the
// copied model states; then, once OUT is committed, <parent of OUT>/latest_universal (the
// basename of OUT, written to a temporary file and renamed). No target is given: the
// output holds every param whole.
//
// Refused: a source that is not a DeepSpeed checkpoint (kInvalidArgument: fc knows the
// roles fp32 / exp_avg / exp_avg_sq / step only from the DeepSpeed reader's names), one
// without fp32 master weights or Adam states (kInvalidArgument), TP shards left unmerged
// and MoE (kUnimplemented; TP > 1 without universal_checkpoint_info is written with every
// param's slices concatenated along dim 0 when ucp_inject_missing_state), several processes (kUnimplemented), and the options that shape
// a target (--target-*, --preset, --aoa, --include/--exclude, --dtype: kInvalidArgument).
#ifndef FC_SRC_OPS_CONVERT_UCP_H_
#define FC_SRC_OPS_CONVERT_UCP_H_

#include <ostream>

#include "fc/core/status.h"
#include "fc/ops/convert.h"

namespace fc {

Result<ConvertSummary> RunConvertUcp(const ConvertOptions& options, std::ostream& out);

}  // namespace fc

#endif  // FC_SRC_OPS_CONVERT_UCP_H_
