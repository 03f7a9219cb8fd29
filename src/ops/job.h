// Private to src/ops: the one path of a job that writes an output directory from a plan
// (every entry of fc-convert's output table, fc/format/output_format.h, and fc-export):
//
//   dry run: OUT checked as the run would claim it, the plan printed (process 0); or
//   claim OUT (process 0: lock, staging directory; src/ops/claim_output.h)
//   -> each process's part: a writer of the plan files the plan assigned it
//   -> what the parts write besides the plan's slots (collective; convert's objects)
//   -> Execute (fc/exec/execute.h; every process, in step) -> each part finishes its files
//   -> process 0 adds the job's own files and commits the staging directory onto OUT
//   -> --stats.
// Every step that can fail on one process alone ends in an agreement (Communicator::AllOk),
// so no process waits for one that gave up; a failed run leaves no OUT.
//
// What an output contributes is an OutputJob: its plan (built the same on every process
// before RunJob), the reader of its sources, the dry-run report, its per-process parts and
// its commit.
#ifndef FC_SRC_OPS_JOB_H_
#define FC_SRC_OPS_JOB_H_

#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "fc/comm/communicator.h"
#include "fc/core/status.h"
#include "fc/exec/execute.h"
#include "fc/exec/progress.h"
#include "fc/format/chunk_reader.h"
#include "fc/io/output_dir.h"
#include "fc/model/checkpoint_index.h"
#include "fc/plan/plan.h"

namespace fc {

// One process's writer of the plan files assigned to it (the executor's sink: slots of
// those files only). Destroyed before Finish succeeded, it may leave partial files: process
// 0 removes the staging directory of a failed run.
class JobPart : public PlanSink {
 public:
  // Completes, syncs and closes this part's files. Returns what process 0 needs from this
  // part to commit (fc distcp: the chunk checksums; empty where nothing).
  virtual Result<std::string> Finish() = 0;
};

class OutputJob {
 public:
  virtual ~OutputJob() = default;
  // The plan every process built alike; its files are what the parts write.
  virtual const Plan& plan() const = 0;
  // The checkpoint the plan's pieces read (ChunkReader).
  virtual const CheckpointIndex& source() const = 0;
  // --dry-run's report (process 0 only).
  virtual void PrintPlan(std::ostream& out) const = 0;
  // This process's part: `files` (plan files, this process's, possibly none) into
  // `staging` (shared by every process). Null: this process writes nothing.
  virtual Result<std::unique_ptr<JobPart>> CreatePart(const std::string& staging,
                                                      const std::vector<uint32_t>& files,
                                                      int process) const = 0;
  // Collective, after every part exists and before the executor: what is written besides
  // the plan's slots (convert: the objects, into the part of plan file 0; export: the
  // --copy-from files and --objects into `staging`).
  virtual Status WriteBeforeExecute(JobPart* /*part*/, const std::string& /*staging*/,
                                    ChunkReader& /*reader*/, Communicator& /*comm*/) const {
    return Status::Ok();
  }
  // Process 0, once every part finished: the job's own files into `staging` (copies,
  // metadata), then `output` committed onto OUT, then what follows the commit. `part` is
  // process 0's (may be null); `parts` every process's Finish result, in rank order.
  virtual Status Commit(JobPart* part, std::span<const std::string> parts, OutputDir& output,
                        const std::string& staging) const = 0;
};

struct JobRun {
  std::string tool;        // for --stats: "fc-convert"
  std::string what = "converting";  // the progress label
  std::string output_dir;  // OUT
  std::string input;       // this process's input path (OUT must not lie in it)
  bool overwrite = false;
  bool dry_run = false;
  Progress::Mode progress = Progress::Mode::kAuto;
  std::string stats_file;  // --stats; empty: none
};

// Runs `job` as above (collective). Errors: those of the steps, agreed by every process.
Status RunJob(const OutputJob& job, const JobRun& run, Communicator& comm, std::ostream& out);

}  // namespace fc

#endif  // FC_SRC_OPS_JOB_H_
