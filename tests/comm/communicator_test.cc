// Communicator collectives across real processes. Run by meson under
// `mpirun -np 3`; every process runs every test case in the same order, so the collectives
// match. Started without mpirun it tests the single-process communicator.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
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

int main(int argc, char** argv) {
  auto comm = fc::MakeCommunicatorFromEnvironment(&argc, &argv);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  g_comm = comm->get();
  return Catch::Session().run(argc, argv);
}
