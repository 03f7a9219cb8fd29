// torch.save tensor location: real items cut out of fixture .distcp files, and archives
// built here (zip64 extras, padding, damage, crafted data.pkl). The zip directory reader's
// own cases are tests/codec/zip_test.cc.
#include <algorithm>
#include <cstring>

#include <catch2/catch.hpp>

#include "fc/format/torch_dcp.h"
#include "fc/format/torch_save.h"
#include "fc/codec/zip.h"
#include "tests/format/torch/torch_test_support.h"
#include "tests/codec/zip_builder.h"

namespace fc {
namespace {

using testing::BuildZip;
using testing::PickleWriter;
using testing::Floats;
using testing::TensorArchive;
using testing::TensorPickle;

TEST_CASE("torch.save: a real DCP tensor item", "[torch_save]") {
  const auto item = testing::DcpFixtureItem("even_2d_f32", "w");
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
  const auto item = testing::DcpFixtureItem("even_2d_f32", "iteration");
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
