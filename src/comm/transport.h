// What comm/'s transports share, private to comm/. The NCCL transport
// (nccl_communicator.cc) is built only where CUDA, NCCL and MPI are found (FC_HAVE_NCCL),
// so that nothing else sees nccl.h or cuda_runtime.h; MakeCommunicatorFromEnvironment
// (communicator.cc) is its only user.
#ifndef FC_SRC_COMM_TRANSPORT_H_
#define FC_SRC_COMM_TRANSPORT_H_

#include <memory>
#include <span>

#include "fc/comm/communicator.h"
#include "fc_config.h"

namespace fc {

// Exchange's argument check, the same for every transport: kInvalidArgument naming a peer
// out of [0, size) or `rank` itself.
Status CheckExchangePeers(std::span<const Communicator::Message> messages, int rank, int size);

#if FC_HAVE_NCCL

// Loads CUDA's runtime and NCCL (dlopen: libcudart.so.<major>, libnccl.so.<major> of the
// headers fc was built against, the build's CUDA lib64 first) and resolves every function
// the transport calls; checks that the libraries' major versions are the headers'. Needs no
// device. kFailedPrecondition naming the library, the function or both versions. Loaded
// once per process; later calls return the first result.
Status LoadCudaNcclApi();

// OK when CUDA finds at least one device; kFailedPrecondition naming cudaGetDeviceCount's
// error (no driver, no device) otherwise. Local: no other process takes part.
Status CheckCudaDevice();

// Collective over `control`, an MPI communicator of the processes that will exchange bytes
// (kept: it carries AllOk, Broadcast and Gather and is closed after NCCL). Picks the
// device (local rank % device count), makes the NCCL communicator (rank 0's unique id
// broadcast over `control`) and returns a communicator whose Exchange goes over NCCL.
// Errors name the CUDA/NCCL call and its error string; a device that is missing on any
// process is reported on every process (agreed over `control`); a failure inside
// ncclCommInitRank is local (the others may still wait in it: the process exits and
// mpirun ends the job).
Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(std::unique_ptr<Communicator> control);
#endif

}  // namespace fc

#endif  // FC_SRC_COMM_TRANSPORT_H_
