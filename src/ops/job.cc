// The one job path. Contract: src/ops/job.h.
#include "src/ops/job.h"

#include "fc/ops/run_stats.h"
#include "src/ops/claim_output.h"

namespace fc {
namespace {

// The executor writes into this process's part; a process without one only reads (for
// others).
class PartSink : public PlanSink {
 public:
  explicit PartSink(JobPart* part) : part_(part) {}
  Status Write(uint32_t file, uint32_t slot, uint64_t byte_offset,
               std::span<const std::byte> bytes) override {
    if (part_ == nullptr) return InternalError("write item for a process without target files");
    return part_->Write(file, slot, byte_offset, bytes);
  }

 private:
  JobPart* part_;
};

}  // namespace

Status RunJob(const OutputJob& job, const JobRun& run, Communicator& comm, std::ostream& out) {
  RunStatsMeter meter;
  const int me = comm.rank();
  if (run.dry_run) {
    // OUT as the real run would claim it (not nested with the input, absent or empty), with
    // its message; no lock is taken and nothing is created.
    FC_RETURN_IF_ERROR(CheckOutputClaimable(run.output_dir, run.input, comm, run.overwrite));
    if (me == 0) job.PrintPlan(out);
    return Status::Ok();
  }
  const Plan& plan = job.plan();
  const std::vector<uint32_t>& planned = plan.per_process[static_cast<size_t>(me)].files;
  // Process 0 claims OUT; everyone writes into its staging directory; process 0 commits
  // it. Until then, and on any failure, `claimed.dir` removes the staging directory.
  FC_ASSIGN_OR_RETURN(ClaimedOutput claimed,
                      ClaimOutput(run.output_dir, run.input, comm, run.overwrite,
                                  /*writes_here=*/!planned.empty()));
  std::unique_ptr<JobPart> part;
  ExecuteStats executed;
  std::string finished;
  Status written = [&]() -> Status {
    Result<std::unique_ptr<JobPart>> made = job.CreatePart(claimed.staging, planned, me);
    if (made.ok()) part = std::move(*made);
    // Every process enters the executor, or none.
    FC_RETURN_IF_ERROR(comm.AllOk(made.status()));
    ChunkReader reader(job.source());
    FC_RETURN_IF_ERROR(job.WriteBeforeExecute(part.get(), claimed.staging, reader, comm));
    PartSink sink(part.get());
    ExecuteOptions eo;
    eo.comm = &comm;
    eo.process = me;
    eo.what = run.what;
    eo.progress = run.progress;
    FC_ASSIGN_OR_RETURN(executed, Execute(plan, reader, sink, eo));
    meter.InputsDone();
    if (part) {
      FC_ASSIGN_OR_RETURN(finished, part->Finish());
    }
    return Status::Ok();
  }();
  // A failed part lets go of its files now, before process 0 removes the directory.
  if (!written.ok()) part.reset();
  FC_RETURN_IF_ERROR(comm.AllOk(written));
  const std::vector<std::string> parts = comm.Gather(finished, 0);
  Status committed = Status::Ok();
  if (me == 0) committed = job.Commit(part.get(), parts, *claimed.dir, claimed.staging);
  FC_RETURN_IF_ERROR(comm.AllOk(committed));
  if (!run.stats_file.empty()) {
    FC_RETURN_IF_ERROR(WriteRunStats(run.stats_file, run.tool, plan.bytes_needed,
                                     meter.Finish(executed.peak_buffer_bytes, executed.bytes_sent,
                                                  executed.bytes_received), comm));
  }
  return Status::Ok();
}

}  // namespace fc
