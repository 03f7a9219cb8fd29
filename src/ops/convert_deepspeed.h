// Private to src/ops: fc-convert --output-format deepspeed --dp N, planned here (RunConvert
// runs the job through the one job path, src/ops/job.h).
//
// Writes the DeepSpeed checkpoint (ZeRO stage 1/2/3 or BF16_Optimizer) at data-parallel size N
// (fc/format/deepspeed_writer.h): the new partitions are planned as element ranges of the
// old ones and streamed into their archives by the executor under the memory budget (each
// needed source element read once, padding never read, zeros for the new padding); the
// model states are re-pickled with their storage records copied in bounded blocks; layer
// files and zero_to_fp32.py are copied; `latest` is written last. Everything goes through
// the staging directory of OUT (fc/io/output_dir.h), so a failed run leaves no output.
// Under mpirun the streamed archives are shared out among the processes like any plan's
// files (the bytes are the same at any process count); process 0 writes the archives that
// are only copied, the copies and `latest`, and commits.
//
// Refused: a source that is not a DeepSpeed checkpoint, Universal Checkpoints, MoE
// (kUnimplemented, exit 6, from the checks of the index and of the writer);
// --simulate-processes (kUnimplemented); the options that shape a target (--target-*, --preset, --aoa,
// --include/--exclude, --dtype, --torch-*: kInvalidArgument).
#ifndef FC_SRC_OPS_CONVERT_DEEPSPEED_H_
#define FC_SRC_OPS_CONVERT_DEEPSPEED_H_

#include <ostream>

#include "fc/core/status.h"
#include "fc/format/output_format.h"
#include "fc/model/checkpoint_index.h"
#include "fc/ops/convert.h"
#include "src/ops/convert_job.h"
#include "src/ops/shared_input.h"

namespace fc {

// The options refused before the input is opened.
Status CheckDeepSpeedOptions(const ConvertOptions& options);

// Collective: the job from the opened input `index` (checked; the re-partition is laid out
// from the source's files, fc/format/deepspeed_writer.h).
Result<ConvertJob> PlanDeepSpeed(const ConvertOptions& options, const OutputFormat* format,
                                 CheckpointIndex index, SharedInput& input, Communicator& comm);

}  // namespace fc

#endif  // FC_SRC_OPS_CONVERT_DEEPSPEED_H_
