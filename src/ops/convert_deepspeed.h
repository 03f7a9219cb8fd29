// Private to src/ops: fc-convert --output-format deepspeed --dp N (RunConvert hands the run
// here).
//
// Writes the DeepSpeed checkpoint (ZeRO stage 1/2/3 or BF16_Optimizer) at data-parallel size N
// (fc/format/deepspeed_writer.h): the new partitions are planned as element ranges of the
// old ones and streamed into their archives by the executor under the memory budget (each
// needed source element read once, padding never read, zeros for the new padding); the
// model states are re-pickled with their storage records copied in bounded blocks; layer
// files and zero_to_fp32.py are copied; `latest` is written last. Everything goes through
// the staging directory of OUT (fc/io/output_dir.h), so a failed run leaves no output.
//
// Refused: a source that is not a DeepSpeed checkpoint, Universal Checkpoints, MoE
// (kUnimplemented, exit 6, from the checks of the index and of the writer); several
// processes (kUnimplemented); the options that shape a target (--target-*, --preset, --aoa,
// --include/--exclude, --dtype, --torch-*: kInvalidArgument).
#ifndef FC_SRC_OPS_CONVERT_DEEPSPEED_H_
#define FC_SRC_OPS_CONVERT_DEEPSPEED_H_

#include <ostream>

#include "fc/core/status.h"
#include "fc/ops/convert.h"

namespace fc {

Result<ConvertSummary> RunConvertDeepSpeed(const ConvertOptions& options, std::ostream& out);

}  // namespace fc

#endif  // FC_SRC_OPS_CONVERT_DEEPSPEED_H_
