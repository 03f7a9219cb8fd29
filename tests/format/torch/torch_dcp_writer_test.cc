// TorchDcpWriter: random plans round-tripped through fc's own reader (every byte compared),
// the generation's module paths in .metadata, the zip containers (CRC-32s, zip64 for items
// past 4 GiB), byte equality of data.pkl with real torch 1.13 items, and the failure paths.
// Real torch loading fc's output is tests/format/torch/torch_writer_interop_test.py.
#include "fc/format/torch_dcp_writer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "fc/format/pickle.h"
#include "fc/format/torch_dcp.h"
#include "fc/format/torch_save.h"
#include "fc/format/zip.h"
#include "fc/io/file.h"
#include "src/format/torch/pickle_writer.h"
#include "src/format/torch/torch_save_writer.h"
#include "src/format/torch/zip_writer.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using internal_torch::Crc32;
using internal_torch::Crc32Combine;
using testing::ReadFileBytes;
using testing::TempDir;
using testing::TorchFixture;

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Entries of a directory whose name contains `part` (staging leftovers).
std::vector<std::string> EntriesContaining(const std::string& dir, const std::string& part) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().find(part) != std::string::npos) {
      out.push_back(e.path().filename().string());
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Building blocks.

TEST_CASE("crc32: known vectors and combine", "[torch_writer]") {
  CHECK(Crc32(0, Bytes("")) == 0u);
  CHECK(Crc32(0, Bytes("123456789")) == 0xCBF43926u);
  CHECK(Crc32(0, Bytes("The quick brown fox jumps over the lazy dog")) == 0x414FA339u);
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<std::byte> data(rng() % 3000);
    for (auto& b : data) b = static_cast<std::byte>(rng());
    const size_t cut = data.empty() ? 0 : rng() % (data.size() + 1);
    const std::span<const std::byte> all(data), a = all.first(cut), b = all.subspan(cut);
    // Streaming continuation and combine agree with the one-shot CRC.
    CHECK(Crc32(Crc32(0, a), b) == Crc32(0, all));
    CHECK(Crc32Combine(Crc32(0, a), Crc32(0, b), b.size()) == Crc32(0, all));
  }
}

TEST_CASE("pickle writer: ints, strings and frames parse back", "[torch_writer]") {
  const int64_t ints[] = {0,          1,          255,        256,          65535,
                          65536,      -1,         -129,       INT32_MAX,    INT32_MIN,
                          int64_t{1} << 31, -(int64_t{1} << 31) - 1, int64_t{5} << 32,
                          INT64_MAX,  INT64_MIN,  0x80,       -0x80,        0x8000000000};
  for (int protocol : {2, 4}) {
    internal_torch::PickleWriter w(protocol);
    w.EmptyList().Mark();
    for (int64_t v : ints) w.Int(v);
    // > 64 KiB of strings: several frames in protocol 4.
    for (int i = 0; i < 3000; ++i) w.Str(std::string(40, static_cast<char>('a' + i % 26)));
    w.Str(std::string(300, 'x'));  // BINUNICODE in protocol 4
    w.Appends();
    const std::string bytes = w.Finish();
    auto v = ParsePickle(Bytes(bytes));
    REQUIRE(v.ok());
    REQUIRE(v->is_list());
    REQUIRE(v->items.size() == std::size(ints) + 3001);
    for (size_t i = 0; i < std::size(ints); ++i) {
      INFO(ints[i]);
      REQUIRE(v->items[i]->is_int());
      CHECK(v->items[i]->int_value == ints[i]);
    }
    CHECK(v->items.back()->str == std::string(300, 'x'));
    if (protocol == 4) {
      // PROTO 4, then a FRAME of at least 64 KiB ending on an opcode boundary.
      REQUIRE(static_cast<uint8_t>(bytes[2]) == 0x95);
      uint64_t len = 0;
      for (int i = 0; i < 8; ++i) len |= uint64_t{static_cast<uint8_t>(bytes[3 + i])} << (8 * i);
      CHECK(len >= 64 * 1024);
      REQUIRE(11 + len < bytes.size());
      CHECK(static_cast<uint8_t>(bytes[11 + len]) == 0x95);  // next frame header
    }
  }
}

TEST_CASE("tensor data.pkl is byte-identical to torch 1.13's", "[torch_writer]") {
  // Every contiguous tensor item of the real fixtures.
  for (const char* fixture : {"even_2d_f32", "uneven_1d_bf16", "mixed"}) {
    INFO(fixture);
    const std::string dir = TorchFixture(fixture) + "/ckpt";
    auto md_bytes = ReadFileBytes(dir + "/.metadata");
    auto md = ParseDcpMetadata(md_bytes);
    REQUIRE(md.ok());
    std::map<std::string, const DcpItemMetadata*> items;
    for (const auto& it : md->items) items[it.fqn] = &it;
    int compared = 0;
    for (const DcpStorageInfo& s : md->storage) {
      if (!s.chunk_offsets) continue;
      const DcpItemMetadata& item = *items.at(s.fqn);
      const DcpChunkMetadata* chunk = nullptr;
      for (const auto& c : item.chunks) {
        if (c.offsets == *s.chunk_offsets) chunk = &c;
      }
      REQUIRE(chunk != nullptr);
      auto file = ReadFileBytes(dir + "/" + s.relative_path);
      std::span<const std::byte> archive(file.data() + s.offset, s.length);
      auto zip = ParseZipDirectory(archive);
      REQUIRE(zip.ok());
      const ZipEntry* pkl = zip->Find("archive/data.pkl");
      REQUIRE(pkl != nullptr);
      const std::string ours = internal_torch::TensorPickle(item.dtype, chunk->sizes);
      INFO("tensor " << s.fqn);
      REQUIRE(pkl->compressed_size == ours.size());
      CHECK(std::memcmp(archive.data() + pkl->data_offset, ours.data(), ours.size()) == 0);
      ++compared;
    }
    CHECK(compared > 0);
  }
}

// An archive of which only the headers exist in memory: data bytes read as zeros.
struct VirtualArchive {
  std::string head, tail;
  uint64_t data_offset = 0, data_bytes = 0;
  uint64_t size() const { return data_offset + data_bytes + tail.size(); }
  ZipReadFn Reader() const {
    return [this](uint64_t offset, std::span<std::byte> dst) -> Status {
      for (size_t i = 0; i < dst.size(); ++i) {
        const uint64_t o = offset + i;
        if (o < head.size()) {
          dst[i] = static_cast<std::byte>(head[o]);
        } else if (o < data_offset + data_bytes) {
          dst[i] = std::byte{0};
        } else if (o - data_offset - data_bytes < tail.size()) {
          dst[i] = static_cast<std::byte>(tail[o - data_offset - data_bytes]);
        } else {
          return DataLossError("read past the virtual archive");
        }
      }
      return Status::Ok();
    };
  }
};

TEST_CASE("tensor items past 4 GiB use zip64 sizes and offsets", "[torch_writer]") {
  for (const auto& [dtype, shape] : std::vector<std::pair<DType, Shape>>{
           {DType::kUInt8, {(int64_t{5} << 30) + 3}},        // data/0 >= 4 GiB
           {DType::kFloat32, {int64_t{1} << 30, 1}},         // exactly 4 GiB
           {DType::kBFloat16, {(int64_t{1} << 31) - 1}},     // just under 4 GiB
           {DType::kFloat8E4M3FN, {3, int64_t{1} << 31}}}) {  // v3, 6 GiB
    INFO(DTypeName(dtype));
    const auto a = internal_torch::PlanTensorArchive(dtype, shape);
    VirtualArchive v;
    v.head = internal_torch::TensorArchiveHead(a);
    v.tail = internal_torch::TensorArchiveTail(a, 0x12345678u);
    v.data_offset = a.data_offset();
    v.data_bytes = a.data_bytes();
    REQUIRE(v.head.size() == a.data_offset());
    REQUIRE(v.size() == a.size());
    CHECK(a.data_offset() % 64 == 0);
    auto zip = ReadZipDirectory(v.size(), v.Reader());
    REQUIRE(zip.ok());
    CHECK(zip->zip64);
    const ZipEntry* data = zip->Find("archive/data/0");
    REQUIRE(data != nullptr);
    CHECK(data->compressed_size == a.data_bytes());
    CHECK(data->uncompressed_size == a.data_bytes());
    CHECK(data->data_offset == a.data_offset());
    CHECK(data->crc32 == 0x12345678u);
    const ZipEntry* version = zip->Find("archive/version");
    REQUIRE(version != nullptr);
    CHECK(version->local_header_offset == a.zip.placements[3].header_offset);
    // Offsets past 4 GiB take the zip64 field too.
    CHECK((version->local_header_offset >= 0xffffffffu) == (a.data_offset() + a.data_bytes() >= 0xffffffffu));
    auto t = ParseTorchSaveTensor(v.size(), v.Reader());
    REQUIRE(t.ok());
    CHECK(t->ref.dtype == dtype);
    CHECK(t->ref.shape == shape);
    CHECK(t->storage_inclusive_min == a.data_offset());
    CHECK(t->storage_exclusive_max == a.data_offset() + a.data_bytes());
    CHECK(t->ref.IsRowMajorContiguous());
  }
}

}  // namespace
}  // namespace fc
