// A checkpoint read by several processes that may each see only some of its files
// (node-local disks). Private to ops/.
//
// The input path may contain `{rank}` (the process's rank) and `{node}` (the index of its
// host among the job's hosts, in host-name order), expanded per process; only in the
// directory part. With one process and no placeholders nothing changes. Otherwise
// ShareInput (collective):
//   1. every process lists the regular files of its expansion and of its subdirectories, 4
//      levels down (relative paths, sizes);
//   2. process 0 merges the listings (a name with two different sizes is an error naming
//      both processes) and broadcasts the union;
//   3. metadata files (`.metadata`, `*.metadata`, `*.json`, `latest`) are read by the lowest
//      process that has them and broadcast (4 GiB in all; beyond, they stay like data files);
//   4. an InputViewEnv (fc/io/input_view_env.h) installed as DefaultEnv() serves the union
//      under the input path as given, so every process opens the same checkpoint.
// ShareVisibility (collective, after the checkpoint is open) says which processes can read
// each of its files, for the planner.
#ifndef FC_SRC_OPS_SHARED_INPUT_H_
#define FC_SRC_OPS_SHARED_INPUT_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fc/comm/communicator.h"
#include "fc/format/open.h"
#include "fc/core/status.h"
#include "fc/exec/parallel.h"
#include "fc/io/env.h"
#include "fc/io/input_view_env.h"
#include "fc/model/checkpoint_index.h"
#include "fc/plan/plan.h"

namespace fc {

struct SharedInput {
  std::string path;        // what to open: the input as given
  std::string local_path;  // this process's expansion of it
  std::unique_ptr<InputViewEnv> view;        // null: nothing shared (one process, no placeholders)
  std::unique_ptr<ScopedEnvOverride> scope;  // installs `view` while it lives
};

// `pattern` with {rank} and {node} replaced.
std::string ExpandInputPath(const std::string& pattern, int rank, int node);

Result<SharedInput> ShareInput(const std::string& input, Communicator& comm);

// Collective: the checkpoint (fc/format/open.h) opened on every process. Torch DCP and fc
// distcp open from their metadata alone, on every process at once (when a process missed a
// read of a file another has, as torch DCP reads Megatron's common.pt and flat optimizer
// states, all open it again as below). The other formats read
// data files when they open (safetensors headers, DeepSpeed, Megatron and Paddle pickles);
// when some file is not on every process's disk, process 0 opens first while the others
// serve what it reads of such files: each read is done by the lowest process that has the
// file and broadcast, so every process holds it; then the others open from those bytes, in
// the format process 0 detected.
// At most 4 GiB are fetched so (kResourceExhausted beyond).
Result<CheckpointIndex> OpenSharedCheckpoint(SharedInput& input, const OpenOptions& options,
                                             Communicator& comm);

// Per file of `index`: the increasing ranks that can read it; empty when nothing is shared.
Result<std::vector<std::vector<int>>> ShareVisibility(const CheckpointIndex& index,
                                                      SharedInput& input, Communicator& comm);

// For a plan of `processes` processes that are not started: every file visible to the
// process (its source rank mod processes), the source rank being the first number in the
// file's name (files without one: everyone); `shared`: every file to everyone.
std::vector<std::vector<int>> SimulatedVisibility(const CheckpointIndex& index, int processes,
                                                  bool shared);

// Collective: the worker threads and memory budget every process plans with. Plans must be
// identical on every process (they exchange data by them) while machines may differ, so
// process 0 decides: the requested values, or by default the cores (at most 8) and a quarter
// of the memory of its machine, each shared among the processes on that machine
// (OMPI_COMM_WORLD_LOCAL_SIZE).
struct PlanResources {
  int threads = 1;
  uint64_t memory_budget = 0;
};
PlanResources AgreeOnResources(int requested_threads, uint64_t requested_budget,
                               Communicator& comm);

// `options` (ConvertOptions, ExportOptions: `threads`, `memory_budget`) with the threads
// and budget every process plans with (AgreeOnResources).
template <typename Options>
Options PlannedWith(const Options& options, Communicator& comm) {
  Options planned = options;
  const PlanResources r = AgreeOnResources(options.threads, options.memory_budget, comm);
  planned.threads = r.threads;
  planned.memory_budget = r.memory_budget;
  return planned;
}

// Sets what `request` plans the workers with from `options` (ConvertOptions,
// ExportOptions): the worker threads, the memory budget (by default a quarter of the
// physical memory) and each worker's direct IO buffer under the current IoPolicy.
template <typename Options>
void SetWorkerResources(const Options& options, PlanRequest& request) {
  request.threads = WorkerThreads(options.threads);
  request.memory_budget =
      options.memory_budget ? options.memory_budget : PhysicalMemoryBytes() / 4;
  request.io_buffer_bytes = DirectIoBufferBytes();
}

// kNotFound naming the first file a piece of `request` reads from that no process sees.
Status CheckNeededFilesVisible(const PlanRequest& request, const CheckpointIndex& index);

}  // namespace fc

#endif  // FC_SRC_OPS_SHARED_INPUT_H_
