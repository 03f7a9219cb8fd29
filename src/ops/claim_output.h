// Private to src/ops: claiming OUT for a multi-process run. Process 0 opens the OutputDir
// (lock, checks, a staging directory beside OUT: fc/io/output_dir.h) and every process
// learns the staging path; the outcome is agreed, so a refusal on process 0 stops all.
// OUT's missing parent directories are created first (like mkdir -p), once OUT is known not
// to lie inside the input, so a refused run creates nothing there.
#ifndef FC_SRC_OPS_CLAIM_OUTPUT_H_
#define FC_SRC_OPS_CLAIM_OUTPUT_H_

#include <memory>
#include <string>

#include "fc/comm/communicator.h"
#include "fc/core/status.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"

namespace fc {

struct ClaimedOutput {
  std::unique_ptr<OutputDir> dir;  // process 0 only: removes the staging unless committed
  std::string staging;             // every process
};

inline Result<ClaimedOutput> ClaimOutput(const std::string& output_dir, const std::string& input,
                                         Communicator& comm) {
  ClaimedOutput claimed;
  Status opened_status = Status::Ok();
  if (comm.rank() == 0) {
    opened_status = CheckOutputNotNested(output_dir, input);
    const std::string parent = Dirname(StripTrailingSlashes(output_dir));
    if (opened_status.ok() && !parent.empty() && !IsDirectory(parent)) {
      opened_status = CreateDirectories(parent);
    }
  }
  if (comm.rank() == 0 && opened_status.ok()) {
    auto opened = OutputDir::Open(output_dir, input);
    if (opened.ok()) {
      claimed.dir = std::move(*opened);
      claimed.staging = claimed.dir->staging();
    } else {
      opened_status = opened.status();
    }
  }
  FC_RETURN_IF_ERROR(comm.AllOk(opened_status));
  comm.Broadcast(claimed.staging, 0);
  return claimed;
}

// A dry run's check of OUT: what ClaimOutput would refuse (OUT inside the input, or OUT
// neither absent nor an empty directory), with the same message and exit code; creates,
// locks and writes nothing. An empty output_dir (a dry run without OUT) passes. Agreed over
// comm (process 0 looks).
inline Status CheckOutputClaimable(const std::string& output_dir, const std::string& input,
                                   Communicator& comm) {
  Status checked = Status::Ok();
  if (comm.rank() == 0 && !output_dir.empty()) {
    checked = CheckOutputNotNested(output_dir, input);
    if (checked.ok()) checked = CheckOutputFree(StripTrailingSlashes(output_dir));
  }
  return comm.AllOk(checked);
}

}  // namespace fc

#endif  // FC_SRC_OPS_CLAIM_OUTPUT_H_
