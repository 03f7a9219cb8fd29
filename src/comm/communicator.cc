#include "fc/comm/communicator.h"

#include <climits>
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
};

bool LaunchedByMpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK");
}

#if FC_HAVE_MPI
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

 private:
  int rank_ = 0;
  int size_ = 1;
};
#endif

}  // namespace

std::unique_ptr<Communicator> MakeSingleProcessCommunicator() {
  return std::make_unique<SingleProcess>();
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
