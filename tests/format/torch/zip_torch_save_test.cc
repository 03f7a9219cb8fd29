// Zip directory reader and torch.save tensor location: real items cut out of fixture
// .distcp files, and archives built here (zip64 extras, padding, damage, crafted data.pkl).
#include <algorithm>
#include <cstring>

#include <catch2/catch.hpp>

#include "fc/format/torch_dcp.h"
#include "fc/format/torch_save.h"
#include "fc/codec/zip.h"
#include "tests/format/torch/torch_test_support.h"
#include "tests/format/torch/zip_builder.h"

namespace fc {
namespace {

using testing::AsBytes;
using testing::PickleWriter;

using testing::BuildZip;
using testing::Put;
using testing::PutStr;
using testing::Floats;
using testing::TensorArchive;
using testing::TensorPickle;
using testing::ZipOptions;
using testing::ZipRec;

// The archive of the first chunk of fixture tensor `fqn`.
std::vector<std::byte> FixtureItem(const std::string& fixture, const std::string& fqn) {
  const std::string ckpt = testing::TorchFixture(fixture) + "/ckpt";
  auto md = ParseDcpMetadata(testing::ReadFileBytes(ckpt + "/.metadata"));
  REQUIRE(md.ok());
  for (const DcpStorageInfo& s : md->storage) {
    if (s.fqn != fqn) continue;
    auto file = testing::ReadFileBytes(ckpt + "/" + s.relative_path);
    REQUIRE(s.offset + s.length <= file.size());
    return std::vector<std::byte>(file.begin() + static_cast<std::ptrdiff_t>(s.offset),
                                  file.begin() + static_cast<std::ptrdiff_t>(s.offset + s.length));
  }
  FAIL("no storage for " << fqn);
  return {};
}

TEST_CASE("zip: a real torch 1.13 DCP item", "[zip]") {
  const auto item = FixtureItem("even_2d_f32", "w");
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

TEST_CASE("torch.save: a real DCP tensor item", "[torch_save]") {
  const auto item = FixtureItem("even_2d_f32", "w");
  auto t = ParseTorchSaveTensor(item);
  REQUIRE(t.ok());
  CHECK(t->ref.dtype == DType::kFloat32);
  CHECK(t->ref.shape == Shape{4, 6});
  CHECK(t->ref.strides == Shape{6, 1});
  CHECK(t->ref.storage_offset == 0);
  CHECK(t->ref.storage_key == "0");
  CHECK(t->ref.storage_bytes == 96);
  CHECK(t->ref.IsRowMajorContiguous());
  CHECK(t->ref.ViewSpanBytes() == 96);
  CHECK(t->storage_exclusive_max - t->storage_inclusive_min == 96);
  CHECK(t->storage_inclusive_min % 64 == 0);
  CHECK(t->first_element_offset == t->storage_inclusive_min);
}

TEST_CASE("torch.save: a BYTE_IO object item", "[torch_save]") {
  const auto item = FixtureItem("even_2d_f32", "iteration");
  auto archive = ReadTorchSaveArchive(item.size(), MemoryZipReader(item));
  REQUIRE(archive.ok());
  CHECK(archive->prefix == "archive");
  auto v = ReadTorchSavePickle(*archive, MemoryZipReader(item));
  REQUIRE(v.ok());
  CHECK(v->int_value == 100);
  // Not a tensor.
  auto t = ParseTorchSaveTensor(item);
  CHECK(t.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(t.status().message(), Catch::Contains("does not hold a tensor"));
}

TEST_CASE("torch.save: views, v3, wrappers", "[torch_save]") {
  const auto storage = Floats({0, 1, 2, 3, 4, 5});
  SECTION("transposed") {
    auto t = ParseTorchSaveTensor(
        TensorArchive(TensorPickle("FloatStorage", "0", 6, 0, {2, 3}, {1, 2}), storage));
    REQUIRE(t.ok());
    CHECK_FALSE(t->ref.IsRowMajorContiguous());
    CHECK(t->ref.ViewSpanBytes() == 24);
  }
  SECTION("storage offset") {
    auto t = ParseTorchSaveTensor(
        TensorArchive(TensorPickle("FloatStorage", "0", 6, 2, {3}, {1}), storage));
    REQUIRE(t.ok());
    CHECK(t->first_element_offset == t->storage_inclusive_min + 8);
    CHECK(t->ref.ViewSpanBytes() == 12);
  }
  SECTION("size-1 axes do not break contiguity") {
    auto t = ParseTorchSaveTensor(
        TensorArchive(TensorPickle("FloatStorage", "0", 6, 0, {1, 6}, {1, 1}), storage));
    REQUIRE(t.ok());
    CHECK(t->ref.IsRowMajorContiguous());
  }
  SECTION("v3 with UntypedStorage counts bytes") {
    std::vector<std::byte> fp8(6, std::byte{0x38});
    auto t = ParseTorchSaveTensor(TensorArchive(
        TensorPickle("UntypedStorage", "0", 6, 0, {2, 3}, {3, 1}, "float8_e4m3fn"), fp8));
    REQUIRE(t.ok());
    CHECK(t->ref.dtype == DType::kFloat8E4M3FN);
    CHECK(t->ref.storage_bytes == 6);
  }
  SECTION("v3 with an unsupported dtype") {
    std::vector<std::byte> u16(12);
    auto t = ParseTorchSaveTensor(
        TensorArchive(TensorPickle("UntypedStorage", "0", 12, 0, {6}, {1}, "uint16"), u16));
    CHECK(t.status().code() == StatusCode::kUnimplemented);
    CHECK_THAT(t.status().message(), Catch::Contains("unsupported dtype torch.uint16"));
  }
  SECTION("nn.Parameter wrapper") {
    PickleWriter w;
    w.Proto(2).Global("torch._utils", "_rebuild_parameter").Mark();
    auto inner = TensorPickle("FloatStorage", "0", 6, 0, {6}, {1});
    inner.erase(inner.begin(), inner.begin() + 2);  // drop PROTO
    inner.pop_back();                                // drop STOP
    w.Raw(inner).Bool(false).Global("collections", "OrderedDict").EmptyTuple().Reduce();
    w.Tuple().Reduce().Stop();
    auto t = ParseTorchSaveTensor(TensorArchive(w.bytes(), storage));
    REQUIRE(t.ok());
    CHECK(t->ref.shape == Shape{6});
  }
  SECTION("a quantized tensor is unsupported") {
    PickleWriter w;
    w.Proto(2).Global("torch._utils", "_rebuild_qtensor").EmptyTuple().Reduce().Stop();
    auto t = ParseTorchSaveTensor(TensorArchive(w.bytes(), storage));
    CHECK(t.status().code() == StatusCode::kUnimplemented);
    CHECK_THAT(t.status().message(), Catch::Contains("_rebuild_qtensor"));
  }
}

TEST_CASE("torch.save: validation", "[torch_save]") {
  const auto storage = Floats({0, 1, 2, 3, 4, 5});
  struct Case {
    const char* name;
    std::vector<std::byte> archive;
    StatusCode code;
    const char* substr;
  };
  std::vector<Case> cases;
  cases.push_back({"view beyond storage",
                   TensorArchive(TensorPickle("FloatStorage", "0", 6, 1, {2, 3}, {3, 1}), storage),
                   StatusCode::kDataLoss, "needs 28 bytes of storage '0', which has 24"});
  cases.push_back({"stride overflow",
                   TensorArchive(TensorPickle("FloatStorage", "0", 6, 0, {2, 3},
                                              {int64_t{1} << 62, 1}),
                                 storage),
                   StatusCode::kDataLoss, "needs"});
  cases.push_back({"negative stride",
                   TensorArchive(TensorPickle("FloatStorage", "0", 6, 0, {6}, {-1}), storage),
                   StatusCode::kDataLoss, "stride has an entry that is not an int >= 0"});
  cases.push_back({"rank mismatch",
                   TensorArchive(TensorPickle("FloatStorage", "0", 6, 0, {6}, {1, 1}), storage),
                   StatusCode::kDataLoss, "differ in rank"});
  cases.push_back({"record size != numel",
                   TensorArchive(TensorPickle("FloatStorage", "0", 5, 0, {5}, {1}), storage),
                   StatusCode::kDataLoss, "has 24 bytes, data.pkl says 20"});
  cases.push_back({"storage numel overflow",
                   TensorArchive(TensorPickle("DoubleStorage", "0", int64_t{1} << 62, 0, {1}, {1}),
                                 storage),
                   StatusCode::kDataLoss, "overflows"});
  cases.push_back({"missing record",
                   TensorArchive(TensorPickle("FloatStorage", "7", 6, 0, {6}, {1}), storage),
                   StatusCode::kDataLoss, "'archive/data/7' is missing"});
  cases.push_back({"unknown storage class",
                   TensorArchive(TensorPickle("FlaatStorage", "0", 6, 0, {6}, {1}), storage),
                   StatusCode::kUnimplemented, "unknown storage class torch.FlaatStorage"});
  cases.push_back({"complex storage",
                   TensorArchive(TensorPickle("ComplexFloatStorage", "0", 3, 0, {3}, {1}), storage),
                   StatusCode::kUnimplemented, "unsupported storage class"});
  cases.push_back({"untyped storage with v2",
                   TensorArchive(TensorPickle("UntypedStorage", "0", 24, 0, {6}, {1}), storage),
                   StatusCode::kDataLoss, "carries no dtype"});
  cases.push_back({"no data.pkl",
                   BuildZip({{"archive/data/0", storage}}), StatusCode::kDataLoss,
                   "no 'archive/data.pkl'"});
  cases.push_back({"no prefix", BuildZip({{"data.pkl", storage}}), StatusCode::kDataLoss,
                   "no '<archive>/' prefix"});
  cases.push_back({"compressed data.pkl",
                   BuildZip({{"archive/data.pkl", storage, 8}}), StatusCode::kUnimplemented,
                   "compressed"});
  cases.push_back({"corrupt data.pkl",
                   TensorArchive(testing::Hex("80 02 ff"), storage), StatusCode::kDataLoss,
                   "archive/data.pkl: pickle: opcode 0xff at byte 2"});
  for (const Case& c : cases) {
    INFO(c.name);
    auto t = ParseTorchSaveTensor(c.archive);
    REQUIRE(!t.ok());
    CHECK(t.status().code() == c.code);
    CHECK_THAT(t.status().message(), Catch::Contains(c.substr));
  }
}

TEST_CASE("torch.save: dtype names", "[torch_save]") {
  CHECK(*TorchDTypeFromName("bfloat16") == DType::kBFloat16);
  CHECK(*TorchDTypeFromName("float8_e5m2") == DType::kFloat8E5M2);
  CHECK(*TorchDTypeFromName("bool") == DType::kBool);
  CHECK(TorchDTypeFromName("complex64").status().code() == StatusCode::kUnimplemented);
  auto unknown = TorchDTypeFromName("float128");
  CHECK(unknown.status().code() == StatusCode::kUnimplemented);
  CHECK_THAT(unknown.status().message(), Catch::Contains("unknown dtype torch.float128"));
}

}  // namespace
}  // namespace fc
