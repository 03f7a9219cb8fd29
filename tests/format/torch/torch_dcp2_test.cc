// ReadTorchDcp against the torch 2.4-2.9 on-disk variants (issue 13), with fixtures made by
// testdata/gen/torch2/make_torch2.py from the real torch 1.13 fixture `mixed` (no torch 2.x
// is installable here; the generator names the torch source each variant follows):
//   rank_local   filesystem.py at main, use_collectives=False: __R.metadata per rank;
// Every fixture must reassemble to the values torch 1.13 saved (expected/*.npy), eagerly and
// through ChunkReader on an index opened without reading items.
#include <cstring>
#include <filesystem>
#include <map>

#include <catch2/catch.hpp>

#include "fc/core/dtype.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/open.h"
#include "fc/format/torch_dcp.h"
#include "fc/io/file.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using testing::ReadFileBytes;
using testing::TorchFixture;

const char* const kFixtures[] = {"rank_local"};

std::map<std::string, testing::NpyArray> Expected(const std::string& fixture) {
  std::map<std::string, testing::NpyArray> out;
  for (const auto& e : std::filesystem::directory_iterator(TorchFixture(fixture) + "/expected")) {
    out[e.path().stem().string()] = testing::ReadNpy(e.path().string());
  }
  return out;
}

// Every tensor of `index` read through ChunkReader (replica 0 chunks) equals expected.
void CheckThroughChunkReader(const CheckpointIndex& index,
                             const std::map<std::string, testing::NpyArray>& expected) {
  ChunkReader reader(index);
  REQUIRE(index.tensors.size() == expected.size());
  for (const TensorEntry& t : index.tensors) {
    INFO("tensor " << t.key);
    const Box whole = Box::Whole(t.global_shape);
    std::vector<std::byte> buf(static_cast<size_t>(whole.num_elements()) * DTypeSize(t.dtype));
    for (const Chunk& c : t.chunks) {
      if (c.replica_id != 0) continue;
      auto st = reader.CopyChunkRegion(t, c, whole, buf.data(), whole);
      if (!st.ok()) FAIL(st.ToString());
    }
    const auto& want = expected.at(t.key).data;
    REQUIRE(buf.size() == want.size());
    CHECK(std::memcmp(buf.data(), want.data(), buf.size()) == 0);
  }
}

TEST_CASE("torch dcp 2.x: every variant reassembles bit-exactly", "[torch_dcp2]") {
  for (const char* fixture : kFixtures) {
    INFO("fixture " << fixture);
    const std::string dir = TorchFixture(fixture) + "/ckpt";
    const auto expected = Expected(fixture);
    auto eager = ReadTorchDcp(dir);
    if (!eager.ok()) FAIL(eager.status().ToString());
    REQUIRE(eager->tensors.size() == expected.size());
    for (const TensorEntry& t : eager->tensors) {
      INFO("tensor " << t.key);
      const auto bytes = testing::ReassembleTensor(*eager, t);
      CHECK(bytes == expected.at(t.key).data);
    }
    auto lazy = OpenCheckpoint(dir);
    if (!lazy.ok()) FAIL(lazy.status().ToString());
    CHECK(lazy->format == CheckpointFormat::kTorchDcp);
    CheckThroughChunkReader(*lazy, expected);
  }
}

// --- item 3: saves without rank coordination ---------------------------------------------

TEST_CASE("torch dcp 2.x: per-rank metadata files are united", "[torch_dcp2][rank_local]") {
  const std::string dir = TorchFixture("rank_local") + "/ckpt";
  auto index = ReadTorchDcp(dir);
  REQUIRE(index.ok());
  CHECK(index->attributes.at("rank_local_metadata") ==
        "__0.metadata, __1.metadata, __2.metadata, __3.metadata");
  CHECK(index->attributes.at("torch_generation") == "2");
  CHECK(index->attributes.at("dcp_version") == "1.0.0");
  CHECK(index->attributes.at("checkpoint_id") == "/ckpt/step_100");  // PosixPath, parts form
  CHECK(index->attributes.at("save_id") == "5f1e1ab0-0000-4000-8000-000000000000");
  REQUIRE(index->files.size() == 4);
  for (uint32_t r = 0; r < 4; ++r) {
    CHECK(index->files[r].path == "__" + std::to_string(r) + "_0.distcp");
  }
  // Same tensors and objects as the coordinated 1.13 save, in its order.
  auto plain = ReadTorchDcp(TorchFixture("mixed") + "/ckpt");
  REQUIRE(plain.ok());
  std::vector<std::string> keys, plain_keys;
  for (const auto& t : index->tensors) keys.push_back(t.key);
  for (const auto& t : plain->tensors) plain_keys.push_back(t.key);
  std::sort(keys.begin(), keys.end());
  std::sort(plain_keys.begin(), plain_keys.end());
  CHECK(keys == plain_keys);
  REQUIRE(index->objects.size() == 3);
  for (const ObjectEntry& o : index->objects) {
    CHECK(index->files[o.file].path == "__0_0.distcp");  // first rank's copy
  }
  // b was saved whole by ranks 0 and 2: rank 0's copy is primary, rank 2's a replica.
  const TensorEntry* b = index->FindTensor("b");
  REQUIRE(b != nullptr);
  REQUIRE(b->chunks.size() == 2);
  CHECK(b->chunks[0].replica_id == 0);
  CHECK(index->files[b->chunks[0].file].path == "__0_0.distcp");
  CHECK(b->chunks[1].replica_id == 1);
  CHECK(index->files[b->chunks[1].file].path == "__2_0.distcp");
  const TensorEntry* grid = index->FindTensor("grid");
  REQUIRE(grid != nullptr);
  CHECK(grid->chunks.size() == 4);
  for (const Chunk& c : grid->chunks) CHECK(c.replica_id == 0);
}

// Rewrites one rank's metadata of a copy of rank_local; returns the copy's error.
Status ReadWithRankMetadata(int rank, void (*edit)(testing::MdSpec&), testing::TempDir& tmp) {
  const std::string src = TorchFixture("rank_local") + "/ckpt";
  testing::CopyDirectoryFiles(src, tmp.path());
  const std::string name = "/__" + std::to_string(rank) + ".metadata";
  auto md = ParseDcpMetadata(ReadFileBytes(src + name));
  REQUIRE(md.ok());
  testing::MdSpec spec = testing::SpecFromMetadata(*md);
  edit(spec);
  testing::WriteFileBytes(tmp.path() + name, testing::EncodeDcpMetadata(spec));
  return ReadTorchDcp(tmp.path()).status();
}

TEST_CASE("torch dcp 2.x: conflicting per-rank entries are errors naming both files",
          "[torch_dcp2][rank_local]") {
  SECTION("dtype") {
    testing::TempDir tmp;
    Status st = ReadWithRankMetadata(2, [](testing::MdSpec& s) {
      for (auto& i : s.items) if (i.fqn == "b") i.dtype = "float16";
    }, tmp);
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK_THAT(st.message(), Catch::Contains("tensor 'b'") &&
                             Catch::Contains("__0.metadata says float32 [6]") &&
                             Catch::Contains("__2.metadata says float16 [6]"));
  }
  SECTION("global size") {
    testing::TempDir tmp;
    Status st = ReadWithRankMetadata(3, [](testing::MdSpec& s) {
      for (auto& i : s.items) if (i.fqn == "grid") i.size = {4, 7};
    }, tmp);
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK_THAT(st.message(), Catch::Contains("tensor 'grid'") &&
                             Catch::Contains("__0.metadata says float32 [4, 6]") &&
                             Catch::Contains("__3.metadata says float32 [4, 7]"));
  }
  SECTION("same chunk offsets, other sizes") {
    testing::TempDir tmp;
    Status st = ReadWithRankMetadata(2, [](testing::MdSpec& s) {
      for (auto& i : s.items) if (i.fqn == "b") i.chunks[0].sizes = {5};
    }, tmp);
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK_THAT(st.message(), Catch::Contains("tensor 'b' chunk at offsets [0]") &&
                             Catch::Contains("__0.metadata stores sizes [6]") &&
                             Catch::Contains("__2.metadata stores sizes [5]"));
  }
  SECTION("tensor in one file, bytes item in another") {
    testing::TempDir tmp;
    Status st = ReadWithRankMetadata(1, [](testing::MdSpec& s) {
      for (auto& i : s.items) {
        if (i.fqn == "iteration") {
          i.is_tensor = true;
          i.size = {1};
          i.chunks = {{{0}, {1}}};
        }
      }
      for (auto& st : s.storage) if (st.fqn == "iteration") st.offset = Shape{0};
    }, tmp);
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK_THAT(st.message(), Catch::Contains("'iteration'") &&
                             Catch::Contains("__0.metadata lists it as a bytes item") &&
                             Catch::Contains("__1.metadata as a tensor"));
  }
  SECTION("a chunk without storage names its file") {
    testing::TempDir tmp;
    Status st = ReadWithRankMetadata(3, [](testing::MdSpec& s) {
      std::erase_if(s.storage, [](const testing::MdStorage& x) { return x.fqn == "z"; });
    }, tmp);
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK_THAT(st.message(), Catch::Contains("__3.metadata: tensor 'z'") &&
                             Catch::Contains("no storage_data entry"));
  }
  SECTION("overlapping chunks from two ranks reach the cover checks as chunks") {
    // Rank 1's ids chunk moved onto rank 3's columns: the reader keeps both (different
    // offsets); consumers' cover checks reject the overlap. Here: the boxes are as stored.
    testing::TempDir tmp;
    Status st = ReadWithRankMetadata(1, [](testing::MdSpec& s) {
      for (auto& i : s.items) if (i.fqn == "ids") i.chunks[0].offsets = {0, 1};
      for (auto& x : s.storage) if (x.fqn == "ids") x.offset = Shape{0, 1};
    }, tmp);
    CHECK(st.ok());
  }
  SECTION("a lone per-rank file is read") {
    testing::TempDir tmp;
    std::filesystem::copy_file(TorchFixture("rank_local") + "/ckpt/__2.metadata",
                               tmp.path() + "/__2.metadata");
    std::filesystem::copy_file(TorchFixture("rank_local") + "/ckpt/__2_0.distcp",
                               tmp.path() + "/__2_0.distcp");
    auto index = ReadTorchDcp(tmp.path());
    REQUIRE(index.ok());
    CHECK(index->attributes.at("rank_local_metadata") == "__2.metadata");
    CHECK(index->tensors.size() == 2);  // b, grid's chunk
  }
}

TEST_CASE("torch dcp 2.x: rank metadata names", "[torch_dcp2][rank_local]") {
  CHECK(TorchDcpRankMetadataRank("__0.metadata") == std::optional<uint64_t>(0));
  CHECK(TorchDcpRankMetadataRank("__17.metadata") == std::optional<uint64_t>(17));
  CHECK(!TorchDcpRankMetadataRank(".metadata"));
  CHECK(!TorchDcpRankMetadataRank("__.metadata"));
  CHECK(!TorchDcpRankMetadataRank("__0_0.distcp"));
  CHECK(!TorchDcpRankMetadataRank("__0x.metadata"));
  CHECK(!TorchDcpRankMetadataRank("__-1.metadata"));
  CHECK(!TorchDcpRankMetadataRank("0.metadata"));
}

}  // namespace
}  // namespace fc
