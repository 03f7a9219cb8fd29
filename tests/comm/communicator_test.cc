// Communicator collectives across real processes. Run by meson under
// `mpirun -np 3`; every process runs every test case in the same order, so the collectives
// match. Started without mpirun it tests the single-process communicator.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "fc/comm/communicator.h"

namespace {
fc::Communicator* g_comm = nullptr;
}

TEST_CASE("Broadcast copies the root's bytes to every process", "[comm]") {
  fc::Communicator& c = *g_comm;
  const int root = c.size() - 1;  // not always 0
  std::string data = c.rank() == root ? std::string("staging\0dir", 11) : "stale";
  c.Broadcast(data, root);
  CHECK(data == std::string("staging\0dir", 11));
  std::string empty = c.rank() == 0 ? "" : "x";
  c.Broadcast(empty, 0);
  CHECK(empty.empty());
}

TEST_CASE("Gather brings every process's bytes to the root, in rank order", "[comm]") {
  fc::Communicator& c = *g_comm;
  for (int root : {0, c.size() - 1}) {
    // Process r sends r bytes of value r (process 0 sends nothing).
    const std::string mine(static_cast<size_t>(c.rank()), static_cast<char>(c.rank()));
    const std::vector<std::string> all = c.Gather(mine, root);
    if (c.rank() != root) {
      CHECK(all.empty());
      continue;
    }
    REQUIRE(all.size() == static_cast<size_t>(c.size()));
    for (int r = 0; r < c.size(); ++r) {
      CHECK(all[static_cast<size_t>(r)] ==
            std::string(static_cast<size_t>(r), static_cast<char>(r)));
    }
  }
}

TEST_CASE("AllOk reports the lowest failing rank's error everywhere", "[comm]") {
  fc::Communicator& c = *g_comm;
  CHECK(c.AllOk(fc::Status::Ok()).ok());
  const int failing = c.size() - 1;
  const fc::Status local =
      c.rank() == failing ? fc::NotFoundError("no such chunk") : fc::Status::Ok();
  const fc::Status all = c.AllOk(local);
  CHECK(all.code() == fc::StatusCode::kNotFound);
  if (c.size() > 1) {
    CHECK(all.message() == "rank " + std::to_string(failing) + ": no such chunk");
  }
}

namespace {

// Every process sends every other one a message of (10 * from + to) bytes, each byte `from`,
// twice (order per pair is kept), all at once. Returns what was wrong, or "".
std::string ExchangeAllPairs(fc::Communicator& c) {
  const int n = c.size();
  std::vector<std::vector<std::byte>> out, in;
  std::vector<fc::Communicator::Message> sends, receives;
  out.reserve(2 * static_cast<size_t>(n));
  in.reserve(2 * static_cast<size_t>(n));
  for (int round = 0; round < 2; ++round) {
    for (int q = 0; q < n; ++q) {
      if (q == c.rank()) continue;
      out.emplace_back(static_cast<size_t>(10 * c.rank() + q + round),
                       static_cast<std::byte>(c.rank() + 16 * round));
      sends.push_back({q, out.back()});
      in.emplace_back(static_cast<size_t>(10 * q + c.rank() + round));
      receives.push_back({q, in.back()});
    }
  }
  if (fc::Status s = c.Exchange(sends, receives); !s.ok()) return s.ToString();
  for (const fc::Communicator::Message& m : receives) {
    const size_t round = m.bytes.size() - static_cast<size_t>(10 * m.peer + c.rank());
    for (std::byte b : m.bytes) {
      if (b != static_cast<std::byte>(m.peer + 16 * static_cast<int>(round))) {
        return "rank " + std::to_string(c.rank()) + ": wrong byte from " + std::to_string(m.peer);
      }
    }
  }
  // A message to oneself is refused (before anything is posted).
  std::vector<std::byte> self(1);
  const fc::Communicator::Message to_self{c.rank(), self};
  if (c.size() == 1 && c.Exchange({&to_self, 1}, {}).ok()) return "exchange with itself accepted";
  return "";
}

// Progress counters: posts reach rank 0 while nobody waits for anybody, and the collective
// end brings every rank's final count. Returns what was wrong, or "".
std::string CountersRoundTrip(fc::Communicator& c) {
  std::string problem;
  if (c.rank() != 0) {
    c.PostCounter(100 + static_cast<uint64_t>(c.rank()));
  } else {
    // Poll (not blocking) until every rank's post has arrived, for at most 20 s.
    bool all = false;
    for (int tries = 0; tries < 2000 && !all; ++tries) {
      const std::vector<uint64_t> seen = c.PollCounters();
      if (seen.size() != static_cast<size_t>(c.size()) || seen[0] != 0) return "poll size/own";
      all = true;
      for (int r = 1; r < c.size(); ++r) all = all && seen[static_cast<size_t>(r)] == 100u + r;
      if (!all) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!all) problem += "posts never arrived;";
  }
  if (!c.AllOk(problem.empty() ? fc::Status::Ok() : fc::InternalError(problem)).ok()) {
    return problem.empty() ? "another rank: " : problem;
  }
  const std::vector<uint64_t> end = c.EndCounters(1000 + static_cast<uint64_t>(c.rank()));
  if (c.rank() != 0) return end.empty() ? "" : "end on a rank other than 0 not empty";
  for (int r = 0; r < c.size(); ++r) {
    if (end.size() != static_cast<size_t>(c.size()) || end[static_cast<size_t>(r)] != 1000u + r) {
      return "end counts";
    }
  }
  for (uint64_t v : c.PollCounters()) {
    if (v != 0) return "counters not afresh after the end";
  }
  return "";
}

}  // namespace

TEST_CASE("Progress counters: posts arrive without waiting, the end brings every final count",
          "[comm]") {
  CHECK(CountersRoundTrip(*g_comm) == "");
  CHECK(g_comm->AllOk(fc::Status::Ok()).ok());  // nothing left over on the counters' tag
}

TEST_CASE("Exchange moves every pair's messages at once, in order per pair", "[comm]") {
  CHECK(ExchangeAllPairs(*g_comm) == "");
}

TEST_CASE("An in-process group runs the collectives between threads", "[comm]") {
  for (int n : {1, 2, 4}) {
    std::vector<std::unique_ptr<fc::Communicator>> group = fc::MakeInProcessGroup(n);
    std::vector<std::string> problems(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        fc::Communicator& c = *group[static_cast<size_t>(r)];
        std::string& problem = problems[static_cast<size_t>(r)];
        std::string data = r == n - 1 ? "from last" : "";
        c.Broadcast(data, n - 1);
        if (data != "from last") problem += "broadcast;";
        const std::vector<std::string> all = c.Gather(std::string(static_cast<size_t>(r), 'x'), 0);
        if (r == 0 && (all.size() != static_cast<size_t>(n) || all[static_cast<size_t>(n - 1)].size() != static_cast<size_t>(n - 1))) {
          problem += "gather;";
        }
        const fc::Status ok = c.AllOk(r == n - 1 ? fc::NotFoundError("gone") : fc::Status::Ok());
        if (ok.code() != fc::StatusCode::kNotFound) problem += "allok;";
        problem += ExchangeAllPairs(c);
        problem += CountersRoundTrip(c);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < n; ++r) CHECK(problems[static_cast<size_t>(r)] == "");
  }
}

int main(int argc, char** argv) {
  auto comm = fc::MakeCommunicatorFromEnvironment(&argc, &argv);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  g_comm = comm->get();
  return Catch::Session().run(argc, argv);
}
