// LocateChunks (the listing's batched, threaded, uncached chunk locator) against
// ChunkReader::Locate, one chunk at a time, on the torch DCP fixtures; per-chunk errors
// inside a run of items read together; a data file that shrank after opening; and the
// data.pkl decode cache against a fresh parse.
#include <catch2/catch.hpp>


#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fc/format/chunk_reader.h"
#include "fc/format/open.h"
#include "fc/format/torch_save.h"
#include "fc/io/file.h"
#include "fc/ops/locate_chunks.h"
#include "tests/support/file_util.h"
#include "tests/support/temp_dir.h"
#include "tests/support/testdata.h"

namespace fc {
namespace {

using testing::TestdataPath;

std::vector<ChunkToLocate> AllChunks(const CheckpointIndex& index) {
  std::vector<ChunkToLocate> refs;
  for (const TensorEntry& t : index.tensors) {
    for (const Chunk& c : t.chunks) refs.push_back({&t.key, &c});
  }
  return refs;
}

// Each result equals what a fresh ChunkReader says for that chunk alone (place or error
// message). Returns how many chunks were unlocated before.
size_t CheckAgainstReader(const CheckpointIndex& index, int threads) {
  ChunkReader files(index);
  const std::vector<ChunkToLocate> refs = AllChunks(index);
  const std::vector<Result<ChunkLocation>> got = LocateChunks(index, files, refs, threads);
  REQUIRE(got.size() == refs.size());
  ChunkReader one_by_one(index);
  size_t unlocated = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    INFO(*refs[i].key << " chunk " << refs[i].chunk->box.ToString());
    if (refs[i].chunk->unlocated_item) ++unlocated;
    const TensorEntry* tensor = nullptr;
    for (const TensorEntry& t : index.tensors) {
      if (&t.key == refs[i].key) tensor = &t;
    }
    REQUIRE(tensor != nullptr);
    Result<ChunkLocation> want = one_by_one.Locate(*tensor, *refs[i].chunk);
    REQUIRE(got[i].ok() == want.ok());
    if (want.ok()) {
      CHECK(got[i]->byte_offset == want->byte_offset);
      CHECK(got[i]->byte_length == want->byte_length);
      CHECK(got[i]->strides == want->strides);
    } else {
      CHECK(got[i].status().message() == want.status().message());
    }
  }
  return unlocated;
}

TEST_CASE("LocateChunks finds what ChunkReader::Locate finds, on every torch DCP fixture",
          "[locate]") {
  for (const char* fx : {"torch_dcp/mixed/ckpt", "torch_dcp/strided/ckpt",
                         "torch_dcp/even_2d_f32/ckpt", "torch_dcp/torch2_emulated/ckpt",
                         "torch_dcp/details/ckpt", "torch_dcp/rank_local/ckpt",
                         "torch_dcp/safetensors/ckpt", "torch_dcp/megatron_tiny_tp2_pp2/ckpt",
                         "torch_dcp/zstd/ckpt", "torch_dcp/uneven_1d_bf16/ckpt",
                         "torch_dcp_adam/fsdp_adam/ckpt", "torch_dcp_adam/megatron_dp_buckets/ckpt",
                         "fc_distcp/sample"}) {
    const std::string path = TestdataPath(fx);
    if (!std::filesystem::exists(path)) FAIL("missing fixture " << path);
    INFO(fx);
    Result<CheckpointIndex> index = OpenCheckpoint(path, OpenOptions{});
    REQUIRE(index.ok());
    for (int threads : {1, 3}) {
      const size_t unlocated = CheckAgainstReader(*index, threads);
      // torch DCP chunks open unlocated: the locator did the work, not the index.
      if (index->format == CheckpointFormat::kTorchDcp) CHECK(unlocated > 0);
    }
  }
}

TEST_CASE("LocateChunks: a corrupt item fails its own chunk only, inside a run read at once",
          "[locate]") {
  testing::TempDir tmp;
  const std::string copy = testing::CopyTreeInto(tmp, TestdataPath("torch_dcp/strided/ckpt"), "ckpt");
  Result<CheckpointIndex> index = OpenCheckpoint(copy, OpenOptions{});
  REQUIRE(index.ok());
  // The file with the most unlocated small items: its items are read together.
  std::vector<size_t> per_file(index->files.size());
  const Chunk* victim = nullptr;
  for (const TensorEntry& t : index->tensors) {
    for (const Chunk& c : t.chunks) {
      if (c.unlocated_item && c.byte_length <= kSmallItemBytes) ++per_file[c.file];
    }
  }
  const uint32_t file = static_cast<uint32_t>(
      std::max_element(per_file.begin(), per_file.end()) - per_file.begin());
  REQUIRE(per_file[file] >= 2);
  for (const TensorEntry& t : index->tensors) {
    for (const Chunk& c : t.chunks) {
      if (c.file == file && c.unlocated_item && victim == nullptr) victim = &c;
    }
  }
  REQUIRE(victim != nullptr);
  {  // zero the victim's item: its zip directory and data.pkl are gone
    std::fstream f(JoinPath(copy, index->files[file].path),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(victim->byte_offset));
    const std::string zeros(static_cast<size_t>(victim->byte_length), '\0');
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  size_t failed = 0, fine_in_file = 0;
  ChunkReader files(*index);
  const std::vector<ChunkToLocate> refs = AllChunks(*index);
  const std::vector<Result<ChunkLocation>> got = LocateChunks(*index, files, refs, 2);
  for (size_t i = 0; i < refs.size(); ++i) {
    if (!got[i].ok()) {
      ++failed;
      CHECK(refs[i].chunk == victim);
      CHECK_THAT(got[i].status().message(), Catch::Contains(index->files[file].path));
      CHECK_THAT(got[i].status().message(), Catch::Contains("'" + *refs[i].key + "'"));
    } else if (refs[i].chunk->file == file && refs[i].chunk->unlocated_item) {
      ++fine_in_file;
    }
  }
  CHECK(failed == 1);
  CHECK(fine_in_file == per_file[file] - 1);
  CheckAgainstReader(*index, 2);  // same messages as the one-by-one path
}

TEST_CASE("LocateChunks: a data file that shrank after opening fails each of its chunks",
          "[locate]") {
  testing::TempDir tmp;
  const std::string copy = testing::CopyTreeInto(tmp, TestdataPath("torch_dcp/mixed/ckpt"), "ckpt");
  Result<CheckpointIndex> index = OpenCheckpoint(copy, OpenOptions{});
  REQUIRE(index.ok());
  const uint32_t file = index->tensors.front().chunks.front().file;
  std::filesystem::resize_file(JoinPath(copy, index->files[file].path), 10);
  ChunkReader files(*index);
  const std::vector<ChunkToLocate> refs = AllChunks(*index);
  const std::vector<Result<ChunkLocation>> got = LocateChunks(*index, files, refs, 2);
  size_t in_file = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    if (refs[i].chunk->file != file || !refs[i].chunk->unlocated_item) continue;
    ++in_file;
    REQUIRE_FALSE(got[i].ok());
    CHECK_THAT(got[i].status().message(), Catch::Contains(index->files[file].path));
  }
  CHECK(in_file > 0);
  CheckAgainstReader(*index, 1);
}

TEST_CASE("TorchTensorRefCache: a remembered decode is the parse's, and texts stay apart",
          "[locate]") {
  Result<CheckpointIndex> index =
      OpenCheckpoint(TestdataPath("torch_dcp/mixed/ckpt"), OpenOptions{});
  REQUIRE(index.ok());
  ChunkReader files(*index);
  TorchTensorRefCache refs;
  size_t items = 0;
  for (int pass = 0; pass < 2; ++pass) {  // the second pass decodes from the cache
    for (const TensorEntry& t : index->tensors) {
      for (const Chunk& c : t.chunks) {
        if (!c.unlocated_item) continue;
        Result<const RandomAccessFile*> f = files.File(c.file);
        REQUIRE(f.ok());
        Result<std::vector<std::byte>> item = (*f)->ReadAt(c.byte_offset, c.byte_length);
        REQUIRE(item.ok());
        Result<TorchSaveTensor> plain = ParseTorchSaveTensor(*item);
        Result<TorchSaveTensor> cached =
            ParseTorchSaveTensor(item->size(), MemoryZipReader(*item), ZipLimits{}, &refs);
        REQUIRE(plain.ok());
        REQUIRE(cached.ok());
        CHECK(cached->ref.shape == plain->ref.shape);
        CHECK(cached->ref.strides == plain->ref.strides);
        CHECK(cached->ref.dtype == plain->ref.dtype);
        CHECK(cached->ref.storage_offset == plain->ref.storage_offset);
        CHECK(cached->first_element_offset == plain->first_element_offset);
        ++items;
      }
    }
  }
  CHECK(items >= 4);
  TorchTensorRef a;
  a.shape = {2, 3};
  TorchTensorRef b;
  b.shape = {3, 2};
  const std::string ta = "text a", tb = "text b";
  refs.Insert(std::as_bytes(std::span(ta)), a);
  refs.Insert(std::as_bytes(std::span(tb)), b);
  REQUIRE(refs.Find(std::as_bytes(std::span(ta))) != nullptr);
  CHECK(refs.Find(std::as_bytes(std::span(ta)))->shape == Shape{2, 3});
  CHECK(refs.Find(std::as_bytes(std::span(tb)))->shape == Shape{3, 2});
  const std::string tc = "text c";
  CHECK(refs.Find(std::as_bytes(std::span(tc))) == nullptr);
  // Past kMaxEntries the cache starts over; it never grows past it.
  for (size_t i = 0; i < TorchTensorRefCache::kMaxEntries + 5; ++i) {
    const std::string t = "t" + std::to_string(i);
    refs.Insert(std::as_bytes(std::span(t)), a);
  }
  CHECK(refs.Find(std::as_bytes(std::span(ta))) == nullptr);
}

}  // namespace
}  // namespace fc
