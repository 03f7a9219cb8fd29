// Communicator: what fc's tools need from a multi-process run, behind a narrow interface so
// that no public header includes mpi.h. One process is a Communicator of size 1.
//
// Transports: single process; MPI (processes started by mpirun/srun); in-process (a group of
// communicators for threads of one process, for tests); NCCL (under mpirun, in builds with
// CUDA and NCCL: MPI starts it and carries the small collectives, NCCL carries Exchange's
// bytes, staged from host memory through a bounded device buffer; see README). MPI is the
// default: fc's bytes live in host memory, and NCCL only pays where the network is one
// NCCL drives better than MPI does (e.g. GPUDirect RDMA over InfiniBand).
//
// Thread-safety: call from the main thread only (for an in-process group: each member from
// its own thread).
#ifndef FC_COMM_COMMUNICATOR_H_
#define FC_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fc/core/status.h"

namespace fc {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective: every rank passes its local status; every rank gets OK when all were OK,
  // otherwise the error of the lowest failing rank, prefixed "rank R: " (when size > 1).
  virtual Status AllOk(const Status& local) = 0;
  // Collective: every rank gets `data` as `root` passed it (other ranks' `data` is replaced).
  virtual void Broadcast(std::string& data, int root) = 0;
  // Collective: `root` gets every rank's `local` in rank order; other ranks get an empty
  // vector. Bytes are carried as they are (std::string as a byte container).
  virtual std::vector<std::string> Gather(const std::string& local, int root) = 0;

  // One message to or from a peer (never this process itself).
  struct Message {
    int peer = 0;
    std::span<std::byte> bytes;  // sends: read; receives: filled, size known in advance
  };
  // Collective in the sense that every process calls it once per exchange round (with
  // possibly empty lists): posts every receive and send at once, non-blocking, and returns
  // when all have completed, so that all pairs move at the same time. Each send must be
  // matched by a receive of the same size on the peer, in the same order per pair.
  // Errors: kInvalidArgument for a peer out of range or this process itself. A transport
  // failure (a peer that died) ends the job (MPI's default error handler) or, with NCCL,
  // is an error naming the call, peer and bytes, after which the communicator refuses
  // further exchanges (the caller's process exits non-zero and mpirun ends the others).
  virtual Status Exchange(std::span<const Message> sends, std::span<const Message> receives) = 0;

  // Progress counters: each rank's running count (bytes written) shown by rank 0 while the
  // work runs, without making anyone wait. Main thread only, like the rest; worker threads
  // may run meanwhile (MPI is initialised for that, or the posts are skipped).
  // Not collective: a rank other than 0 posts its latest count to rank 0 and returns at once
  // (a post while its previous one is still in flight is dropped; a later one carries the
  // newer count). Rank 0: no-op. Default: no-op.
  virtual void PostCounter(uint64_t value) { (void)value; }
  // Not collective, rank 0: the latest count each rank posted so far (index: rank; 0 before
  // its first post, rank 0's entry 0), taking what has arrived without waiting. Other ranks:
  // empty. Default: all zeros on rank 0.
  virtual std::vector<uint64_t> PollCounters();
  // Collective, once after a run's posts: rank 0 gets every rank's final `value` (index:
  // rank) once every post has arrived and every send has completed; other ranks get an
  // empty vector. Counters start afresh after it. Default: a Gather.
  virtual std::vector<uint64_t> EndCounters(uint64_t value);
};

// A communicator of size 1.
std::unique_ptr<Communicator> MakeSingleProcessCommunicator();
// A shared one (stateless, safe from any thread), for "no communicator given".
Communicator& SingleProcessCommunicator();

// `size` communicators that talk through shared memory, one per thread of a test; member r
// has rank r. The group lives as long as any member.
std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(int size);

// What carries Exchange's bytes between processes started by mpirun.
enum class Transport { kMpi, kNccl };

// Whether this process was started by mpirun/srun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK set).
bool StartedByMpiLauncher();
// This process's rank as the launcher set it (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK),
// readable before MPI is initialised: which process reports an error found that early.
// 0 when not set.
int LauncherRank();

// OK when `transport` can run in this process. kMpi: always (whether the build has MPI is
// MakeCommunicatorFromEnvironment's error). kNccl: kUnimplemented when fc was built without
// NCCL (or without MPI, which starts it); kFailedPrecondition when CUDA finds no device
// (naming CUDA's error). Initialises no MPI, opens no NCCL communicator.
Status CheckTransport(Transport transport);

// MPI when this process was started by mpirun/srun and fc was built with MPI; a
// single-process communicator otherwise (`transport` then does not matter). Initialises MPI;
// the returned object finalises it when destroyed. With Transport::kNccl the collectives go
// over MPI and Exchange over NCCL, on device (local rank % device count), local rank from
// OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or MPI_LOCALRANKID (else the rank).
// Errors: kUnimplemented when started under mpirun but built without MPI; with kNccl,
// CheckTransport's errors and a failed NCCL start-up (naming the call), agreed between the
// processes ("rank R: ...", the same on every process) except a failure inside
// ncclCommInitRank, which only the process it happened in reports (the others may still
// wait in it: mpirun ends them when that process exits).
Result<std::unique_ptr<Communicator>> MakeCommunicatorFromEnvironment(
    int* argc, char*** argv, Transport transport = Transport::kMpi);

}  // namespace fc

#endif  // FC_COMM_COMMUNICATOR_H_
