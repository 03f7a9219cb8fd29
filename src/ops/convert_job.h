// Private to src/ops: an fc-convert output planned (RunConvert, fc/ops/convert.h), one
// planner per shape of the output table (fc/format/output_format.h), all run by the one
// job path (src/ops/job.h).
#ifndef FC_SRC_OPS_CONVERT_JOB_H_
#define FC_SRC_OPS_CONVERT_JOB_H_

#include <memory>

#include "fc/comm/communicator.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/ops/convert.h"
#include "src/ops/job.h"
#include "src/ops/shared_input.h"

namespace fc {

struct ConvertJob {
  std::unique_ptr<OutputJob> job;
  ConvertSummary summary;  // what RunConvert returns (also for --dry-run)
};

}  // namespace fc

#endif  // FC_SRC_OPS_CONVERT_JOB_H_
