// The readers and writers run unchanged on an InMemoryEnv: a checkpoint copied into memory
// opens with the same index, and the fc distcp writer builds, commits and reads back a
// checkpoint without touching the disk.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/open.h"
#include "fc/io/env.h"
#include "fc/io/file.h"

namespace fc {
namespace {

std::string TestData(const std::string& rel) {
  const char* root = std::getenv("FC_TESTDATA");
  return JoinPath(root ? root : "testdata", rel);
}

// Copies the files of a disk directory into `mem` at `to`.
void CopyIn(const std::string& from, InMemoryEnv& mem, const std::string& to) {
  REQUIRE(mem.CreateDirectory(to).ok());
  auto names = ListDirectory(from);
  REQUIRE(names.ok());
  for (const std::string& n : *names) {
    auto bytes = ReadWholeFile(JoinPath(from, n), 1 << 26);
    REQUIRE(bytes.ok());
    REQUIRE(mem.WriteFileForTest(JoinPath(to, n),
                                 std::string_view(reinterpret_cast<const char*>(bytes->data()),
                                                  bytes->size()))
                .ok());
  }
}

TEST_CASE("in-memory env: checkpoints open the same as on disk", "[io][env]") {
  for (const std::string rel : {"fc_distcp/sample", "torch_dcp/mixed/ckpt"}) {
    INFO(rel);
    auto disk = OpenCheckpoint(TestData(rel), std::nullopt);
    REQUIRE(disk.ok());
    InMemoryEnv mem;
    CopyIn(TestData(rel), mem, "/ckpt");
    ScopedEnvOverride scoped(&mem);
    auto in_memory = OpenCheckpoint("/ckpt", std::nullopt);
    REQUIRE(in_memory.ok());
    CHECK(in_memory->format == disk->format);
    REQUIRE(in_memory->tensors.size() == disk->tensors.size());
    for (size_t i = 0; i < disk->tensors.size(); ++i) {
      CHECK(in_memory->tensors[i].key == disk->tensors[i].key);
    }
    CHECK(in_memory->total_file_bytes() == disk->total_file_bytes());
  }
}

TEST_CASE("in-memory env: the fc distcp writer commits a checkpoint in memory", "[io][env]") {
  InMemoryEnv mem;
  ScopedEnvOverride scoped(&mem);
  FcDistcpPlan plan;
  plan.tensors.push_back({"w", DType::kFloat32, {2, 3}});
  FcDistcpFileSpec file;
  file.name = "0_0.distcp";
  file.chunks.push_back({"w", Box{{0, 0}, {2, 3}}, std::nullopt, 0});
  plan.files.push_back(file);
  auto w = FcDistcpWriter::Create("/out", plan);
  REQUIRE(w.ok());
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  REQUIRE((*w)->WriteChunk(0, 0, 0, std::as_bytes(std::span<const float>(values))).ok());
  REQUIRE((*w)->Finish().ok());
  auto names = ListDirectory("/");
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"out"});  // the staging directory is gone
  auto index = OpenCheckpoint("/out", std::nullopt);
  REQUIRE(index.ok());
  REQUIRE(index->tensors.size() == 1);
  CHECK(index->tensors[0].key == "w");
}

}  // namespace
}  // namespace fc
