// The output table (fc/format/output_format.h): names, lookups, and each kTargetFiles
// entry's writer used as fc-convert uses it under mpirun: two parts on one shared staging
// directory, each finishing its own file, one commit with both parts' results.
#include "fc/format/output_format.h"

#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/open.h"
#include "tests/format/safetensors/st_test_util.h"

namespace fc {
namespace {

using testing::TempDir;

TEST_CASE("output table: names, lookup, complete entries", "[output_format]") {
  CHECK(OutputFormatNames() == "fc, torch-dcp, ucp, deepspeed");
  CHECK(OutputFormats().front().name == "fc");  // the default comes first
  auto torch = FindOutputFormat("torch-dcp");
  REQUIRE(torch.ok());
  CHECK((*torch)->file_name(3) == "__3_0.distcp");
  CHECK((*FindOutputFormat("fc"))->file_name(3) == FcDistcpFileName(3, 0));
  CHECK((*FindOutputFormat("ucp"))->shape == OutputShape::kDeepSpeedUniversal);
  CHECK((*FindOutputFormat("deepspeed"))->shape == OutputShape::kDeepSpeedRepartitioned);
  auto unknown = FindOutputFormat("zarr");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(unknown.status().message(),
             Catch::Contains("unknown output format 'zarr' (expected one of: fc, torch-dcp, "
                             "ucp, deepspeed)"));
  for (const OutputFormat& f : OutputFormats()) {
    INFO(f.name);
    CHECK_FALSE(f.summary.empty());
    const bool files = f.shape == OutputShape::kTargetFiles;
    CHECK((f.file_name != nullptr) == files);
    CHECK((f.stores_object != nullptr) == files);
    CHECK((f.check != nullptr) == files);
    CHECK((f.create != nullptr) == files);
  }
  CHECK((*FindOutputFormat("fc"))->stores_object(ObjectEncoding::kRaw));
  CHECK_FALSE((*torch)->stores_object(ObjectEncoding::kRaw));
  CHECK((*torch)->stores_object(ObjectEncoding::kTorchSave));
}

// "w": float32 [4, 2], rows [0, 2) in file 0 and [2, 4) in file 1, values 0..7.
FcDistcpPlan TwoFilePlan(const OutputFormat& format) {
  FcDistcpPlan plan;
  plan.tensors.push_back({"w", DType::kFloat32, {4, 2}});
  for (int64_t rank = 0; rank < 2; ++rank) {
    FcDistcpFileSpec file;
    file.name = format.file_name(rank);
    file.chunks.push_back({"w", Box{{2 * rank, 0}, {2, 2}}, std::nullopt, 0});
    plan.files.push_back(std::move(file));
  }
  return plan;
}

std::vector<std::byte> Rows(int64_t rank) {
  std::vector<float> values;
  for (int i = 0; i < 4; ++i) values.push_back(static_cast<float>(4 * rank + i));
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Both parts written and finished; returns their FinishDataFiles results.
std::vector<std::string> WriteParts(const OutputFormat& format, const FcDistcpPlan& plan,
                                    const std::string& out, const std::string& staging,
                                    std::unique_ptr<TargetFilesWriter>& part0) {
  std::vector<std::string> results;
  auto made0 = format.create(out, plan, {0}, staging, OutputSettings{});
  REQUIRE(made0.ok());
  part0 = std::move(*made0);
  auto made1 = format.create(out, plan, {1}, staging, OutputSettings{});
  REQUIRE(made1.ok());
  std::unique_ptr<TargetFilesWriter> part1 = std::move(*made1);
  CHECK(part0->WriteChunk(1, 0, 0, Rows(1)).code() == StatusCode::kInvalidArgument);  // not its file
  REQUIRE(part0->WriteChunk(0, 0, 0, Rows(0)).ok());
  REQUIRE(part1->WriteChunk(1, 0, 0, Rows(1)).ok());
  for (TargetFilesWriter* part : {part0.get(), part1.get()}) {
    auto finished = part->FinishDataFiles();
    REQUIRE(finished.ok());
    results.push_back(*finished);
  }
  return results;
}

std::vector<float> ReadBack(const std::string& out) {
  auto index = OpenCheckpoint(out);
  REQUIRE(index.ok());
  REQUIRE(index->tensors.size() == 1);
  const TensorEntry& w = index->tensors[0];
  REQUIRE(w.key == "w");
  std::vector<float> values(8, -1.0f);
  ChunkReader reader(*index);
  const Box whole = Box::Whole({4, 2});
  for (const Chunk& c : w.chunks) {
    REQUIRE(reader.CopyChunkRegion(w, c, c.box, values.data(), whole).ok());
  }
  REQUIRE(reader.FinishVerification().ok());
  return values;
}

TEST_CASE("output table: two parts on one staging directory, one commit", "[output_format]") {
  for (const char* name : {"fc", "torch-dcp"}) {
    INFO(name);
    const OutputFormat& format = **FindOutputFormat(name);
    const FcDistcpPlan plan = TwoFilePlan(format);
    REQUIRE(format.check(plan, OutputSettings{}).ok());
    TempDir tmp;
    const std::string out = tmp.Join("out");
    auto staging = CreateFcDistcpStagingDir(out);
    REQUIRE(staging.ok());
    std::unique_ptr<TargetFilesWriter> part0;
    const std::vector<std::string> results = WriteParts(format, plan, out, *staging, part0);
    REQUIRE(part0->Commit(results).ok());
    CHECK(ReadBack(out) == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7});
  }
}

TEST_CASE("output table: fc distcp's commit needs every part's checksums", "[output_format]") {
  const OutputFormat& format = **FindOutputFormat("fc");
  const FcDistcpPlan plan = TwoFilePlan(format);
  TempDir tmp;
  const std::string out = tmp.Join("out");
  auto staging = CreateFcDistcpStagingDir(out);
  REQUIRE(staging.ok());
  std::unique_ptr<TargetFilesWriter> part0;
  std::vector<std::string> results = WriteParts(format, plan, out, *staging, part0);
  CHECK_FALSE(results[1].empty());  // the checksums of file 1 travel to the committer
  CHECK_FALSE(part0->Commit(std::vector<std::string>{results[0]}).ok());
  // A damaged message is refused, not read past its end. Each part's is little-endian u64
  // words: file count 1, file index, 1 chunk digest, 0 object digests.
  REQUIRE(results[1].size() == 5 * 8);
  auto refused = [&](const std::string& message, const std::string& expected) {
    const Status s = part0->Commit(std::vector<std::string>{results[0], message});
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInternal);
    CHECK(s.message() == expected);
  };
  refused(results[1].substr(0, 39), "digest message of 39 bytes");
  refused(results[1].substr(0, 32), "truncated digest message");  // no object count
  std::string long_list = results[1];
  long_list[16] = 2;  // 2 chunk digests, of which the message holds 1
  refused(long_list, "truncated digest message");
  refused(results[1] + std::string(8, '\0'), "digest message has trailing words");
  CHECK_FALSE(PathExists(out));
  REQUIRE(part0->Commit(results).ok());  // the intact messages still commit
  CHECK(ReadBack(out) == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("output table: the writers' checks before any output", "[output_format]") {
  const OutputFormat& torch = **FindOutputFormat("torch-dcp");
  FcDistcpPlan plan = TwoFilePlan(torch);
  OutputSettings settings;
  settings.torch_version = "3.1";
  Status bad_version = torch.check(plan, settings);
  CHECK(bad_version.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad_version.message(),
             Catch::Contains("--torch-version '3.1': expected 1.13, 2.0 or 2"));
  settings.torch_version = "";
  settings.source_torch_generation = "2.4";  // nor from the source's
  CHECK_THAT(torch.check(plan, settings).message(),
             Catch::Contains("--torch-version '2.4': expected 1.13, 2.0 or 2"));
  settings = OutputSettings{};
  settings.torch_serialization = "zip";
  for (const Status& s :
       {torch.check(plan, settings), torch.create("/nonexistent/out", plan, {0}, "", settings).status()}) {
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(),
               Catch::Contains("--torch-serialization 'zip': expected torch-save or safetensors"));
  }
  settings.torch_serialization = "torch-save";
  CHECK(torch.check(plan, settings).ok());
  settings = OutputSettings{};
  settings.source_torch_generation = "1.13";  // the source's generation when none is given
  settings.torch_serialization = "safetensors";  // needs --torch-version 2
  const Status old_torch = torch.check(plan, settings);
  CHECK(old_torch.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(old_torch.message(),
             Catch::Contains("the SAFETENSORS serialization exists in torch 2.8+ only"));
  settings.torch_version = "2";
  CHECK(torch.check(plan, settings).ok());
  // A flattened range is fc distcp's, not DCP's.
  plan.files[0].chunks[0].flat_range = FlatRange{0, 4};
  plan.files[0].chunks[0].box = Box::Whole({4, 2});
  plan.files[1].chunks.clear();
  plan.files[1].chunks.push_back({"w", Box::Whole({4, 2}), FlatRange{4, 8}, 0});
  CHECK(torch.check(plan, OutputSettings{}).code() == StatusCode::kInvalidArgument);
  const OutputFormat& fc = **FindOutputFormat("fc");
  plan.files[0].name = fc.file_name(0);
  plan.files[1].name = fc.file_name(1);
  CHECK(fc.check(plan, OutputSettings{}).ok());
}

}  // namespace
}  // namespace fc
