// The NCCL transport. MPI starts the processes and carries the small collectives (AllOk,
// Broadcast, Gather); NCCL carries Exchange's bytes.
//
// Exchange's bytes live in host memory (fc reads them from files and writes them to files),
// so every byte goes host -> device -> NCCL -> device -> host. Device memory stays bounded:
// one staging buffer of kStagingBytes per process, allocated at start-up, through which a
// round moves in steps (the schedule, and why it cannot deadlock: staged_steps.h). The most
// streams any process has in the round, which sets the part size, is agreed by one
// MPI_Allreduce; each step is one ncclGroupStart/ncclGroupEnd of ncclSend/ncclRecv. The
// host <-> device copies are plain cudaMemcpyAsync from pageable memory on the transport's
// stream; no overlap of copies and transfers yet.
//
// Failures. Every CUDA/NCCL error becomes a Status naming the call, the step's peers and
// bytes, and NCCL's own last-error text. A peer that dies mid-step leaves NCCL waiting
// forever, so a step is awaited by polling (cudaStreamQuery, ncclCommGetAsyncError) for at
// most kStepTimeout; then the NCCL communicator is aborted (ncclCommAbort) and Exchange
// fails, and so does every later Exchange. The tool exits non-zero on that error, and
// mpirun ends the other processes (its default when a process fails); the output
// directory is only renamed into place after every process succeeded, so nothing
// complete-looking is left.
//
// Not run on a GPU in this project (no GPU was available): tests/comm/nccl_communicator_test
// and tests/tools/gpu_test.py are the gpu suite, which skips (exit 77) without a device.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "src/comm/staged_steps.h"
#include "src/comm/transport.h"

namespace fc {
namespace {

// CUDA's runtime and NCCL are loaded when --transport nccl is used, not linked: libnccl is
// over 200 MB, and a binary linked to it fails to start under an address-space limit
// (ulimit -v) even when it never uses NCCL. The headers give the types; dlsym gives the
// functions, from the libraries of the major versions fc was built against.
#define FC_CUDA_NCCL_FUNCTIONS(X) \
  X(cudaFree) \
  X(cudaGetDeviceCount) \
  X(cudaGetErrorName) \
  X(cudaGetErrorString) \
  X(cudaMemcpyAsync) \
  X(cudaRuntimeGetVersion) \
  X(cudaSetDevice) \
  X(cudaStreamCreateWithFlags) \
  X(cudaStreamDestroy) \
  X(cudaStreamQuery) \
  X(cudaStreamSynchronize) \
  X(ncclCommAbort) \
  X(ncclCommDestroy) \
  X(ncclCommGetAsyncError) \
  X(ncclCommInitRank) \
  X(ncclGetErrorString) \
  X(ncclGetLastError) \
  X(ncclGetUniqueId) \
  X(ncclGetVersion) \
  X(ncclGroupEnd) \
  X(ncclGroupStart) \
  X(ncclRecv) \
  X(ncclSend)

#define FC_STRINGIFY2(x) #x
#define FC_STRINGIFY(x) FC_STRINGIFY2(x)

// The pointer types come from the headers (decltype), so a signature that differs from the
// installed nccl.h / cuda_runtime_api.h does not compile. The name given to dlsym is the
// name as written here; a header may #define a function to another symbol (cudaMemcpyAsync
// becomes cudaMemcpyAsync_ptsz under CUDA_API_PER_THREAD_DEFAULT_STREAM), and then dlsym
// would find a function of another behaviour: the static_assert refuses to build that.
struct CudaNcclApi {
#define FC_DECLARE(name)                                                              \
  static_assert(std::string_view(FC_STRINGIFY(name)) == #name,                        \
                #name " is a macro in the CUDA/NCCL headers: dlsym would load another " \
                "symbol than the one the header calls");                              \
  decltype(&::name) name = nullptr;
  FC_CUDA_NCCL_FUNCTIONS(FC_DECLARE)
#undef FC_DECLARE
  // Overloaded in C++ (a template for typed pointers): the C function, by its type.
  cudaError_t (*cudaMalloc)(void** pointer, size_t bytes) = nullptr;
};
constexpr const char* kCudartName = "libcudart.so." FC_STRINGIFY(FC_CUDART_MAJOR);
constexpr const char* kNcclName = "libnccl.so." FC_STRINGIFY(NCCL_MAJOR);

// The build's CUDA library directory first, then the loader's search path.
void* OpenLibrary(const char* name, std::string* error) {
  for (const std::string& path : {std::string(FC_CUDA_LIBDIR) + "/" + name, std::string(name)}) {
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* e = dlerror();
    *error = e ? e : path + ": cannot be loaded";
  }
  return nullptr;
}

// Loaded once per process (the handles stay open); the error says which library or
// function is missing.
const Result<CudaNcclApi>& LoadApi() {
  static const Result<CudaNcclApi> api = []() -> Result<CudaNcclApi> {
    std::string error;
    void* cudart = OpenLibrary(kCudartName, &error);
    if (cudart == nullptr) return FailedPreconditionError("cannot load CUDA's runtime: " + error);
    void* nccl = OpenLibrary(kNcclName, &error);
    if (nccl == nullptr) return FailedPreconditionError("cannot load NCCL: " + error);
    CudaNcclApi a;
#define FC_LOAD(name)                                                                    \
  a.name = reinterpret_cast<decltype(a.name)>(                                           \
      dlsym(std::string_view(#name).starts_with("nccl") ? nccl : cudart, #name));        \
  if (a.name == nullptr) {                                                               \
    return FailedPreconditionError(std::string("cannot load ") + #name + " from " +       \
                                   (std::string_view(#name).starts_with("nccl") ? kNcclName \
                                                                                : kCudartName)); \
  }
    FC_CUDA_NCCL_FUNCTIONS(FC_LOAD)
    FC_LOAD(cudaMalloc)
#undef FC_LOAD
    // The libraries' major versions must be the headers': the types above are the
    // headers', and a library of another major version may lay them out differently.
    // Neither call needs a device.
    int cudart_version = 0;
    if (cudaError_t e = a.cudaRuntimeGetVersion(&cudart_version); e != cudaSuccess) {
      return FailedPreconditionError(std::string(kCudartName) +
                                     ": cudaRuntimeGetVersion failed with error " +
                                     std::to_string(static_cast<int>(e)));
    }
    if (cudart_version / 1000 != CUDART_VERSION / 1000) {
      return FailedPreconditionError(std::string(kCudartName) + " is CUDA runtime " +
                                     std::to_string(cudart_version) + ", fc was built against " +
                                     std::to_string(CUDART_VERSION));
    }
    int nccl_version = 0;
    if (ncclResult_t r = a.ncclGetVersion(&nccl_version); r != ncclSuccess) {
      return FailedPreconditionError(std::string(kNcclName) + ": ncclGetVersion failed with " +
                                     std::to_string(static_cast<int>(r)));
    }
    // NCCL_VERSION_CODE is X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after.
    const int nccl_major = nccl_version >= 10000 ? nccl_version / 10000 : nccl_version / 1000;
    if (nccl_major != NCCL_MAJOR) {
      return FailedPreconditionError(std::string(kNcclName) + " is NCCL " +
                                     std::to_string(nccl_version) + ", fc was built against " +
                                     std::to_string(NCCL_VERSION_CODE));
    }
    return a;
  }();
  return api;
}

// Only called after LoadApi() succeeded (CheckCudaDevice, which every path starts with).
const CudaNcclApi& Api() { return *LoadApi(); }

}  // namespace
namespace {

// Device memory per process for Exchange's bytes (a round of any size goes through it in
// steps). 64 MiB is small next to a GPU's memory and large enough that a step's fixed
// costs (a kernel launch, a poll) are small next to moving it.
constexpr uint64_t kStagingBytes = 64ull << 20;
// A step moves at most kStagingBytes each way; one not done after this long means a peer
// died or stopped.
constexpr auto kStepTimeout = std::chrono::seconds(300);

std::string CudaFailure(const char* call, cudaError_t e) {
  return std::string(call) + ": " + Api().cudaGetErrorName(e) + " (" + Api().cudaGetErrorString(e) + ")";
}

std::string NcclFailure(const char* call, ncclResult_t r, ncclComm_t comm) {
  std::string m = std::string(call) + ": " + Api().ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = Api().ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') m += std::string(" (") + last + ")";
  }
  return m;
}

int LocalRank(int rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return rank;
}

// One step's part of one stream, with the messages it comes from or goes to.
struct Part {
  const PeerStream* stream = nullptr;
  std::span<const Communicator::Message> messages;  // the sends or the receives
  uint64_t begin = 0;
  uint64_t size = 0;
  std::byte* device = nullptr;
};

std::string Describe(const Part& p) {
  return std::string(p.stream->send ? "sending " : "receiving ") + std::to_string(p.size) +
         " bytes (bytes " + std::to_string(p.begin) + ".." + std::to_string(p.begin + p.size) +
         " of " + std::to_string(p.stream->size) + ") " + (p.stream->send ? "to" : "from") +
         " rank " + std::to_string(p.stream->peer);
}

std::string Describe(const std::vector<Part>& parts) {
  std::string m;
  for (const Part& p : parts) m += (m.empty() ? "" : ", ") + Describe(p);
  return m;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::unique_ptr<Communicator> control)
      : control_(std::move(control)) {}

  ~NcclCommunicator() override {
    if (comm_ != nullptr) Api().ncclCommDestroy(comm_);
    if (staging_ != nullptr) Api().cudaFree(staging_);
    if (stream_ != nullptr) Api().cudaStreamDestroy(stream_);
    // control_ (MPI) goes after NCCL: it finalises MPI.
  }

  // Local part of start-up: device, stream, staging buffer.
  Status OpenDevice() {
    FC_RETURN_IF_ERROR(CheckCudaDevice());
    int count = 0;
    Api().cudaGetDeviceCount(&count);
    device_ = LocalRank(rank()) % count;
    if (cudaError_t e = Api().cudaSetDevice(device_); e != cudaSuccess) {
      return FailedPreconditionError(CudaFailure("cudaSetDevice", e) + " for device " +
                                     std::to_string(device_));
    }
    if (cudaError_t e = Api().cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
        e != cudaSuccess) {
      stream_ = nullptr;
      return IoError(CudaFailure("cudaStreamCreateWithFlags", e) + " on device " +
                     std::to_string(device_));
    }
    void* staging = nullptr;
    if (cudaError_t e = Api().cudaMalloc(&staging, kStagingBytes); e != cudaSuccess) {
      return ResourceExhaustedError(CudaFailure("cudaMalloc", e) + ": " +
                                    std::to_string(kStagingBytes) +
                                    " bytes of staging on device " + std::to_string(device_));
    }
    staging_ = static_cast<std::byte*>(staging);
    return Status::Ok();
  }

  Status Start() {
    std::string id(sizeof(ncclUniqueId), '\0');
    Status local = OpenDevice();
    if (local.ok() && rank() == 0) {
      ncclUniqueId unique;
      if (ncclResult_t r = Api().ncclGetUniqueId(&unique); r != ncclSuccess) {
        local = IoError(NcclFailure("ncclGetUniqueId", r, nullptr));
      } else {
        std::memcpy(id.data(), &unique, sizeof unique);
      }
    }
    FC_RETURN_IF_ERROR(control_->AllOk(local.With("NCCL start-up")));
    control_->Broadcast(id, 0);
    ncclUniqueId unique;
    std::memcpy(&unique, id.data(), sizeof unique);
    ncclComm_t comm = nullptr;
    Status init = Status::Ok();
    if (ncclResult_t r = Api().ncclCommInitRank(&comm, size(), unique, rank()); r != ncclSuccess) {
      init = IoError(NcclFailure("ncclCommInitRank", r, nullptr) + " (rank " +
                     std::to_string(rank()) + " of " + std::to_string(size()) + ", device " +
                     std::to_string(device_) + ")");
    } else {
      comm_ = comm;  // the destructor releases it, also when another process failed
    }
    // Agreed, like the start-up above: a process whose init failed must not leave the others
    // to find out at their first exchange (as a timeout, without the reason).
    return control_->AllOk(init);
  }

  int rank() const override { return control_->rank(); }
  int size() const override { return control_->size(); }
  Status AllOk(const Status& local) override { return control_->AllOk(local); }
  void Broadcast(std::string& data, int root) override { control_->Broadcast(data, root); }
  std::vector<std::string> Gather(const std::string& local, int root) override {
    return control_->Gather(local, root);
  }

  // Progress counters are control messages: all three go to MPI, never only some (a post
  // without the matching polls would leave messages unreceived).
  void PostCounter(uint64_t value) override { control_->PostCounter(value); }
  std::vector<uint64_t> PollCounters() override { return control_->PollCounters(); }
  std::vector<uint64_t> EndCounters(uint64_t value) override {
    return control_->EndCounters(value);
  }
  Status Exchange(std::span<const Message> sends, std::span<const Message> receives) override {
    Status local = CheckExchangePeers(sends, rank(), size());
    if (local.ok()) local = CheckExchangePeers(receives, rank(), size());
    if (local.ok()) local = broken_;  // an aborted communicator moves nothing more
    FC_RETURN_IF_ERROR(control_->AllOk(local));
    const std::vector<PeerStream> streams = StreamsByPeer(sends, receives);
    int mine = static_cast<int>(streams.size()), most = 0;
    MPI_Allreduce(&mine, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const uint64_t part = StagingPartSize(kStagingBytes, most);
    if (part == 0 && most > 0) {  // the same on every process
      return ResourceExhaustedError(
          "NCCL exchange: a process has " + std::to_string(most) + " peer streams, more than " +
          "the " + std::to_string(kStagingBytes) + "-byte device staging buffer has bytes");
    }
    const uint64_t steps = StepCount(streams, part);
    std::vector<Part> parts;
    for (uint64_t step = 0; step < steps; ++step) {
      parts.clear();
      for (const StagedPart& p : StepParts(streams, part, step)) {
        const PeerStream& s = streams[p.stream];
        parts.push_back(Part{&s, s.send ? sends : receives, p.begin, p.size, staging_ + p.slot});
      }
      FC_RETURN_IF_ERROR(Step(parts));
    }
    return Status::Ok();
  }

 private:
  // Moves one step's parts: stage the sends, one NCCL group, wait, copy the receives out.
  Status Step(const std::vector<Part>& parts) {
    for (const Part& p : parts) {
      if (p.stream->send) FC_RETURN_IF_ERROR(Copy(p, /*to_device=*/true));
    }
    if (ncclResult_t r = Api().ncclGroupStart(); r != ncclSuccess) {
      return Fail(NcclFailure("ncclGroupStart", r, comm_) + " while " + Describe(parts));
    }
    for (const Part& p : parts) {
      const ncclResult_t r =
          p.stream->send ? Api().ncclSend(p.device, p.size, ncclUint8, p.stream->peer, comm_, stream_)
                         : Api().ncclRecv(p.device, p.size, ncclUint8, p.stream->peer, comm_, stream_);
      if (r != ncclSuccess) {
        Api().ncclGroupEnd();
        return Fail(NcclFailure(p.stream->send ? "ncclSend" : "ncclRecv", r, comm_) + " " +
                    Describe(p));
      }
    }
    if (ncclResult_t r = Api().ncclGroupEnd(); r != ncclSuccess && r != ncclInProgress) {
      return Fail(NcclFailure("ncclGroupEnd", r, comm_) + " while " + Describe(parts));
    }
    FC_RETURN_IF_ERROR(Wait(parts));
    for (const Part& p : parts) {
      if (!p.stream->send) FC_RETURN_IF_ERROR(Copy(p, /*to_device=*/false));
    }
    // Copies into pageable host memory return when done; this also reports their errors.
    if (cudaError_t e = Api().cudaStreamSynchronize(stream_); e != cudaSuccess) {
      return Fail(CudaFailure("cudaStreamSynchronize", e) + " after " + Describe(parts));
    }
    return Status::Ok();
  }

  // Copies part `p` between its messages in host memory and its staging slot.
  Status Copy(const Part& p, bool to_device) {
    for (const MessageRange& r : PartRanges(*p.stream, p.begin, p.size)) {
      std::byte* host = p.messages[p.stream->messages[r.message]].bytes.data() + r.offset;
      std::byte* device = p.device + r.at;
      const cudaError_t e =
          to_device ? Api().cudaMemcpyAsync(device, host, r.size, cudaMemcpyHostToDevice, stream_)
                    : Api().cudaMemcpyAsync(host, device, r.size, cudaMemcpyDeviceToHost, stream_);
      if (e != cudaSuccess) {
        return Fail(CudaFailure(to_device ? "cudaMemcpyAsync (host to device)"
                                          : "cudaMemcpyAsync (device to host)",
                                e) +
                    " " + Describe(p));
      }
    }
    return Status::Ok();
  }

  // Waits for the step's NCCL work, polling so that a dead peer cannot hang us forever.
  Status Wait(const std::vector<Part>& parts) {
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      const cudaError_t e = Api().cudaStreamQuery(stream_);
      if (e == cudaSuccess) return Status::Ok();
      if (e != cudaErrorNotReady) {
        return Fail(CudaFailure("cudaStreamQuery", e) + " while " + Describe(parts));
      }
      ncclResult_t async = ncclSuccess;
      if (ncclResult_t r = Api().ncclCommGetAsyncError(comm_, &async); r != ncclSuccess) {
        return Fail(NcclFailure("ncclCommGetAsyncError", r, comm_) + " while " + Describe(parts));
      }
      if (async != ncclSuccess && async != ncclInProgress) {
        return Fail(NcclFailure("NCCL", async, comm_) + " while " + Describe(parts));
      }
      if (std::chrono::steady_clock::now() - start > kStepTimeout) {
        return Fail("NCCL did not finish in " + std::to_string(kStepTimeout.count()) +
                    " s (a peer died or stopped?) while " + Describe(parts));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  // Aborts the NCCL communicator (its kernels may wait forever on a dead peer) and keeps
  // the error: every later Exchange fails with it, on every process (through AllOk).
  Status Fail(std::string message) {
    broken_ = IoError("rank " + std::to_string(rank()) + ": NCCL exchange failed: " + message);
    if (comm_ != nullptr) Api().ncclCommAbort(comm_);
    comm_ = nullptr;
    return broken_;
  }

  std::unique_ptr<Communicator> control_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  std::byte* staging_ = nullptr;
  ncclComm_t comm_ = nullptr;
  Status broken_;
};

}  // namespace

Status LoadCudaNcclApi() { return LoadApi().status(); }

Status CheckCudaDevice() {
  if (!LoadApi().ok()) return LoadApi().status();
  int count = 0;
  if (cudaError_t e = Api().cudaGetDeviceCount(&count); e != cudaSuccess) {
    return FailedPreconditionError("no CUDA device: " + CudaFailure("cudaGetDeviceCount", e));
  }
  if (count <= 0) return FailedPreconditionError("no CUDA device (cudaGetDeviceCount: 0)");
  return Status::Ok();
}

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(std::unique_ptr<Communicator> control) {
  auto nccl = std::make_unique<NcclCommunicator>(std::move(control));
  FC_RETURN_IF_ERROR(nccl->Start());
  return std::unique_ptr<Communicator>(std::move(nccl));
}

}  // namespace fc
