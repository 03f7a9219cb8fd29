// The NCCL transport's Exchange across real processes (gpu suite). Run by meson under
// `mpirun -np 2`; every process runs every test case in the same order, so the collectives
// match. Exits 77 (skipped) when not started by mpirun, when fc was built without NCCL, or
// when CUDA finds no device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "fc/comm/communicator.h"

namespace {

fc::Communicator* g_comm = nullptr;

// The device staging buffer of src/comm/nccl_communicator.cc (kStagingBytes), which a
// message longer than this must cross in several steps.
constexpr size_t kStagingBytes = 64u << 20;

std::byte Pattern(int from, int to, size_t message, size_t i) {
  return static_cast<std::byte>((from * 131 + to * 17 + message * 7 + i * 13 + (i >> 9)) & 0xff);
}

// Every process sends every other one the messages sizes(from, to) (in that order) and
// receives theirs, all in one Exchange. Returns what was wrong, or "".
template <typename Sizes>
std::string ExchangeAllPairs(fc::Communicator& c, Sizes sizes) {
  std::vector<std::vector<std::byte>> out, in;
  std::vector<fc::Communicator::Message> sends, receives;
  std::vector<std::vector<size_t>> from_peer;  // per receive: peer, message index
  for (int q = 0; q < c.size(); ++q) {
    if (q == c.rank()) continue;
    const std::vector<size_t> to_q = sizes(c.rank(), q), from_q = sizes(q, c.rank());
    for (size_t k = 0; k < to_q.size(); ++k) {
      out.emplace_back(to_q[k]);
      for (size_t i = 0; i < to_q[k]; ++i) out.back()[i] = Pattern(c.rank(), q, k, i);
    }
    for (size_t k = 0; k < from_q.size(); ++k) {
      in.emplace_back(from_q[k], std::byte{0});
      from_peer.push_back({static_cast<size_t>(q), k});
    }
  }
  size_t o = 0, r = 0;
  for (int q = 0; q < c.size(); ++q) {
    if (q == c.rank()) continue;
    for (size_t k = 0; k < sizes(c.rank(), q).size(); ++k) sends.push_back({q, out[o++]});
    for (size_t k = 0; k < sizes(q, c.rank()).size(); ++k) receives.push_back({q, in[r++]});
  }
  if (fc::Status s = c.Exchange(sends, receives); !s.ok()) return s.ToString();
  for (size_t m = 0; m < receives.size(); ++m) {
    const int peer = static_cast<int>(from_peer[m][0]);
    for (size_t i = 0; i < receives[m].bytes.size(); ++i) {
      if (receives[m].bytes[i] != Pattern(peer, c.rank(), from_peer[m][1], i)) {
        return "rank " + std::to_string(c.rank()) + ": message " + std::to_string(from_peer[m][1]) +
               " from rank " + std::to_string(peer) + ": wrong byte at " + std::to_string(i);
      }
    }
  }
  return "";
}

}  // namespace

TEST_CASE("NCCL Exchange: all pairs, several odd-sized messages per pair, in order", "[nccl]") {
  fc::Communicator& c = *g_comm;
  CHECK(ExchangeAllPairs(c, [](int from, int to) {
          return std::vector<size_t>{1, 3, 0, 4097 + static_cast<size_t>(from),
                                     1000003 + static_cast<size_t>(7 * to), 255};
        }) == "");
}

TEST_CASE("NCCL Exchange: a message longer than the device staging buffer", "[nccl]") {
  fc::Communicator& c = *g_comm;
  // Both directions at once, next to small messages (parts of unequal streams).
  CHECK(ExchangeAllPairs(c, [](int from, int) {
          return std::vector<size_t>{kStagingBytes + 4099 + static_cast<size_t>(from), 17};
        }) == "");
  // One direction only: rank 0 sends 2.5 staging buffers, the others send nothing.
  CHECK(ExchangeAllPairs(c, [](int from, int) {
          return from == 0 ? std::vector<size_t>{5 * kStagingBytes / 2 + 1} : std::vector<size_t>{};
        }) == "");
}

TEST_CASE("NCCL Exchange: empty lists and empty messages", "[nccl]") {
  fc::Communicator& c = *g_comm;
  CHECK(c.Exchange({}, {}).ok());
  CHECK(ExchangeAllPairs(c, [](int, int) { return std::vector<size_t>{0, 0}; }) == "");
  // Only some processes have anything: the others still take part.
  CHECK(ExchangeAllPairs(c, [&](int from, int to) {
          return from == 1 && to == 0 ? std::vector<size_t>{12345} : std::vector<size_t>{};
        }) == "");
}

TEST_CASE("NCCL Exchange: a bad peer fails on every process and the transport goes on", "[nccl]") {
  fc::Communicator& c = *g_comm;
  std::vector<std::byte> one(1);
  const fc::Communicator::Message bad{c.size(), one};
  const fc::Status s = c.rank() == 0 ? c.Exchange({&bad, 1}, {}) : c.Exchange({}, {});
  CHECK(s.code() == fc::StatusCode::kInvalidArgument);
  CHECK(s.message().find("rank 0: exchange with peer " + std::to_string(c.size())) == 0);
  CHECK(ExchangeAllPairs(c, [](int, int) { return std::vector<size_t>{99}; }) == "");
}

TEST_CASE("NCCL communicator: collectives go over MPI", "[nccl]") {
  fc::Communicator& c = *g_comm;
  std::string data = c.rank() == c.size() - 1 ? "from last" : "";
  c.Broadcast(data, c.size() - 1);
  CHECK(data == "from last");
  const std::vector<std::string> all = c.Gather(std::string(static_cast<size_t>(c.rank()), 'x'), 0);
  if (c.rank() == 0) {
    REQUIRE(all.size() == static_cast<size_t>(c.size()));
    CHECK(all.back().size() == static_cast<size_t>(c.size() - 1));
  }
  CHECK(c.AllOk(c.rank() == 1 ? fc::NotFoundError("gone") : fc::Status::Ok()).code() ==
        fc::StatusCode::kNotFound);
}

int main(int argc, char** argv) {
  if (!fc::StartedByMpiLauncher()) {
    std::printf("skipping: run under mpirun -np 2 (meson test does)\n");
    return 77;
  }
  if (fc::Status s = fc::CheckTransport(fc::Transport::kNccl); !s.ok()) {
    std::printf("skipping: %s\n", s.ToString().c_str());
    return 77;
  }
  auto comm = fc::MakeCommunicatorFromEnvironment(&argc, &argv, fc::Transport::kNccl);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  g_comm = comm->get();
  if (g_comm->size() < 2) {
    std::fprintf(stderr, "needs at least 2 processes, got %d\n", g_comm->size());
    return 1;
  }
  return Catch::Session().run(argc, argv);
}
