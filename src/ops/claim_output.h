// Private to src/ops: claiming OUT for a multi-process run. Process 0 opens the OutputDir
// (lock, checks, a staging directory beside OUT: fc/io/output_dir.h) and every process
// learns the staging path; the outcome is agreed, so a refusal on process 0 stops all.
// OUT's missing parent directories are created first (like mkdir -p), once OUT is known not
// to lie inside the input, so a refused run creates nothing there.
#ifndef FC_SRC_OPS_CLAIM_OUTPUT_H_
#define FC_SRC_OPS_CLAIM_OUTPUT_H_

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "fc/comm/communicator.h"
#include "fc/core/status.h"
#include "fc/format/open.h"
#include "fc/io/env.h"
#include "fc/io/file.h"
#include "fc/io/output_dir.h"

namespace fc {

// --overwrite may replace OUT when it is absent, an empty directory, or a directory that
// holds a checkpoint fc recognizes (DetectCheckpointFormat: an earlier output, say), never
// a file, a symlink or a directory of other things (a typo must not cost a home directory).
// kFailedPrecondition naming OUT and why otherwise.
inline Status CheckReplaceable(const std::string& output_dir) {
  const std::string out = StripTrailingSlashes(output_dir);
  if (!PathExists(out)) return Status::Ok();
  if (DefaultEnv()->Type(out, /*follow=*/false) != EnvFileType::kDirectory) {
    return FailedPreconditionError(out + ": output exists and is not a directory; "
                                   "--overwrite replaces a directory only");
  }
  FC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(out));
  if (names.empty()) return Status::Ok();
  if (Result<CheckpointFormat> found = DetectCheckpointFormat(out); !found.ok()) {
    return FailedPreconditionError(
        out + ": --overwrite replaces a checkpoint directory only, and this one holds no "
        "checkpoint fc recognizes (" + std::to_string(names.size()) + " entries, e.g. '" +
        names.front() + "'); remove it yourself or choose another output directory");
  }
  return Status::Ok();
}

// A refusal of a full OUT, with the flag that would replace it.
inline Status HintOverwrite(Status s) {
  if (s.code() == StatusCode::kFailedPrecondition &&
      s.message().find("output directory exists and is not empty") != std::string::npos) {
    return FailedPreconditionError(s.message() + " (--overwrite replaces a checkpoint there)");
  }
  return s;
}

struct ClaimedOutput {
  std::unique_ptr<OutputDir> dir;  // process 0 only: removes the staging unless committed
  std::string staging;             // every process
};

inline std::string ThisHost() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "localhost";
  return host;
}

// `overwrite`: OUT may be replaced (CheckReplaceable; fc/io/output_dir.h kReplace).
// `writes_here`: this process writes files into the staging directory; it must then see the
// directory process 0 made (OUT on a node-local disk of another host, or a path that names
// another directory here, would otherwise fail only when its first file is created): kNotFound
// (exit 4) naming both processes' hosts, agreed by all.
inline Result<ClaimedOutput> ClaimOutput(const std::string& output_dir, const std::string& input,
                                         Communicator& comm, bool overwrite = false,
                                         bool writes_here = true) {
  ClaimedOutput claimed;
  Status opened_status = Status::Ok();
  if (comm.rank() == 0) {
    opened_status = CheckOutputNotNested(output_dir, input);
    const std::string parent = Dirname(StripTrailingSlashes(output_dir));
    if (opened_status.ok() && !parent.empty() && !IsDirectory(parent)) {
      opened_status = CreateDirectories(parent);
    }
  }
  if (comm.rank() == 0 && opened_status.ok() && overwrite) {
    opened_status = CheckReplaceable(output_dir);
  }
  if (comm.rank() == 0 && opened_status.ok()) {
    auto opened = OutputDir::Open(output_dir, input,
                                  overwrite ? ExistingOutput::kReplace : ExistingOutput::kRefuse);
    if (opened.ok()) {
      claimed.dir = std::move(*opened);
      claimed.staging = claimed.dir->staging();
    } else {
      opened_status = opened.status();
    }
  }
  FC_RETURN_IF_ERROR(comm.AllOk(HintOverwrite(opened_status)));
  comm.Broadcast(claimed.staging, 0);
  std::string claimed_on = ThisHost();
  comm.Broadcast(claimed_on, 0);
  Status visible = Status::Ok();
  if (comm.rank() != 0 && writes_here && !IsDirectory(claimed.staging)) {
    visible = NotFoundError(
        "process " + std::to_string(comm.rank()) + " on host " + ThisHost() + " does not see " +
        claimed.staging + ", the staging directory process 0 made next to " + output_dir +
        " on host " + claimed_on + "; every process that writes must see OUT's parent "
        "directory (put OUT on a file system all hosts share)");
  }
  FC_RETURN_IF_ERROR(comm.AllOk(visible));
  return claimed;
}

// A dry run's check of OUT: what ClaimOutput would refuse (OUT inside the input, or OUT
// neither absent nor an empty directory, or with `overwrite` not replaceable), with the same message and exit code; creates,
// locks and writes nothing. An empty output_dir (a dry run without OUT) passes. Agreed over
// comm (process 0 looks).
inline Status CheckOutputClaimable(const std::string& output_dir, const std::string& input,
                                   Communicator& comm, bool overwrite = false) {
  Status checked = Status::Ok();
  if (comm.rank() == 0 && !output_dir.empty()) {
    checked = CheckOutputNotNested(output_dir, input);
    if (checked.ok()) {
      checked = overwrite ? CheckReplaceable(output_dir)
                          : CheckOutputFree(StripTrailingSlashes(output_dir));
    }
  }
  return comm.AllOk(HintOverwrite(checked));
}

}  // namespace fc

#endif  // FC_SRC_OPS_CLAIM_OUTPUT_H_
