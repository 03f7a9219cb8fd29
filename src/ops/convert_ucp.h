// Private to src/ops: fc-convert --output-format ucp, planned here (RunConvert runs the job
// through the one job path, src/ops/job.h).
//
// Writes a DeepSpeed Universal Checkpoint (fc/format/ucp_writer.h; deepspeed.md section 5)
// from a DeepSpeed checkpoint (ZeRO 1/2/3, BF16_Optimizer, TP merged by
// universal_checkpoint_info, pipelines) or a UCP, in one pass: per trainable param (a
// <param> of the index with optimizer.exp_avg.<param>) its fp32 master weight, exp_avg and
// exp_avg_sq assembled by the planner from the source's pieces and streamed into
// OUT/zero/<param>/*.pt under the memory budget, step.pt, zero/optimizer_state.pt and the
// copied model states; then, once OUT is committed, <parent of OUT>/latest_universal (the
// basename of OUT, written to a temporary file and renamed). No target is given: the
// output holds every param whole. Under mpirun the param files are shared out among the
// processes like any plan's files (the bytes are the same at any process count); process 0
// writes the rest and commits.
//
// From a checkpoint DeepSpeed did not write: the params with Adam states under torch's
// names (optim.state.<p>.exp_avg / .exp_avg_sq / .step, or optimizer.state.<p>.*, weight
// <p> / model.<p> / module.<p>), Megatron torch_dist's (optimizer.state.exp_avg.<p>,
// optimizer.state.exp_avg_sq.<p>, weight optimizer.state.fp32_param.<p> /
// optimizer.state.param.<p> / <p>), fc's
// DeepSpeed and Megatron names (optimizer.exp_avg.<p>, ..., weight optimizer.fp32.<p> / <p> /
// module.<p>) or PaddlePaddle's (<p>.moment1_0, <p>.moment2_0, weight <p>.w_0 / <p>; the
// beta powers <p>.beta{1,2}_pow_acc_0 stand for the step), each tensor cast to fp32, the
// common step read from the step tensors (Megatron legacy, and torch_dist with common.pt:
// the attribute megatron.optimizer_step, one value) or, for a source that stores none
// (PaddlePaddle, torch_dist without common.pt), given as ucp_step (refused where the source stores one), and
// written as an int,
// and the model states and optimizer state DeepSpeed's universal loader reads written by
// fc (SynthesizedUcpSource, fc/format/ucp_writer.h); tensors without Adam states left out.
// With ucp_fresh_optimizer (a source without Adam states): every floating-point tensor a
// param, its moments zeros (plan pieces without a source) and step 0. With an AOA program
// (aoa_file), the params as the program maps them: it sees each under its UCP name and its
// moments as <name>.exp_avg / <name>.exp_avg_sq, which follow every statement (casts and a
// DeepSpeed source refused: kInvalidArgument).
//
// Refused: a source without Adam states by those names (kInvalidArgument), steps that
// differ between params (kUnimplemented), a param name that is not one path component
// (kInvalidArgument), a DeepSpeed source without fp32 master weights or Adam states
// (kInvalidArgument), TP shards left unmerged
// and MoE (kUnimplemented; TP > 1 without universal_checkpoint_info is written with every
// param's slices concatenated along dim 0 when ucp_inject_missing_state), --simulate-processes
// (kUnimplemented), and the options that shape
// a target (--target-*, --preset, --include/--exclude, --dtype: kInvalidArgument).
#ifndef FC_SRC_OPS_CONVERT_UCP_H_
#define FC_SRC_OPS_CONVERT_UCP_H_

#include <ostream>

#include "fc/core/status.h"
#include "fc/format/output_format.h"
#include "fc/model/checkpoint_index.h"
#include "fc/ops/convert.h"
#include "src/ops/convert_job.h"
#include "src/ops/shared_input.h"

namespace fc {

// The options refused before the input is opened.
Status CheckUcpOptions(const ConvertOptions& options);

// Collective: the job from the opened input `index` (every process plans alike).
Result<ConvertJob> PlanUcp(const ConvertOptions& options, const OutputFormat* format,
                           CheckpointIndex index, SharedInput& input, Communicator& comm);

}  // namespace fc

#endif  // FC_SRC_OPS_CONVERT_UCP_H_
