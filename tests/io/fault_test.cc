// Every failure point of a small export and convert, end to end through RunExport and
// RunConvert with a FaultInjectingEnv: for each kind of file operation and each N up to the
// number a clean run performs, failing the Nth one makes the run fail with the injected
// error, leaves OUT absent or empty with no staging directory or lock file next to it, and
// a rerun without faults gives exactly the bytes of a clean run. Short reads change
// nothing.
#include <catch2/catch.hpp>

#include <iostream>


#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

#include "fc/io/env.h"
#include "fc/io/file.h"
#include "fc/ops/convert.h"
#include "fc/ops/export.h"
#include "tests/support/temp_dir.h"
#include "tests/support/testdata.h"

namespace fc {
namespace {

using testing::TestdataPath;

// name -> bytes of every file under `dir` (recursively; "sub/name").
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  auto names = ListDirectory(dir);
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    const std::string p = JoinPath(dir, n);
    if (IsDirectory(p)) {
      for (auto& [k, v] : Snapshot(p)) out[n + "/" + k] = v;
    } else {
      auto bytes = ReadWholeFile(p, 1 << 30);
      REQUIRE(bytes.ok());
      out[n] = std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
    }
  }
  return out;
}

// Entries of `parent` that belong to a run on `out` other than OUT itself.
std::vector<std::string> Leftovers(const std::string& parent, const std::string& out_name) {
  std::vector<std::string> left;
  auto names = ListDirectory(parent);
  REQUIRE(names.ok());
  for (const std::string& n : *names) {
    if (n != out_name && n.rfind(out_name, 0) == 0) left.push_back(n);
  }
  return left;
}

constexpr FaultOp kOps[] = {FaultOp::kOpenRead, FaultOp::kRead,   FaultOp::kCreate,
                            FaultOp::kWrite,    FaultOp::kSync,   FaultOp::kRename,
                            FaultOp::kList,     FaultOp::kMkdir,  FaultOp::kReserve};

// Runs `run(out)` once clean, then once per failure point; checks the contract above.
void EveryFailurePoint(const std::string& base, const std::function<Status(const std::string&)>& run) {
  const std::string clean_out = JoinPath(base, "clean");
  FaultInjectingEnv env(PosixEnv());
  {
    ScopedEnvOverride scoped(&env);
    Status s = run(clean_out);
    INFO(s.message());
    REQUIRE(s.ok());
  }
  const auto clean = Snapshot(clean_out);
  REQUIRE(!clean.empty());
  uint64_t counts[kFaultOpCount];
  for (FaultOp op : kOps) counts[static_cast<int>(op)] = env.Count(op);
  CHECK(env.Count(FaultOp::kWrite) > 0);
  CHECK(env.Count(FaultOp::kRename) > 0);
  CHECK(env.Count(FaultOp::kSync) > 0);
  CHECK(env.Count(FaultOp::kReserve) > 0);

  int points = 0;
  for (FaultOp op : kOps) {
    for (uint64_t n = 1; n <= counts[static_cast<int>(op)]; ++n) {
      const std::string name = "out-" + std::string(FaultOpName(op)) + "-" + std::to_string(n);
      const std::string out = JoinPath(base, name);
      INFO("failing " << FaultOpName(op) << " #" << n);
      env.ResetCounts();
      env.FailNth(op, n);
      Status s;
      {
        ScopedEnvOverride scoped(&env);
        s = run(out);
      }
      env.FailNth(op, 0);
      INFO(s.message() << " ops " << env.Count(op) << " of " << counts[static_cast<int>(op)]);
      REQUIRE(env.Fired());
      ++points;
      // The run fails with the injected error (no fault is swallowed).
      REQUIRE_FALSE(s.ok());
      CHECK(s.code() == StatusCode::kIoError);
      CHECK(s.message().find("injected fault") != std::string::npos);
      // OUT holds nothing; nothing of the run is left next to it.
      CHECK(Snapshot(out).empty());
      CHECK(Leftovers(base, name).empty());
      // A rerun without faults gives the clean bytes.
      REQUIRE(run(out).ok());
      CHECK(Snapshot(out) == clean);
      CHECK(Leftovers(base, name).empty());
      REQUIRE(RemoveAll(out).ok());
    }
  }
  CHECK(points > 10);

  // Short reads: same bytes.
  env.ShortReads(3);
  const std::string short_out = JoinPath(base, "short");
  {
    ScopedEnvOverride scoped(&env);
    REQUIRE(run(short_out).ok());
  }
  env.ShortReads(0);
  CHECK(Snapshot(short_out) == clean);
}

TEST_CASE("export: every failure point leaves no output and a rerun succeeds", "[io][fault]") {
  testing::TempDir scratch;
  EveryFailurePoint(scratch.path(), [](const std::string& out) {
    ExportOptions o;
    o.input = TestdataPath("torch_dcp/mixed/ckpt");
    o.output_dir = out;
    o.max_shard_bytes = 64;  // several shards + the index
    o.progress = Progress::Mode::kQuiet;
    o.threads = 1;
    auto r = RunExport(o, std::cout);
    if (r.ok()) CHECK(r->files.size() > 2);
    return r.status();
  });
}

TEST_CASE("convert to fc distcp: every failure point leaves no output", "[io][fault]") {
  testing::TempDir scratch;
  EveryFailurePoint(scratch.path(), [](const std::string& out) {
    ConvertOptions o;
    o.input = TestdataPath("torch_dcp/even_2d_f32/ckpt");
    o.target_like = TestdataPath("torch_dcp/even_2d_f32/ckpt");
    o.output_dir = out;
    o.progress = Progress::Mode::kQuiet;
    o.threads = 1;
    std::ostringstream text;
    return RunConvert(o, text).status();
  });
}

TEST_CASE("convert to torch DCP: every failure point leaves no output", "[io][fault]") {
  testing::TempDir scratch;
  EveryFailurePoint(scratch.path(), [](const std::string& out) {
    ConvertOptions o;
    o.input = TestdataPath("torch_dcp/mixed/ckpt");
    o.target_like = TestdataPath("torch_dcp/mixed/ckpt");
    o.output_dir = out;
    o.output_format = "torch-dcp";
    o.progress = Progress::Mode::kQuiet;
    o.threads = 1;
    std::ostringstream text;
    return RunConvert(o, text).status();
  });
}

}  // namespace
}  // namespace fc
