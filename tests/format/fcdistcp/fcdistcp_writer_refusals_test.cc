// Every refusal of FcDistcpWriter and CommitFcDistcpMetadata (src/format/fcdistcp/writer.cc)
// with its code and the file, index or sizes it names: bad options and calls through the
// API, a staging directory whose files are not what the plan says, and I/O errors through a
// FaultInjectingEnv, which must pass through unchanged and leave nothing behind.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "fc/format/fc_distcp.h"
#include "fc/io/env.h"
#include "fc/io/file.h"
#include "tests/format/fcdistcp/sample.h"
#include "tests/format/safetensors/st_test_util.h"

namespace fc {
namespace {

using st_testing::ListNames;
using testing::TempDir;

template <typename R>
void Refused(const R& r, StatusCode code, std::initializer_list<std::string> parts) {
  REQUIRE_FALSE(r.ok());
  const Status s = internal::AsStatus(r);
  INFO(s.ToString());
  CHECK(s.code() == code);
  for (const std::string& p : parts) CHECK_THAT(s.message(), Catch::Matchers::Contains(p));
}

// Writes every chunk and object of plan file `f` whole.
void WriteFile(FcDistcpWriter& w, const FcDistcpPlan& plan, size_t f) {
  std::unordered_map<std::string, const FcDistcpTensorSpec*> specs;
  for (const auto& t : plan.tensors) specs[t.key] = &t;
  const FcDistcpFileSpec& file = plan.files[f];
  for (size_t c = 0; c < file.chunks.size(); ++c) {
    FC_REQUIRE_OK(w.WriteChunk(
        f, c, 0, fcdistcp_sample::ChunkValues(*specs.at(file.chunks[c].key), file.chunks[c])));
  }
  for (size_t o = 0; o < file.objects.size(); ++o) {
    FC_REQUIRE_OK(w.WriteObject(f, o, 0, fcdistcp_sample::SampleObjectBytes(file.objects[o].key)));
  }
}

TEST_CASE("fc distcp writer refusals: options", "[fcdistcp][refusals]") {
  TempDir tmp;
  const std::string out = tmp.Join("ckpt");
  const FcDistcpPlan plan = fcdistcp_sample::SamplePlan();
  Refused(FcDistcpWriter::Create(out, plan, {.files = {0, 2}, .staging_dir = ""}),
          StatusCode::kInvalidArgument, {"file index 2 out of range (plan has 2 files)"});
  Refused(FcDistcpWriter::Create(out, plan, {.files = {1, 1}, .staging_dir = ""}),
          StatusCode::kInvalidArgument, {"file index 1 given twice"});
  const std::string nowhere = tmp.Join("no-such-staging");
  Refused(FcDistcpWriter::Create(out, plan, {.files = {0}, .staging_dir = nowhere}),
          StatusCode::kNotFound, {nowhere + ": staging directory does not exist"});
  CHECK(ListNames(tmp.path()).empty());
}

TEST_CASE("fc distcp writer refusals: calls out of place", "[fcdistcp][refusals]") {
  TempDir tmp;
  const std::string out = tmp.Join("ckpt");
  const FcDistcpPlan plan = fcdistcp_sample::SamplePlan();
  std::vector<std::byte> buf(64);
  SECTION("indices") {
    auto w = FcDistcpWriter::Create(out, plan, {.files = {1}, .staging_dir = ""});
    FC_REQUIRE_OK(w);
    Refused((*w)->WriteChunk(0, 0, 0, buf), StatusCode::kInvalidArgument,
            {out + ": file index 0 is not written by this writer"});
    Refused((*w)->WriteChunk(5, 0, 0, buf), StatusCode::kInvalidArgument,
            {out + ": file index 5 is not written by this writer"});
    Refused((*w)->WriteObject(5, 0, 0, buf), StatusCode::kInvalidArgument,
            {out + ": file index 5 is not written by this writer"});
    Refused((*w)->WriteChunk(1, 4, 0, buf), StatusCode::kInvalidArgument,
            {out + ": 1_0.distcp has no chunk 4"});
    Refused((*w)->WriteObject(1, 1, 0, buf), StatusCode::kInvalidArgument,
            {out + ": 1_0.distcp has no object 1"});
    // Finish commits the whole directory, so it needs every file.
    Refused((*w)->Finish(), StatusCode::kFailedPrecondition,
            {out + ": Finish() needs a writer of every file; 0_0.distcp is not written here"});
  }
  SECTION("Finish on a shared staging directory") {
    auto staging = CreateFcDistcpStagingDir(out);
    FC_REQUIRE_OK(staging);
    auto w = FcDistcpWriter::Create(out, plan, {.files = {}, .staging_dir = *staging});
    FC_REQUIRE_OK(w);
    WriteFile(**w, plan, 0);
    WriteFile(**w, plan, 1);
    Refused((*w)->Finish(), StatusCode::kFailedPrecondition,
            {out + ": Finish() needs a writer that owns its staging directory; use "
                   "FinishDataFiles + CommitFcDistcpMetadata"});
    CHECK_FALSE(PathExists(out));
    w->reset();
    AbortFcDistcpStaging(*staging);
  }
  SECTION("after FinishDataFiles") {
    auto w = FcDistcpWriter::Create(out, plan);
    FC_REQUIRE_OK(w);
    WriteFile(**w, plan, 0);
    WriteFile(**w, plan, 1);
    FC_REQUIRE_OK((*w)->FinishDataFiles());
    Refused((*w)->WriteChunk(0, 0, 0, buf), StatusCode::kFailedPrecondition,
            {out + ": write after FinishDataFiles/Abort"});
    Refused((*w)->FinishDataFiles(), StatusCode::kFailedPrecondition,
            {out + ": FinishDataFiles called twice or after Abort"});
    // Finish runs FinishDataFiles: the same refusal, and the writer is aborted.
    Refused((*w)->Finish(), StatusCode::kFailedPrecondition,
            {out + ": FinishDataFiles called twice or after Abort"});
  }
  SECTION("after Abort") {
    auto w = FcDistcpWriter::Create(out, plan);
    FC_REQUIRE_OK(w);
    (*w)->Abort();
    Refused((*w)->WriteObject(1, 0, 0, buf), StatusCode::kFailedPrecondition,
            {out + ": write after FinishDataFiles/Abort"});
    Refused((*w)->FinishDataFiles(), StatusCode::kFailedPrecondition,
            {out + ": FinishDataFiles called twice or after Abort"});
  }
  CHECK(ListNames(tmp.path()).empty());
}

TEST_CASE("fc distcp writer refusals: the commit checks every data file", "[fcdistcp][refusals]") {
  TempDir tmp;
  const std::string out = tmp.Join("ckpt");
  const FcDistcpPlan plan = fcdistcp_sample::SamplePlan();
  auto staging = CreateFcDistcpStagingDir(out);
  FC_REQUIRE_OK(staging);
  std::vector<FcDistcpFileDigests> digests;
  {
    auto w = FcDistcpWriter::Create(out, plan, {.files = {0}, .staging_dir = *staging});
    FC_REQUIRE_OK(w);
    WriteFile(**w, plan, 0);
    auto d = (*w)->FinishDataFiles();
    FC_REQUIRE_OK(d);
    digests = *d;
  }
  SECTION("a missing file") {
    digests.push_back({1, std::vector<uint64_t>(4), {0}});
    Refused(CommitFcDistcpMetadata(out, *staging, plan, digests), StatusCode::kDataLoss,
            {"committing " + out + ": data file 1_0.distcp is missing: "});
  }
  SECTION("a file of another size than planned") {
    auto w = FcDistcpWriter::Create(out, plan, {.files = {1}, .staging_dir = *staging});
    FC_REQUIRE_OK(w);
    WriteFile(**w, plan, 1);
    auto d = (*w)->FinishDataFiles();
    FC_REQUIRE_OK(d);
    digests.insert(digests.end(), d->begin(), d->end());
    auto layouts = ComputeFcDistcpLayouts(plan);
    FC_REQUIRE_OK(layouts);
    const uint64_t planned = (*layouts)[1].safetensors.file_size;
    {
      std::ofstream append(JoinPath(*staging, "1_0.distcp"), std::ios::binary | std::ios::app);
      append << "xy";
    }
    Refused(CommitFcDistcpMetadata(out, *staging, plan, digests), StatusCode::kDataLoss,
            {"committing " + out + ": data file 1_0.distcp is " + std::to_string(planned + 2) +
             " bytes, expected " + std::to_string(planned)});
  }
  SECTION("a file that cannot be looked at: the I/O error, not kDataLoss") {
    digests.push_back({1, std::vector<uint64_t>(4), {0}});
    FaultInjectingEnv env(PosixEnv());
    ScopedEnvOverride scoped(&env);
    env.FailNth(FaultOp::kOpenRead, 1);
    Refused(CommitFcDistcpMetadata(out, *staging, plan, digests), StatusCode::kIoError,
            {"committing " + out + ": injected fault: open #1 on " +
             JoinPath(*staging, "0_0.distcp")});
    CHECK(env.Fired());
  }
  CHECK_FALSE(PathExists(out));
  AbortFcDistcpStaging(*staging);
  CHECK(ListNames(tmp.path()).empty());
}

TEST_CASE("fc distcp writer refusals: I/O errors pass through and leave nothing",
          "[fcdistcp][refusals][io]") {
  TempDir tmp;
  const std::string out = tmp.Join("ckpt");
  const FcDistcpPlan plan = fcdistcp_sample::SamplePlan();
  FaultInjectingEnv env(PosixEnv());
  ScopedEnvOverride scoped(&env);
  auto arm = [&](FaultOp op) { env.FailNext(op); };
  auto injected = [&](const Status& s, const std::string& what) {
    CHECK(env.Fired());
    Refused(s, StatusCode::kIoError, {"injected fault: " + what + " #1 on "});
    env.Disarm();
  };
  SECTION("creating a data file") {
    arm(FaultOp::kCreate);
    auto w = FcDistcpWriter::Create(out, plan);
    injected(w.status(), "create");
    CHECK_THAT(w.status().message(), Catch::Matchers::Contains("0_0.distcp"));
  }
  SECTION("a failed write: later writes to the file and Finish fail with it") {
    auto w = FcDistcpWriter::Create(out, plan);
    FC_REQUIRE_OK(w);
    arm(FaultOp::kWrite);
    const Status first =
        (*w)->WriteObject(0, 0, 0, fcdistcp_sample::SampleObjectBytes("train.iteration"));
    injected(first, "write");
    WriteFile(**w, plan, 1);  // the other file is unaffected
    std::vector<std::byte> rows(64);
    for (const Status& s : {(*w)->WriteChunk(0, 0, 0, rows), (*w)->Finish()}) {
      CHECK(s.code() == StatusCode::kIoError);
      CHECK(s.message() == first.message());
    }
  }
  SECTION("fsync of a data file") {
    auto w = FcDistcpWriter::Create(out, plan);
    FC_REQUIRE_OK(w);
    WriteFile(**w, plan, 0);
    WriteFile(**w, plan, 1);
    arm(FaultOp::kSync);
    injected((*w)->Finish(), "fsync");
  }
  SECTION("the commit's rename") {
    auto w = FcDistcpWriter::Create(out, plan);
    FC_REQUIRE_OK(w);
    WriteFile(**w, plan, 0);
    WriteFile(**w, plan, 1);
    arm(FaultOp::kRename);
    injected((*w)->Finish(), "rename");
  }
  env.Disarm();
  CHECK_FALSE(PathExists(out));
  CHECK(ListNames(tmp.path()).empty());
}

}  // namespace
}  // namespace fc
