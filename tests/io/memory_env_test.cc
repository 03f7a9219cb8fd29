// The readers and writers run unchanged on an InMemoryEnv: a checkpoint copied into memory
// opens with the same index, and the fc distcp writer builds, commits and reads back a
// checkpoint without touching the disk.
#include <catch2/catch.hpp>

#include <iostream>


#include <cstdlib>

#include "fc/format/chunk_reader.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/open.h"
#include "fc/io/env.h"
#include "fc/io/file.h"
#include "fc/ops/export.h"
#include "tests/support/testdata.h"
#include "tests/support/temp_dir.h"

namespace fc {
namespace {

using testing::TestdataPath;

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
    auto disk = OpenCheckpoint(TestdataPath(rel), std::nullopt);
    REQUIRE(disk.ok());
    InMemoryEnv mem;
    CopyIn(TestdataPath(rel), mem, "/ckpt");
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

TEST_CASE("in-memory env: RunExport in memory gives the bytes of a disk export", "[io][env]") {
  testing::TempDir tmp;
  const std::string disk_out = tmp.Join("export");
  REQUIRE(RemoveAll(disk_out).ok());
  ExportOptions o;
  o.input = TestdataPath("torch_dcp/mixed/ckpt");
  o.output_dir = disk_out;
  o.max_shard_bytes = 64;
  o.progress = Progress::Mode::kQuiet;
  auto on_disk = RunExport(o, std::cout);
  REQUIRE(on_disk.ok());
  REQUIRE(on_disk->files.size() > 2);

  InMemoryEnv mem;
  CopyIn(TestdataPath("torch_dcp/mixed/ckpt"), mem, "/ckpt");
  std::vector<std::string> listing;
  {
    ScopedEnvOverride scoped(&mem);
    o.input = "/ckpt";
    o.output_dir = "/out";
    auto in_memory = RunExport(o, std::cout);
    REQUIRE(in_memory.ok());
    CHECK(in_memory->files == on_disk->files);
    auto names = ListDirectory("/");
    REQUIRE(names.ok());
    listing = *names;
  }
  CHECK(listing == std::vector<std::string>{"ckpt", "out"});  // no staging, no lock file
  for (const std::string& f : on_disk->files) {
    INFO(f);
    auto want = ReadWholeFile(JoinPath(disk_out, f), 1 << 26);
    REQUIRE(want.ok());
    auto got = mem.ReadFileForTest(JoinPath("/out", f));
    REQUIRE(got.ok());
    CHECK(*got == std::string(reinterpret_cast<const char*>(want->data()), want->size()));
  }
  REQUIRE(RemoveAll(disk_out).ok());
}

}  // namespace
}  // namespace fc
