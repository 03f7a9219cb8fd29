// The dry run's time estimate: the model (slowest process, bytes over rates), monotonic in
// bytes, and its two lines within 120 columns whatever the figures.
#include <catch2/catch.hpp>

#include <random>
#include <sstream>
#include <string>

#include "src/ops/time_estimate.h"

namespace fc {
namespace {

Plan PlanOf(std::vector<ProcessPlan> processes) {
  Plan plan;
  plan.processes = static_cast<int>(processes.size());
  plan.per_process = std::move(processes);
  return plan;
}

ProcessPlan Bytes(uint64_t read, uint64_t written, uint64_t sent = 0, uint64_t received = 0) {
  ProcessPlan p;
  p.bytes_read = read;
  p.bytes_written = written;
  p.bytes_sent = sent;
  p.bytes_received = received;
  return p;
}

TEST_CASE("EstimateTime: bytes over rates, the slowest process decides", "[ops]") {
  Throughputs rates;
  rates.read = 1e9;
  rates.write = 5e8;
  rates.network = 2e9;
  const Plan one = PlanOf({Bytes(2'000'000'000, 1'000'000'000)});
  CHECK(EstimateTime(one, rates).seconds == Approx(2.0 + 2.0));
  const Plan three = PlanOf({Bytes(1e9, 0, 0, 0), Bytes(1e9, 5e8, 2e9, 2e9), Bytes(0, 1e9)});
  const TimeEstimate e = EstimateTime(three, rates);
  CHECK(e.slowest_process == 1);
  CHECK(e.seconds == Approx(1.0 + 1.0 + 2.0));
  CHECK(e.moved == 4'000'000'000);
  CHECK(EstimateTime(PlanOf({}), rates).seconds == 0);
}

TEST_CASE("EstimateTime is monotonic in every process's bytes", "[ops]") {
  std::mt19937_64 rng(11);
  Throughputs rates;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ProcessPlan> processes;
    const size_t n = 1 + rng() % 5;
    for (size_t p = 0; p < n; ++p) {
      processes.push_back(Bytes(rng() % (1ull << 40), rng() % (1ull << 40), rng() % (1ull << 36),
                                rng() % (1ull << 36)));
    }
    Plan plan = PlanOf(processes);
    const double before = EstimateTime(plan, rates).seconds;
    ProcessPlan& grown = plan.per_process[rng() % n];
    const uint64_t more = 1 + rng() % (1ull << 30);
    switch (rng() % 4) {
      case 0: grown.bytes_read += more; break;
      case 1: grown.bytes_written += more; break;
      case 2: grown.bytes_sent += more; break;
      default: grown.bytes_received += more; break;
    }
    CHECK(EstimateTime(plan, rates).seconds >= before);
  }
}

TEST_CASE("time estimate lines fit 120 columns and name the rates' origin", "[ops]") {
  std::string line;
  std::vector<ProcessPlan> many;
  for (int p = 0; p < 1024; ++p) {
    many.push_back(Bytes(uint64_t{1} << 50, uint64_t{1} << 50, uint64_t{1} << 49, 1ull << 49));
  }
  // As MeasureThroughputs words it at its longest (the name elided to 18 characters), and
  // a longer one than it ever makes.
  Throughputs rates;
  rates.read = 12345.6e6;
  rates.read_measured = "64.0 MiB of model-000...tensors in 0.20 s";
  Throughputs absurd = rates;
  absurd.read_measured = "64 MiB of " + std::string(300, 'x') + ".distcp in 0.01 s";
  for (const Plan& plan : {PlanOf(many), PlanOf({Bytes(10, 10)})}) {
    std::ostringstream wide;
    PrintTimeEstimate(plan, absurd, wide);
    for (std::istringstream lines(wide.str()); std::getline(lines, line);) {
      CHECK(line.size() <= 120);
    }
    std::ostringstream out;
    PrintTimeEstimate(plan, rates, out);
    std::istringstream lines(out.str());
    int count = 0;
    while (std::getline(lines, line)) {
      ++count;
      CHECK(line.size() <= 120);
    }
    CHECK(count == 2);
    CHECK_THAT(out.str(), Catch::StartsWith("time estimate: "));
    CHECK_THAT(out.str(), Catch::Contains("read 12346 MB/s") || Catch::Contains("read 12.3 GB/s"));
    CHECK_THAT(out.str(), Catch::Contains("(measured: 64.0 MiB of model-000") &&
                              Catch::Contains("write 500 MB/s") && Catch::EndsWith(" assumed\n"));
  }
  CHECK(HumanSeconds(0.01) == "under 0.1 s");
  CHECK(HumanSeconds(1.26) == "1.3 s");
  CHECK(HumanSeconds(250) == "4 min 10 s");
  CHECK(HumanSeconds(7500) == "2 h 05 min");
}

}  // namespace
}  // namespace fc
