#include "fc/core/dtype.h"
#include "fc/core/dtype_convert.h"

#include <catch2/catch.hpp>

#include <string>

namespace fc {
namespace {

TEST_CASE("DType sizes and IsFloating", "[core][dtype]") {
  CHECK(DTypeSize(DType::kBool) == 1);
  CHECK(DTypeSize(DType::kUInt8) == 1);
  CHECK(DTypeSize(DType::kInt8) == 1);
  CHECK(DTypeSize(DType::kInt16) == 2);
  CHECK(DTypeSize(DType::kInt32) == 4);
  CHECK(DTypeSize(DType::kInt64) == 8);
  CHECK(DTypeSize(DType::kFloat16) == 2);
  CHECK(DTypeSize(DType::kBFloat16) == 2);
  CHECK(DTypeSize(DType::kFloat32) == 4);
  CHECK(DTypeSize(DType::kFloat64) == 8);
  CHECK(DTypeSize(DType::kFloat8E4M3FN) == 1);
  CHECK(DTypeSize(DType::kFloat8E5M2) == 1);
  CHECK(DTypeSize(DType::kUInt16) == 2);
  CHECK(DTypeSize(DType::kUInt32) == 4);
  CHECK(DTypeSize(DType::kUInt64) == 8);
  CHECK(DTypeSize(DType::kComplex64) == 8);
  CHECK(DTypeSize(DType::kFloat8E4M3FNUZ) == 1);
  CHECK(DTypeSize(DType::kFloat8E5M2FNUZ) == 1);
  CHECK(DTypeSize(DType::kFloat8E8M0FNU) == 1);
  int floating = 0;
  for (DType d : kAllDTypes) floating += IsFloating(d);
  CHECK(floating == 9);
  CHECK_FALSE(IsFloating(DType::kComplex64));
  CHECK_FALSE(IsFloating(DType::kUInt64));
  CHECK_FALSE(IsFloating(DType::kBool));
  CHECK_FALSE(IsFloating(DType::kInt64));
  CHECK(IsFloating(DType::kFloat8E5M2));
}

TEST_CASE("DType names", "[core][dtype]") {
  CHECK(DTypeName(DType::kBFloat16) == "bfloat16");
  CHECK(DTypeName(DType::kFloat8E4M3FN) == "float8_e4m3fn");
  CHECK(DTypeName(DType::kFloat8E5M2) == "float8_e5m2");
  CHECK(DTypeSafetensorsName(DType::kBool) == "BOOL");
  CHECK(DTypeSafetensorsName(DType::kBFloat16) == "BF16");
  CHECK(DTypeSafetensorsName(DType::kFloat8E4M3FN) == "F8_E4M3");
  CHECK(DTypeNumpyName(DType::kFloat32) == "<f4");
  CHECK(DTypeNumpyName(DType::kBool) == "|b1");
  CHECK(DTypeNumpyName(DType::kBFloat16) == "<u2");
  CHECK(DTypeNumpyName(DType::kFloat8E5M2) == "|u1");
  CHECK(DTypeName(DType::kFloat8E8M0FNU) == "float8_e8m0fnu");
  CHECK(DTypeSafetensorsName(DType::kFloat8E8M0FNU) == "F8_E8M0");
  CHECK(DTypeSafetensorsName(DType::kFloat8E4M3FNUZ) == "F8_E4M3FNUZ");
  CHECK(DTypeSafetensorsName(DType::kFloat8E5M2FNUZ) == "F8_E5M2FNUZ");
  CHECK(DTypeSafetensorsName(DType::kComplex64) == "C64");
  CHECK(DTypeSafetensorsName(DType::kUInt64) == "U64");
  CHECK(DTypeNumpyName(DType::kComplex64) == "<c8");
}

TEST_CASE("ParseDType round-trips every spelling", "[core][dtype]") {
  for (DType d : kAllDTypes) {
    INFO(DTypeName(d));
    auto a = ParseDType(DTypeName(d));
    REQUIRE(a.ok());
    CHECK(*a == d);
    auto b = ParseDType("torch." + std::string(DTypeName(d)));
    REQUIRE(b.ok());
    CHECK(*b == d);
    auto c = ParseDType(DTypeSafetensorsName(d));
    REQUIRE(c.ok());
    CHECK(*c == d);
    auto s = ParseSafetensorsDType(DTypeSafetensorsName(d));
    REQUIRE(s.ok());
    CHECK(*s == d);
  }
  // numpy spellings that name exactly one dtype.
  for (DType d : {DType::kBool, DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64,
                  DType::kFloat16, DType::kFloat32, DType::kFloat64, DType::kUInt16,
                  DType::kUInt32, DType::kUInt64, DType::kComplex64}) {
    INFO(DTypeNumpyName(d));
    auto r = ParseDType(DTypeNumpyName(d));
    REQUIRE(r.ok());
    CHECK(*r == d);
  }
}

TEST_CASE("ParseDType aliases", "[core][dtype]") {
  const std::pair<const char*, DType> cases[] = {
      {"float", DType::kFloat32},         {"half", DType::kFloat16},
      {"double", DType::kFloat64},        {"long", DType::kInt64},
      {"int", DType::kInt32},             {"short", DType::kInt16},
      {"torch.float", DType::kFloat32},   {"torch.half", DType::kFloat16},
      {"torch.long", DType::kInt64},      {"torch.bfloat16", DType::kBFloat16},
      {"F8_E5M2", DType::kFloat8E5M2},    {"BF16", DType::kBFloat16},
  };
  for (const auto& [name, d] : cases) {
    INFO(name);
    auto r = ParseDType(name);
    REQUIRE(r.ok());
    CHECK(*r == d);
  }
}

TEST_CASE("packed sub-byte dtypes", "[core][dtype]") {
  CHECK(DTypeSize(DType::kFloat4E2M1FNx2) == 1);
  CHECK(DTypeSize(DType::kFloat6E2M3FNx4) == 3);
  CHECK(DTypeSize(DType::kFloat6E3M2FNx4) == 3);
  CHECK(DTypeValuesPerElement(DType::kFloat4E2M1FNx2) == 2);
  CHECK(DTypeValuesPerElement(DType::kFloat6E3M2FNx4) == 4);
  CHECK(DTypeValuesPerElement(DType::kFloat32) == 1);
  CHECK(DTypeValueBits(DType::kFloat6E2M3FNx4) == 6);
  CHECK(DTypeValueBits(DType::kBFloat16) == 16);
  for (DType d : kPackedDTypes) {
    INFO(DTypeName(d));
    CHECK(IsPacked(d));
    CHECK_FALSE(IsFloating(d));  // never cast
    CHECK(*ParseDType(DTypeName(d)) == d);
    CHECK(*ParseSafetensorsDType(DTypeSafetensorsName(d)) == d);
    uint8_t a[3] = {1, 2, 3}, b[3] = {};
    CHECK(ConvertElements(a, d, b, d, 1).ok());  // same dtype: copied
    CHECK(b[0] == 1);
    CHECK(ConvertElements(a, d, b, DType::kUInt8, 1).code() == StatusCode::kUnimplemented);
  }
  for (DType d : kAllDTypes) CHECK_FALSE(IsPacked(d));
  CHECK(DTypeName(DType::kFloat4E2M1FNx2) == "float4_e2m1fn_x2");
  CHECK(DTypeSafetensorsName(DType::kFloat6E2M3FNx4) == "F6_E2M3");
}

TEST_CASE("ParseDType rejects unknown names", "[core][dtype]") {
  for (const char* bad : {"", "floaty", "torch.", "Float32", "complex128", "torch.BF16",
                          "uint128", "f32", "<u16", "F5", "float4"}) {
    INFO(bad);
    auto r = ParseDType(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("'" + std::string(bad) + "'") != std::string::npos);
  }
}

TEST_CASE("ParseSafetensorsDType unsupported and garbage", "[core][dtype]") {
  for (const char* u : {"C128"}) {
    INFO(u);
    auto r = ParseSafetensorsDType(u);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kUnimplemented);
    CHECK(r.status().message().find(u) != std::string::npos);
  }
  for (const char* g : {"", "f32", "float32", "XYZ", "BF16 "}) {
    INFO(g);
    auto r = ParseSafetensorsDType(g);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("'" + std::string(g) + "'") != std::string::npos);
  }
}

}  // namespace
}  // namespace fc
