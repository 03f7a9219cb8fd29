// The multi-process data path without MPI: three "processes" (threads of an in-process
// communicator group) execute one plan whose source files each lie on one process's disk.
// Each process's ChunkReader sees only its own files (the others are renamed away in its
// copy of the index), so a read the balancer did not give it fails. The bytes written must
// equal a one-process run's, and what was sent must equal what was received.
#include <catch2/catch.hpp>


#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "fc/comm/communicator.h"
#include "fc/exec/execute.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/io/file.h"
#include "fc/plan/plan.h"
#include "tests/support/temp_dir.h"
#include "tests/format/fcdistcp/arange_checkpoint.h"

namespace fc {
namespace {

// Every write, by (file, slot, offset).
class MemorySink : public PlanSink {
 public:
  Status Write(uint32_t file, uint32_t slot, uint64_t byte_offset,
               std::span<const std::byte> bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    written_[{file, slot, byte_offset}].assign(bytes.begin(), bytes.end());
    return Status::Ok();
  }
  std::map<std::tuple<uint32_t, uint32_t, uint64_t>, std::vector<std::byte>> written_;
  std::mutex mu_;
};

// The bytes of every slot, from the writes (offsets within a slot never overlap).
std::map<std::pair<uint32_t, uint32_t>, std::vector<std::byte>> Slots(const MemorySink& sink) {
  std::map<std::pair<uint32_t, uint32_t>, std::vector<std::byte>> slots;
  for (const auto& [where, bytes] : sink.written_) {
    auto& s = slots[{std::get<0>(where), std::get<1>(where)}];
    const uint64_t end = std::get<2>(where) + bytes.size();
    if (s.size() < end) s.resize(end);
    std::copy(bytes.begin(), bytes.end(), s.begin() + static_cast<std::ptrdiff_t>(std::get<2>(where)));
  }
  return slots;
}

PlanRequest Request(const CheckpointIndex& index, int processes, uint64_t budget) {
  const TensorEntry* w = index.FindTensor("w");
  REQUIRE(w != nullptr);
  PlanRequest r;
  r.kind = PlanKind::kConvert;
  // w as is, and t = w^T (a transposed piece, read whole).
  SourcePiece same{w, Box::Whole(w->global_shape), Box::Whole(w->global_shape), {}};
  const Shape t_shape = {w->global_shape[1], w->global_shape[0]};
  SourcePiece transposed{w, Box::Whole(w->global_shape), Box::Whole(t_shape),
                         {{PieceOp::Kind::kPermute, {}, {}, {}}}};
  r.tensors.push_back({"w", DType::kFloat32, w->global_shape, {same}});
  r.tensors.push_back({"t", DType::kFloat32, t_shape, {transposed}});
  // Target: w cut into 4 column blocks, t into 2 row blocks, one file each.
  for (int64_t c = 0; c < 4; ++c) {
    r.files.push_back({"w" + std::to_string(c), {{0, Box{{0, 3 * c}, {40, 3}}, std::nullopt}}});
  }
  for (int64_t c = 0; c < 2; ++c) {
    r.files.push_back({"t" + std::to_string(c), {{1, Box{{6 * c, 0}, {6, 40}}, std::nullopt}}});
  }
  r.processes = processes;
  r.threads = 2;
  r.memory_budget = budget;
  return r;
}

// Runs `plan` on an in-process group, process p reading through views[p].
std::vector<Result<ExecuteStats>> RunGroup(const Plan& plan, const std::vector<CheckpointIndex>& views,
                                           PlanSink& sink) {
  const int n = static_cast<int>(views.size());
  std::vector<std::unique_ptr<Communicator>> group = MakeInProcessGroup(n);
  std::vector<Result<ExecuteStats>> results(static_cast<size_t>(n), InternalError("not run"));
  std::vector<std::thread> threads;
  for (int p = 0; p < n; ++p) {
    threads.emplace_back([&, p] {
      ChunkReader reader(views[static_cast<size_t>(p)]);
      ExecuteOptions eo;
      eo.process = p;
      eo.comm = group[static_cast<size_t>(p)].get();
      eo.progress = Progress::Mode::kQuiet;
      results[static_cast<size_t>(p)] = Execute(plan, reader, sink, eo);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST_CASE("exchange: processes that each see one third of the files write what one process "
          "writes", "[exec][exchange]") {
  testing::TempDir tmp;
  const std::string dir = tmp.Join("exchange");
  REQUIRE(RemoveAll(dir).ok());
  std::vector<Box> boxes;
  for (int64_t r = 0; r < 40; r += 8) boxes.push_back(Box{{r, 0}, {8, 12}});
  const CheckpointIndex index =
      testing::WriteArangeCheckpoint(dir, "w", {40, 12}, boxes, testing::ArangeFiles::kFilePerBox);
  REQUIRE(index.files.size() == 5);

  // One process: the reference.
  auto single = BuildPlan(Request(index, 1, 1 << 20));
  REQUIRE(single.ok());
  MemorySink reference;
  {
    ChunkReader reader(index);
    ExecuteOptions eo;
    eo.progress = Progress::Mode::kQuiet;
    REQUIRE(Execute(*single, reader, reference, eo).ok());
  }

  const int n = 3;
  for (uint64_t budget : {uint64_t{1} << 20, uint64_t{1536}}) {
    INFO("budget " << budget);
    PlanRequest request = Request(index, n, budget);
    for (size_t f = 0; f < index.files.size(); ++f) {
      request.source_visibility.push_back({static_cast<int>(f % n)});
    }
    auto plan = BuildPlan(request);
    REQUIRE(plan.ok());
    REQUIRE(plan->rounds >= 1);
    CHECK(plan->rounds >= plan->rounds_lower_bound);
    if (budget < (1 << 20)) CHECK(plan->rounds > 1);
    // Each process's copy of the index: files on other disks are renamed away.
    std::vector<CheckpointIndex> views(n, index);
    for (int p = 0; p < n; ++p) {
      for (size_t f = 0; f < index.files.size(); ++f) {
        if (static_cast<int>(f % n) != p) views[static_cast<size_t>(p)].files[f].path += ".elsewhere";
      }
    }
    MemorySink sink;
    const std::vector<Result<ExecuteStats>> results = RunGroup(*plan, views, sink);
    uint64_t sent = 0, received = 0, planned = 0;
    for (int p = 0; p < n; ++p) {
      INFO("process " << p);
      REQUIRE(results[static_cast<size_t>(p)].ok());
      sent += results[static_cast<size_t>(p)]->bytes_sent;
      received += results[static_cast<size_t>(p)]->bytes_received;
      CHECK(results[static_cast<size_t>(p)]->bytes_sent == plan->per_process[static_cast<size_t>(p)].bytes_sent);
    }
    for (const Transfer& t : plan->transfers) planned += t.bytes;
    CHECK(sent == received);
    CHECK(sent == planned);
    CHECK(sent > 0);
    // Same files, slots and bytes as one process (plan file order is the request's).
    CHECK(Slots(sink) == Slots(reference));
  }

  SECTION("a process that fails to read ends every process's run with its error") {
    PlanRequest request = Request(index, n, 1 << 20);
    for (size_t f = 0; f < index.files.size(); ++f) {
      request.source_visibility.push_back({static_cast<int>(f % n)});
    }
    auto plan = BuildPlan(request);
    REQUIRE(plan.ok());
    // Process 1 has lost its files.
    std::vector<CheckpointIndex> views(n, index);
    for (int p = 0; p < n; ++p) {
      for (size_t f = 0; f < index.files.size(); ++f) {
        if (static_cast<int>(f % n) != p || p == 1) views[static_cast<size_t>(p)].files[f].path += ".gone";
      }
    }
    MemorySink sink;
    std::vector<Status> results;
    for (const Result<ExecuteStats>& r : RunGroup(*plan, views, sink)) results.push_back(r.status());
    for (int p = 0; p < n; ++p) {
      INFO("process " << p << ": " << results[static_cast<size_t>(p)].ToString());
      CHECK(results[static_cast<size_t>(p)].code() == StatusCode::kNotFound);
      CHECK(results[static_cast<size_t>(p)].message().find("rank 1: ") == 0);
    }
  }
  REQUIRE(RemoveAll(dir).ok());
}

// A sink whose writes take a while, so that process 0 polls the others' counters mid-run.
class SlowSink : public MemorySink {
 public:
  Status Write(uint32_t file, uint32_t slot, uint64_t byte_offset,
               std::span<const std::byte> bytes) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    return MemorySink::Write(file, slot, byte_offset, bytes);
  }
};

TEST_CASE("progress: process 0 counts the whole job's bytes, with and without an exchange",
          "[exec][exchange][progress]") {
  testing::TempDir tmp;
  const std::string dir = tmp.Join("progress");
  REQUIRE(RemoveAll(dir).ok());
  std::vector<Box> boxes;
  for (int64_t r = 0; r < 40; r += 8) boxes.push_back(Box{{r, 0}, {8, 12}});
  const CheckpointIndex index =
      testing::WriteArangeCheckpoint(dir, "w", {40, 12}, boxes, testing::ArangeFiles::kFilePerBox);
  auto check = [](const Plan& plan, const std::vector<Result<ExecuteStats>>& results) {
    for (size_t p = 0; p < results.size(); ++p) {
      INFO("process " << p);
      REQUIRE(results[p].ok());
      // Process 0: every process's bytes; the others: their own.
      CHECK(results[p]->progress_bytes ==
            (p == 0 ? plan.bytes_written : plan.per_process[p].bytes_written));
    }
    CHECK(plan.bytes_written > plan.per_process[0].bytes_written);
  };
  SECTION("without an exchange: each process reads what its files need") {
    const TensorEntry* w = index.FindTensor("w");
    PlanRequest r;
    r.kind = PlanKind::kConvert;
    r.tensors.push_back({"w", DType::kFloat32, w->global_shape,
                         {{w, Box::Whole(w->global_shape), Box::Whole(w->global_shape), {}}}});
    for (int64_t c = 0; c < 2; ++c) {
      r.files.push_back({"w" + std::to_string(c), {{0, Box{{0, 6 * c}, {40, 6}}, std::nullopt}}});
    }
    r.processes = 2;
    r.threads = 1;
    r.memory_budget = 4096;  // several items per file
    r.verify_checksums = false;  // else one process reads each chunk whole and sends parts
    auto plan = BuildPlan(r);
    REQUIRE(plan.ok());
    REQUIRE(plan->rounds == 0);
    SlowSink sink;
    check(*plan, RunGroup(*plan, {index, index}, sink));
  }
  SECTION("with an exchange") {
    PlanRequest request = Request(index, 3, 1 << 20);
    for (size_t f = 0; f < index.files.size(); ++f) {
      request.source_visibility.push_back({static_cast<int>(f % 3)});
    }
    auto plan = BuildPlan(request);
    REQUIRE(plan.ok());
    REQUIRE(plan->rounds >= 1);
    MemorySink sink;
    check(*plan, RunGroup(*plan, {index, index, index}, sink));
  }
  REQUIRE(RemoveAll(dir).ok());
}

}  // namespace
}  // namespace fc
