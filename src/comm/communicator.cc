#include "fc/comm/communicator.h"

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "fc_config.h"

#if FC_HAVE_MPI
#include <mpi.h>
#endif
#include "src/comm/transport.h"

namespace fc {

Status CheckExchangePeers(std::span<const Communicator::Message> messages, int rank, int size) {
  for (const Communicator::Message& m : messages) {
    if (m.peer < 0 || m.peer >= size || m.peer == rank) {
      return InvalidArgumentError("exchange with peer " + std::to_string(m.peer) + " from rank " +
                                  std::to_string(rank) + " of " + std::to_string(size));
    }
  }
  return Status::Ok();
}

namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status AllOk(const Status& local) override { return local; }
  void Broadcast(std::string&, int) override {}
  std::vector<std::string> Gather(const std::string& local, int) override { return {local}; }
  Status Exchange(std::span<const Message> sends, std::span<const Message> receives) override {
    if (!sends.empty() || !receives.empty()) {
      return InvalidArgumentError("a single process has no peer to exchange bytes with");
    }
    return Status::Ok();
  }
  void PostCounter(uint64_t) override {}
  std::vector<uint64_t> PollCounters() override { return {0}; }
  std::vector<uint64_t> EndCounters(uint64_t value) override { return {value}; }
};

// "rank R: " names the failing process, once: an error that already went through an
// agreement (every process failing with it) keeps its prefix.
std::string WithRank(int rank, const std::string& message) {
  if (message.rfind("rank ", 0) == 0) {
    size_t i = 5;
    while (i < message.size() && message[i] >= '0' && message[i] <= '9') ++i;
    if (i > 5 && message.compare(i, 2, ": ") == 0) return message;
  }
  return "rank " + std::to_string(rank) + ": " + message;
}

// The shared state of an in-process group. Every collective is an all-gather of one string
// per member: members post, the last one to arrive publishes the round, and the round is
// closed when every member has taken its copy (two phases, so a fast member cannot post
// into a round others are still reading).
class Hub {
 public:
  explicit Hub(int size) : size_(size), posted_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  std::vector<std::string> AllGather(int rank, std::string mine) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !draining_; });
    posted_[static_cast<size_t>(rank)] = std::move(mine);
    if (++arrived_ == size_) {
      published_ = posted_;
      draining_ = true;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return draining_; });
    }
    std::vector<std::string> all = published_;
    if (++left_ == size_) {
      arrived_ = left_ = 0;
      draining_ = false;
      cv_.notify_all();
    }
    return all;
  }

  void Post(int from, int to, std::span<const std::byte> bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    mail_[{from, to}].emplace_back(bytes.begin(), bytes.end());
  }

  void SetCounter(int rank, uint64_t value) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.resize(static_cast<size_t>(size_), 0);
    counters_[static_cast<size_t>(rank)] = value;
  }
  std::vector<uint64_t> Counters() {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.resize(static_cast<size_t>(size_), 0);
    return counters_;
  }
  void ClearCounters() {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.assign(static_cast<size_t>(size_), 0);
  }

  Status Take(int from, int to, std::span<std::byte> into) {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<std::vector<std::byte>>& box = mail_[{from, to}];
    if (box.empty() || box.front().size() != into.size()) {
      return InternalError("in-process exchange: rank " + std::to_string(to) + " expected " +
                           std::to_string(into.size()) + " bytes from rank " +
                           std::to_string(from) + ", got " +
                           (box.empty() ? std::string("nothing")
                                        : std::to_string(box.front().size())));
    }
    if (!into.empty()) std::memcpy(into.data(), box.front().data(), into.size());
    box.pop_front();
    return Status::Ok();
  }

 private:
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> posted_;
  std::vector<std::string> published_;
  int arrived_ = 0;
  int left_ = 0;
  bool draining_ = false;
  std::map<std::pair<int, int>, std::deque<std::vector<std::byte>>> mail_;
  std::vector<uint64_t> counters_;  // latest posted counts (rank 0's stays 0)
};

class InProcess final : public Communicator {
 public:
  InProcess(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }

  Status AllOk(const Status& local) override {
    std::string mine;
    if (!local.ok()) {
      const int code = static_cast<int>(local.code());
      mine.assign(reinterpret_cast<const char*>(&code), sizeof code);
      mine += local.message();
    }
    const std::vector<std::string> all = hub_->AllGather(rank_, std::move(mine));
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].empty()) continue;
      int code = 0;
      std::memcpy(&code, all[r].data(), sizeof code);
      return Status(static_cast<StatusCode>(code),
                    WithRank(static_cast<int>(r), all[r].substr(sizeof code)));
    }
    return Status::Ok();
  }

  void Broadcast(std::string& data, int root) override {
    data = hub_->AllGather(rank_, rank_ == root ? data : std::string())[static_cast<size_t>(root)];
  }

  std::vector<std::string> Gather(const std::string& local, int root) override {
    std::vector<std::string> all = hub_->AllGather(rank_, local);
    if (rank_ != root) all.clear();
    return all;
  }

  Status Exchange(std::span<const Message> sends, std::span<const Message> receives) override {
    Status peers = CheckExchangePeers(sends, rank_, size());
    if (peers.ok()) peers = CheckExchangePeers(receives, rank_, size());
    if (peers.ok()) {
      for (const Message& m : sends) hub_->Post(rank_, m.peer, m.bytes);
    }
    // Every member's sends are posted before anyone takes its receives.
    FC_RETURN_IF_ERROR(AllOk(peers));
    for (const Message& m : receives) FC_RETURN_IF_ERROR(hub_->Take(m.peer, rank_, m.bytes));
    return Status::Ok();
  }

  void PostCounter(uint64_t value) override {
    if (rank_ != 0) hub_->SetCounter(rank_, value);
  }
  std::vector<uint64_t> PollCounters() override {
    if (rank_ != 0) return {};
    std::vector<uint64_t> all = hub_->Counters();
    all[0] = 0;
    return all;
  }
  std::vector<uint64_t> EndCounters(uint64_t value) override {
    std::vector<uint64_t> all = Communicator::EndCounters(value);  // a gather: all have posted
    if (rank_ == 0) hub_->ClearCounters();
    hub_->AllGather(rank_, {});  // nobody posts into the next run's counters before the clear
    return all;
  }

 private:
  std::shared_ptr<Hub> hub_;
  int rank_;
};

#if FC_HAVE_MPI
// MPI counts are ints: large messages go in pieces of at most 1 GiB.
constexpr uint64_t kMaxMessage = 1ull << 30;
// Exchange's messages, apart from Gather's (tag 0).
constexpr int kExchangeTag = 7;
// Progress counters: {count, final (0 or 1)}, two uint64 words, to rank 0.
constexpr int kCounterTag = 8;

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
  // `funneled`: MPI runs at MPI_THREAD_FUNNELED or above, so the main thread may call it
  // while worker threads run (PostCounter/PollCounters are skipped otherwise).
  explicit MpiCommunicator(bool funneled) : funneled_(funneled) {
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
                  WithRank(lowest, std::string(text.begin(), text.end())));
  }

  void Broadcast(std::string& data, int root) override {
    uint64_t size = data.size();
    MPI_Bcast(&size, 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
    data.resize(size);
    BroadcastBytes(data.data(), size, root);
  }

  Status Exchange(std::span<const Message> sends, std::span<const Message> receives) override {
    FC_RETURN_IF_ERROR(CheckExchangePeers(sends, rank_, size_));
    FC_RETURN_IF_ERROR(CheckExchangePeers(receives, rank_, size_));
    // Messages over 1 GiB go in parts; a pair's parts and messages keep their order (MPI
    // orders messages of one tag between two processes), so one tag serves every part.
    std::vector<MPI_Request> requests;
    auto post = [&](const Message& m, bool send) {
      char* data = reinterpret_cast<char*>(m.bytes.data());
      const uint64_t size = m.bytes.size();
      for (uint64_t done = 0; done < size; done += kMaxMessage) {
        const int count = static_cast<int>(std::min(kMaxMessage, size - done));
        requests.emplace_back();
        if (send) {
          MPI_Isend(data + done, count, MPI_BYTE, m.peer, kExchangeTag, MPI_COMM_WORLD,
                    &requests.back());
        } else {
          MPI_Irecv(data + done, count, MPI_BYTE, m.peer, kExchangeTag, MPI_COMM_WORLD,
                    &requests.back());
        }
      }
    };
    for (const Message& m : receives) post(m, false);
    for (const Message& m : sends) post(m, true);
    MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    return Status::Ok();
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

  void PostCounter(uint64_t value) override {
    if (rank_ == 0 || !funneled_) return;
    if (post_ != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&post_, &done, MPI_STATUS_IGNORE);
      if (!done) return;  // the previous count is still on its way
    }
    post_words_[0] = value;
    post_words_[1] = 0;
    MPI_Isend(post_words_, 2, MPI_UINT64_T, 0, kCounterTag, MPI_COMM_WORLD, &post_);
  }

  std::vector<uint64_t> PollCounters() override {
    if (rank_ != 0) return {};
    Reset();
    if (funneled_) {
      for (;;) {
        int arrived = 0;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, kCounterTag, MPI_COMM_WORLD, &arrived, &status);
        if (!arrived) break;
        ReceiveCounter(status.MPI_SOURCE);
      }
    }
    std::vector<uint64_t> all = counters_;
    all[0] = 0;
    return all;
  }

  std::vector<uint64_t> EndCounters(uint64_t value) override {
    if (rank_ != 0) {
      // The last post first (same tag and pair: MPI keeps their order), then the final.
      if (post_ != MPI_REQUEST_NULL) MPI_Wait(&post_, MPI_STATUS_IGNORE);
      uint64_t words[2] = {value, 1};
      MPI_Send(words, 2, MPI_UINT64_T, 0, kCounterTag, MPI_COMM_WORLD);
      return {};
    }
    Reset();
    int open = 0;
    for (int r = 1; r < size_; ++r) open += ended_[static_cast<size_t>(r)] ? 0 : 1;
    while (open > 0) {
      MPI_Status status;
      MPI_Probe(MPI_ANY_SOURCE, kCounterTag, MPI_COMM_WORLD, &status);
      if (ReceiveCounter(status.MPI_SOURCE)) --open;
    }
    std::vector<uint64_t> all = counters_;
    all[0] = value;
    counters_.clear();
    ended_.clear();
    return all;
  }

 private:
  void Reset() {
    if (counters_.empty()) {
      counters_.assign(static_cast<size_t>(size_), 0);
      ended_.assign(static_cast<size_t>(size_), false);
    }
  }
  // Takes one counter message from `from`; true when it was that rank's final one.
  bool ReceiveCounter(int from) {
    uint64_t words[2] = {0, 0};
    MPI_Recv(words, 2, MPI_UINT64_T, from, kCounterTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    const auto r = static_cast<size_t>(from);
    counters_[r] = words[0];
    if (words[1] == 0 || ended_[r]) return false;
    ended_[r] = true;
    return true;
  }

  int rank_ = 0;
  int size_ = 1;
  const bool funneled_;
  // Rank other than 0: the counter post in flight and its words.
  MPI_Request post_ = MPI_REQUEST_NULL;
  uint64_t post_words_[2] = {0, 0};
  // Rank 0: the latest counts received and which ranks sent their final one (empty between
  // runs).
  std::vector<uint64_t> counters_;
  std::vector<bool> ended_;
};
#endif

}  // namespace

std::vector<uint64_t> Communicator::PollCounters() {
  return rank() == 0 ? std::vector<uint64_t>(static_cast<size_t>(size()), 0)
                     : std::vector<uint64_t>();
}

std::vector<uint64_t> Communicator::EndCounters(uint64_t value) {
  const std::vector<std::string> all =
      Gather(std::string(reinterpret_cast<const char*>(&value), sizeof value), 0);
  std::vector<uint64_t> values(all.size(), 0);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() == sizeof value) std::memcpy(&values[r], all[r].data(), sizeof value);
  }
  return values;
}

bool StartedByMpiLauncher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK");
}

int LauncherRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

Status CheckTransport(Transport transport) {
  if (transport == Transport::kMpi) return Status::Ok();
#if FC_HAVE_NCCL
  return CheckCudaDevice().With("--transport nccl");
#else
  return UnimplementedError("--transport nccl: this fc was built without NCCL (it needs CUDA, "
                            "NCCL and MPI at build time: meson setup -Dnccl=enabled)");
#endif
}

std::unique_ptr<Communicator> MakeSingleProcessCommunicator() {
  return std::make_unique<SingleProcess>();
}

std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(int size) {
  auto hub = std::make_shared<Hub>(std::max(size, 1));
  std::vector<std::unique_ptr<Communicator>> group;
  for (int r = 0; r < hub->size(); ++r) group.push_back(std::make_unique<InProcess>(hub, r));
  return group;
}

Communicator& SingleProcessCommunicator() {
  static SingleProcess single;
  return single;
}

Result<std::unique_ptr<Communicator>> MakeCommunicatorFromEnvironment(int* argc, char*** argv,
                                                                      Transport transport) {
  if (!StartedByMpiLauncher()) return MakeSingleProcessCommunicator();
#if FC_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  // FUNNELED: the main thread calls MPI while worker threads run (progress counters).
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  } else {
    MPI_Query_thread(&provided);
  }
  std::unique_ptr<Communicator> mpi(new MpiCommunicator(provided >= MPI_THREAD_FUNNELED));
  if (transport == Transport::kNccl) {
#if FC_HAVE_NCCL
    // The device check is part of NCCL's start-up, agreed over MPI: one process without a
    // device fails them all with one message.
    return MakeNcclCommunicator(std::move(mpi));
#else
    // Agreed too, so that the processes report it as one error.
    return mpi->AllOk(CheckTransport(transport));
#endif
  }
  return mpi;
#else
  (void)argc;
  (void)argv;
  (void)transport;
  return UnimplementedError("started under mpirun, but this fc was built without MPI");
#endif
}

}  // namespace fc
