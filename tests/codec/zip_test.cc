// Zip directory reader: a real item cut out of a fixture .distcp file, and archives built
// here (every directory form, zip64 extras, padding, damage).
#include <algorithm>
#include <cstring>

#include <catch2/catch.hpp>

#include "fc/codec/zip.h"
#include "tests/codec/zip_builder.h"
#include "tests/format/torch/torch_test_support.h"

namespace fc {
namespace {

using testing::AsBytes;
using testing::BuildZip;
using testing::Put;
using testing::PutStr;
using testing::ZipOptions;
using testing::ZipRec;

TEST_CASE("zip: a real torch 1.13 DCP item", "[zip]") {
  const auto item = testing::DcpFixtureItem("even_2d_f32", "w");
  auto dir = ParseZipDirectory(item);
  REQUIRE(dir.ok());
  CHECK(dir->zip64);
  REQUIRE(dir->Find("archive/data.pkl") != nullptr);
  REQUIRE(dir->Find("archive/data/0") != nullptr);
  const ZipEntry* version = dir->Find("archive/version");
  REQUIRE(version != nullptr);
  for (const ZipEntry& e : dir->entries) {
    INFO(e.name);
    CHECK(e.method == 0);
    CHECK(e.data_offset % 64 == 0);
  }
  CHECK(dir->Find("archive/data.pkl")->data_offset == 64);
  REQUIRE(version->compressed_size == 2);
  CHECK(std::memcmp(item.data() + version->data_offset, "3\n", 2) == 0);
  CHECK(dir->Find("archive/data/0")->compressed_size == 4 * 6 * 4);
}

TEST_CASE("zip: built archives in every directory form", "[zip]") {
  const std::vector<ZipRec> recs = {{"a/x", AsBytes("hello")}, {"a/y", AsBytes("")},
                                    {"a/z", AsBytes("0123456789")}};
  ZipOptions forms[4];
  forms[1].zip64_extra = true;
  forms[2].zip64_eocd = false;
  forms[2].align = 0;
  forms[2].flags = 0;
  forms[3].comment = "a comment with PK\x05\x06 inside";
  for (int f = 0; f < 4; ++f) {
    INFO("form " << f);
    const auto zip = BuildZip(recs, forms[f]);
    auto dir = ParseZipDirectory(zip);
    REQUIRE(dir.ok());
    REQUIRE(dir->entries.size() == 3);
    CHECK(dir->zip64 == forms[f].zip64_eocd);
    for (size_t i = 0; i < recs.size(); ++i) {
      const ZipEntry& e = dir->entries[i];
      CHECK(e.name == recs[i].name);
      REQUIRE(e.compressed_size == recs[i].data.size());
      CHECK(std::equal(recs[i].data.begin(), recs[i].data.end(),
                       zip.begin() + static_cast<std::ptrdiff_t>(e.data_offset)));
      if (forms[f].align) CHECK(e.data_offset % 64 == 0);
    }
  }
}

TEST_CASE("zip: an archive with no entries (found by fuzz/zip_fuzzer)", "[zip]") {
  // Just the 22-byte end record: 0 entries, an empty central directory at offset 0. The
  // reader copied the 0-byte directory from a null pointer (UBSan: memcpy nonnull).
  std::vector<std::byte> zip(22, std::byte{0});
  zip[0] = std::byte{'P'}, zip[1] = std::byte{'K'}, zip[2] = std::byte{5}, zip[3] = std::byte{6};
  auto dir = ParseZipDirectory(zip);
  REQUIRE(dir.ok());
  CHECK(dir->entries.empty());
  CHECK(dir->Find("data.pkl") == nullptr);
}

// Applies `damage` to a built archive and expects a DataLoss/Unimplemented naming `what`.
void ExpectZipError(std::vector<std::byte> zip, StatusCode code, const std::string& what) {
  auto dir = ParseZipDirectory(zip);
  REQUIRE(!dir.ok());
  CHECK(dir.status().code() == code);
  CHECK_THAT(dir.status().message(), Catch::Contains(what));
}

TEST_CASE("zip: corrupt directories are refused", "[zip]") {
  const std::vector<ZipRec> recs = {{"a/x", AsBytes("hello")}, {"a/y", AsBytes("world!")}};
  const auto good = BuildZip(recs);
  REQUIRE(ParseZipDirectory(good).ok());
  auto dir = *ParseZipDirectory(good);
  const size_t eocd = good.size() - 22;
  const size_t z64 = eocd - 20 - 56;
  const size_t cd = dir.central_directory_offset;

  SECTION("too small") {
    ExpectZipError(std::vector<std::byte>(good.begin(), good.begin() + 10), StatusCode::kDataLoss,
                   "too small");
  }
  SECTION("no EOCD") {
    auto z = good;
    z[eocd] = std::byte{'X'};
    ExpectZipError(z, StatusCode::kDataLoss, "no end-of-central-directory");
  }
  SECTION("truncated tail") {
    ExpectZipError(std::vector<std::byte>(good.begin(), good.end() - 30), StatusCode::kDataLoss,
                   "end-of-central-directory");
  }
  SECTION("zip64 EOCD signature") {
    auto z = good;
    z[z64] = std::byte{'X'};
    ExpectZipError(z, StatusCode::kDataLoss, "zip64 end-of-central-directory signature");
  }
  SECTION("central directory past its end") {
    auto z = good;
    z[z64 + 40] = std::byte{0xff};  // cd_size low byte
    z[z64 + 41] = std::byte{0xff};
    ExpectZipError(z, StatusCode::kDataLoss, "passes its end record");
  }
  SECTION("absurd entry count") {
    auto z = good;
    for (int i = 0; i < 8; ++i) z[z64 + 32 + i] = std::byte{0x7f};
    ExpectZipError(z, StatusCode::kDataLoss, "limits");
  }
  SECTION("central header signature") {
    auto z = good;
    z[cd] = std::byte{'X'};
    ExpectZipError(z, StatusCode::kDataLoss, "central directory signature");
  }
  SECTION("local header signature") {
    auto z = good;
    z[0] = std::byte{'X'};
    ExpectZipError(z, StatusCode::kDataLoss, "bad local header signature");
  }
  SECTION("local header offset beyond the directory") {
    auto z = good;
    z[cd + 42 + 3] = std::byte{0x70};
    ExpectZipError(z, StatusCode::kDataLoss, "local header offset");
  }
  SECTION("local header names another entry") {
    auto z = good;
    z[30 + 2] = std::byte{'q'};  // 'a/x' -> 'a/q' in the first local header
    ExpectZipError(z, StatusCode::kDataLoss, "names another entry");
  }
  SECTION("data passes the directory") {
    auto z = good;
    z[cd + 20 + 2] = std::byte{0x01};  // csize of entry 0 += 65536
    z[cd + 24 + 2] = std::byte{0x01};
    ExpectZipError(z, StatusCode::kDataLoss, "passes the central directory");
  }
  SECTION("stored sizes disagree") {
    auto z = good;
    z[cd + 24] = std::byte{0x04};  // usize 5 -> 4
    ExpectZipError(z, StatusCode::kDataLoss, "STORED entry 'a/x'");
  }
  SECTION("duplicate names") {
    auto z = good;
    z[cd + 46 + 3 + 46 + 2] = std::byte{'x'};  // central name 'a/y' -> 'a/x'
    ExpectZipError(z, StatusCode::kDataLoss, "duplicate entry 'a/x'");
  }
  SECTION("overlapping entries") {
    // Entry 0's data embeds a valid local header for 'a/y'; entry 1 is pointed at it.
    std::vector<std::byte> fake;
    Put(fake, 0x04034b50, 4);
    Put(fake, 0, 22);
    Put(fake, 3, 2);
    Put(fake, 0, 2);
    PutStr(fake, "a/y");
    PutStr(fake, "world!");
    auto z = BuildZip({{"a/x", fake}, {"a/y", AsBytes("world!")}});
    auto d = *ParseZipDirectory(z);
    const uint64_t inner = d.entries[0].data_offset;
    const size_t cd1 = d.central_directory_offset + 46 + 3;
    for (int i = 0; i < 4; ++i) z[cd1 + 42 + i] = static_cast<std::byte>(inner >> (8 * i));
    ExpectZipError(z, StatusCode::kDataLoss, "'a/x' and 'a/y' overlap");
  }
  SECTION("encrypted") {
    auto z = good;
    z[cd + 8] = std::byte{0x09};
    ExpectZipError(z, StatusCode::kUnimplemented, "encrypted");
  }
  SECTION("multi-disk") {
    auto z = good;
    z[eocd - 20 + 16] = std::byte{3};  // locator: 3 disks
    ExpectZipError(z, StatusCode::kUnimplemented, "multi-disk");
  }
  SECTION("saturated fields without zip64 extra") {
    ZipOptions o;
    o.zip64_extra = true;
    auto z = BuildZip(recs, o);
    auto d = *ParseZipDirectory(z);
    z[d.central_directory_offset + 30] = std::byte{0};  // extra_len 28 -> 0
    ExpectZipError(z, StatusCode::kDataLoss, "no zip64 extra field");
  }
}

}  // namespace
}  // namespace fc
