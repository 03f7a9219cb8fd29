// Fuzz-style robustness: random mutations of real .metadata files, real DCP items and whole
// checkpoints must produce a value or an error, never a crash, hang or leak. Seeded and
// deterministic; run under ASan/UBSan to make "no crash" mean "no memory error" too.
#include <algorithm>
#include <filesystem>
#include <random>

#include <catch2/catch.hpp>

#include "fc/codec/pickle.h"
#include "fc/format/chunk_reader.h"
#include "fc/format/torch_dcp.h"
#include "fc/format/torch_save.h"
#include "fc/codec/zip.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

const char* const kFixtures[] = {"even_2d_f32", "uneven_1d_bf16", "mixed", "strided",
                                 "torch2_emulated"};

// One random edit: flip, overwrite with an interesting byte, insert, delete, truncate,
// duplicate a slice, or write a large little-endian integer.
void Mutate(std::vector<std::byte>& b, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  static const uint8_t kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '(', '.', 't', 'u',
                                         'b', 'R', 0x81, 0x93, 0x94, 'h', 'q', 0x8a, 0x95};
  switch (rng() % 8) {
    case 0:
      if (!b.empty()) b[pick(b.size())] ^= static_cast<std::byte>(1u << (rng() % 8));
      break;
    case 1:
      if (!b.empty()) {
        b[pick(b.size())] = static_cast<std::byte>(kInteresting[pick(std::size(kInteresting))]);
      }
      break;
    case 2:
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)),
               static_cast<std::byte>(kInteresting[pick(std::size(kInteresting))]));
      break;
    case 3:
      if (!b.empty()) b.erase(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size())));
      break;
    case 4:
      b.resize(pick(b.size() + 1));
      break;
    case 5:
      if (b.size() > 4) {
        const size_t from = pick(b.size()), len = 1 + pick(std::min<size_t>(64, b.size() - from));
        std::vector<std::byte> slice(b.begin() + static_cast<std::ptrdiff_t>(from),
                                     b.begin() + static_cast<std::ptrdiff_t>(from + len));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)), slice.begin(),
                 slice.end());
      }
      break;
    default:
      if (b.size() >= 8) {
        const size_t at = pick(b.size() - 7);
        const uint64_t v = rng() % 2 ? ~uint64_t{0} >> (rng() % 64) : rng();
        for (int i = 0; i < static_cast<int>(1 + rng() % 8); ++i) {
          b[at + static_cast<size_t>(i)] = static_cast<std::byte>(v >> (8 * i));
        }
      }
      break;
  }
}

TEST_CASE("fuzz: mutated .metadata never crashes the parser", "[fuzz]") {
  std::mt19937_64 rng(20240611);
  int accepted = 0, total = 0;
  for (const char* fixture : kFixtures) {
    const auto original =
        testing::ReadFileBytes(testing::TorchFixture(fixture) + "/ckpt/.metadata");
    for (int iter = 0; iter < 3000; ++iter) {
      auto b = original;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) Mutate(b, rng);
      auto md = ParseDcpMetadata(b);
      auto raw = ParsePickle(b);
      if (md.ok()) ++accepted;
      if (raw.ok()) (void)raw->DebugString(200);
      ++total;
    }
  }
  // Sanity: the mutations are not all fatal, so the deeper code paths are exercised too.
  CHECK(accepted > 0);
  CHECK(accepted < total);
}

TEST_CASE("fuzz: mutated DCP items never crash the zip/torch.save readers", "[fuzz]") {
  std::mt19937_64 rng(7);
  for (const char* fixture : kFixtures) {
    const std::string ckpt = testing::TorchFixture(fixture) + "/ckpt";
    auto md = ParseDcpMetadata(testing::ReadFileBytes(ckpt + "/.metadata"));
    REQUIRE(md.ok());
    for (const DcpStorageInfo& s : md->storage) {
      const auto file = testing::ReadFileBytes(ckpt + "/" + s.relative_path);
      const std::vector<std::byte> item(file.begin() + static_cast<std::ptrdiff_t>(s.offset),
                                        file.begin() + static_cast<std::ptrdiff_t>(s.offset + s.length));
      for (int iter = 0; iter < 300; ++iter) {
        auto b = item;
        const int edits = 1 + static_cast<int>(rng() % 3);
        for (int e = 0; e < edits; ++e) Mutate(b, rng);
        (void)ParseZipDirectory(b);
        auto t = ParseTorchSaveTensor(b);
        if (t.ok()) {
          // Whatever was accepted must point inside the archive.
          CHECK(t->storage_exclusive_max <= b.size());
          CHECK(t->first_element_offset + t->ref.ViewSpanBytes() <= t->storage_exclusive_max);
        }
      }
    }
  }
}

TEST_CASE("fuzz: mutated checkpoints never crash ReadTorchDcp", "[fuzz]") {
  std::mt19937_64 rng(99);
  for (const char* fixture : {"even_2d_f32", "strided", "torch2_emulated"}) {
    const std::string src = testing::TorchFixture(fixture) + "/ckpt";
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(src)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    for (int iter = 0; iter < 150; ++iter) {
      testing::TempDir tmp;
      testing::CopyDirectoryFiles(src, tmp.path());
      const std::string victim = names[rng() % names.size()];
      auto b = testing::ReadFileBytes(tmp.path() + "/" + victim);
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) Mutate(b, rng);
      testing::WriteFileBytes(tmp.path() + "/" + victim, b);
      auto index = ReadTorchDcp(tmp.path());
      if (!index.ok()) continue;
      // Accepted: every chunk must lie inside its file.
      for (const TensorEntry& t : index->tensors) {
        for (const Chunk& c : t.chunks) {
          REQUIRE(c.file < index->files.size());
          CHECK(c.byte_offset + c.byte_length <= index->files[c.file].size);
        }
      }
    }
  }
}

TEST_CASE("fuzz: mutated torch 2.x variants never crash the reader or ChunkReader",
          "[fuzz][torch_dcp2]") {
  // Per-rank metadata, zstd items, SAFETENSORS blobs (testdata/gen/torch2/make_torch2.py).
  std::mt19937_64 rng(2024);
  for (const char* fixture : {"rank_local", "zstd", "safetensors"}) {
    INFO("fixture " << fixture);
    const std::string src = testing::TorchFixture(fixture) + "/ckpt";
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(src)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    int accepted = 0;
    for (int iter = 0; iter < 120; ++iter) {
      testing::TempDir tmp;
      testing::CopyDirectoryFiles(src, tmp.path());
      const std::string victim = names[rng() % names.size()];
      auto b = testing::ReadFileBytes(tmp.path() + "/" + victim);
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) Mutate(b, rng);
      testing::WriteFileBytes(tmp.path() + "/" + victim, b);
      auto index = ReadTorchDcp(tmp.path(), TorchDcpReadOptions{.locate_chunks = (iter % 2) == 0});
      if (!index.ok()) continue;
      ++accepted;
      ChunkReader reader(*index);
      for (const TensorEntry& t : index->tensors) {
        const Box whole = Box::Whole(t.global_shape);
        std::vector<std::byte> buf(static_cast<size_t>(whole.num_elements()) * DTypeSize(t.dtype));
        for (const Chunk& c : t.chunks) {
          REQUIRE(c.file < index->files.size());
          if (c.encoded_item) {
            CHECK(c.encoded_item->encoded_offset + c.encoded_item->encoded_length <=
                  index->files[c.file].size);
          } else if (!c.unlocated_item) {
            CHECK(c.byte_offset + c.byte_length <= index->files[c.file].size);
          }
          (void)reader.CopyChunkRegion(t, c, whole, buf.data(), whole);  // errors are fine
        }
      }
      for (const ObjectEntry& o : index->objects) {
        auto f = RandomAccessFile::Open(index->root + "/" + index->files[o.file].path);
        REQUIRE(f.ok());
        (void)ReadObjectBytes(**f, o);
      }
    }
    CHECK(accepted > 0);
  }
}

}  // namespace
}  // namespace fc
