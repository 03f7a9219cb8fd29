#include "fc/comm/communicator.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fc_config.h"

#if FC_HAVE_MPI
#include <mpi.h>
#endif

namespace fc {
namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status AllOk(const Status& local) override { return local; }
  void Broadcast(std::string&, int) override {}
  std::vector<std::string> Gather(const std::string& local, int) override { return {local}; }
};

bool LaunchedByMpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK");
}

#if FC_HAVE_MPI
// MPI counts are ints: large messages go in pieces of at most 1 GiB.
constexpr uint64_t kMaxMessage = 1ull << 30;

void BroadcastBytes(char* data, uint64_t size, int root) {
  for (uint64_t done = 0; done < size; done += kMaxMessage) {
    MPI_Bcast(data + done, static_cast<int>(std::min(kMaxMessage, size - done)), MPI_BYTE, root,
              MPI_COMM_WORLD);
  }
}

void SendBytes(const char* data, uint64_t size, int to) {
  for (uint64_t done = 0; done < size; done += kMaxMessage) {
    MPI_Send(data + done, static_cast<int>(std::min(kMaxMessage, size - done)), MPI_BYTE, to, 0,
             MPI_COMM_WORLD);
  }
}

void ReceiveBytes(char* data, uint64_t size, int from) {
  for (uint64_t done = 0; done < size; done += kMaxMessage) {
    MPI_Recv(data + done, static_cast<int>(std::min(kMaxMessage, size - done)), MPI_BYTE, from,
             0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCommunicator() override { MPI_Finalize(); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status AllOk(const Status& local) override {
    // The lowest failing rank broadcasts its code and message.
    int mine = local.ok() ? INT_MAX : rank_;
    int lowest = INT_MAX;
    MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (lowest == INT_MAX) return Status::Ok();
    int header[2] = {static_cast<int>(local.code()), static_cast<int>(local.message().size())};
    MPI_Bcast(header, 2, MPI_INT, lowest, MPI_COMM_WORLD);
    std::vector<char> text(static_cast<size_t>(header[1]));
    if (rank_ == lowest) text.assign(local.message().begin(), local.message().end());
    MPI_Bcast(text.data(), header[1], MPI_CHAR, lowest, MPI_COMM_WORLD);
    return Status(static_cast<StatusCode>(header[0]),
                  "rank " + std::to_string(lowest) + ": " + std::string(text.begin(), text.end()));
  }

  void Broadcast(std::string& data, int root) override {
    uint64_t size = data.size();
    MPI_Bcast(&size, 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
    data.resize(size);
    BroadcastBytes(data.data(), size, root);
  }

  std::vector<std::string> Gather(const std::string& local, int root) override {
    uint64_t size = local.size();
    std::vector<uint64_t> sizes(rank_ == root ? static_cast<size_t>(size_) : 0);
    MPI_Gather(&size, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
    // Point to point rather than MPI_Gatherv, whose int counts stop at 2 GiB.
    std::vector<std::string> all;
    if (rank_ != root) {
      SendBytes(local.data(), size, root);
      return all;
    }
    all.resize(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      std::string& s = all[static_cast<size_t>(r)];
      if (r == root) {
        s = local;
        continue;
      }
      s.resize(sizes[static_cast<size_t>(r)]);
      ReceiveBytes(s.data(), s.size(), r);
    }
    return all;
  }

 private:
  int rank_ = 0;
  int size_ = 1;
};
#endif

}  // namespace

std::unique_ptr<Communicator> MakeSingleProcessCommunicator() {
  return std::make_unique<SingleProcess>();
}

Communicator& SingleProcessCommunicator() {
  static SingleProcess single;
  return single;
}

Result<std::unique_ptr<Communicator>> MakeCommunicatorFromEnvironment(int* argc, char*** argv) {
  if (!LaunchedByMpi()) return MakeSingleProcessCommunicator();
#if FC_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init(argc, argv);
  return std::unique_ptr<Communicator>(new MpiCommunicator());
#else
  (void)argc;
  (void)argv;
  return UnimplementedError("started under mpirun, but this fc was built without MPI");
#endif
}

}  // namespace fc
