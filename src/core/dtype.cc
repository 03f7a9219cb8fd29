#include "fc/core/dtype.h"

#include <string>

namespace fc {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat8E8M0FNU:
    case DType::kFloat4E2M1FNx2: return 1;
    case DType::kFloat6E2M3FNx4:
    case DType::kFloat6E3M2FNx4: return 3;
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kInt32:
    case DType::kUInt32:
    case DType::kFloat32: return 4;
    case DType::kInt64:
    case DType::kUInt64:
    case DType::kFloat64:
    case DType::kComplex64: return 8;
  }
  return 0;
}

int DTypeValuesPerElement(DType dtype) {
  switch (dtype) {
    case DType::kFloat4E2M1FNx2: return 2;
    case DType::kFloat6E2M3FNx4:
    case DType::kFloat6E3M2FNx4: return 4;
    default: return 1;
  }
}

int DTypeValueBits(DType dtype) {
  switch (dtype) {
    case DType::kFloat4E2M1FNx2: return 4;
    case DType::kFloat6E2M3FNx4:
    case DType::kFloat6E3M2FNx4: return 6;
    default: return static_cast<int>(8 * DTypeSize(dtype));
  }
}

bool IsPacked(DType dtype) { return DTypeValuesPerElement(dtype) > 1; }

bool IsFloating(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat8E8M0FNU: return true;
    default: return false;
  }
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat8E4M3FN: return "float8_e4m3fn";
    case DType::kFloat8E5M2: return "float8_e5m2";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kComplex64: return "complex64";
    case DType::kFloat8E4M3FNUZ: return "float8_e4m3fnuz";
    case DType::kFloat8E5M2FNUZ: return "float8_e5m2fnuz";
    case DType::kFloat8E8M0FNU: return "float8_e8m0fnu";
    case DType::kFloat4E2M1FNx2: return "float4_e2m1fn_x2";
    case DType::kFloat6E2M3FNx4: return "float6_e2m3fn_x4";
    case DType::kFloat6E3M2FNx4: return "float6_e3m2fn_x4";
  }
  return "unknown";
}

std::string_view DTypeSafetensorsName(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "BOOL";
    case DType::kUInt8: return "U8";
    case DType::kInt8: return "I8";
    case DType::kInt16: return "I16";
    case DType::kInt32: return "I32";
    case DType::kInt64: return "I64";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kFloat32: return "F32";
    case DType::kFloat64: return "F64";
    case DType::kFloat8E4M3FN: return "F8_E4M3";
    case DType::kFloat8E5M2: return "F8_E5M2";
    case DType::kUInt16: return "U16";
    case DType::kUInt32: return "U32";
    case DType::kUInt64: return "U64";
    case DType::kComplex64: return "C64";
    case DType::kFloat8E4M3FNUZ: return "F8_E4M3FNUZ";
    case DType::kFloat8E5M2FNUZ: return "F8_E5M2FNUZ";
    case DType::kFloat8E8M0FNU: return "F8_E8M0";
    case DType::kFloat4E2M1FNx2: return "F4";
    case DType::kFloat6E2M3FNx4: return "F6_E2M3";
    case DType::kFloat6E3M2FNx4: return "F6_E3M2";
  }
  return "UNKNOWN";
}

std::string_view DTypeNumpyName(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "|b1";
    case DType::kUInt8: return "|u1";
    case DType::kInt8: return "|i1";
    case DType::kInt16: return "<i2";
    case DType::kInt32: return "<i4";
    case DType::kInt64: return "<i8";
    case DType::kFloat16: return "<f2";
    case DType::kBFloat16: return "<u2";
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kFloat8E4M3FN: return "|u1";
    case DType::kFloat8E5M2: return "|u1";
    case DType::kUInt16: return "<u2";
    case DType::kUInt32: return "<u4";
    case DType::kUInt64: return "<u8";
    case DType::kComplex64: return "<c8";
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat8E8M0FNU:
    case DType::kFloat4E2M1FNx2: return "|u1";
    case DType::kFloat6E2M3FNx4:
    case DType::kFloat6E3M2FNx4: return "|V3";
  }
  return "";
}

namespace {

struct Alias {
  std::string_view name;
  DType dtype;
};

// Torch spellings (canonical and aliases) and numpy type strings. "|u1" parses as uint8 and
// "<u2" as uint16 (numpy's meanings, although numpy-based tools also carry float8 and
// bfloat16 bit patterns in them).
constexpr Alias kTorchAndNumpyNames[] = {
    {"bool", DType::kBool},
    {"uint8", DType::kUInt8},
    {"int8", DType::kInt8},
    {"int16", DType::kInt16},
    {"short", DType::kInt16},
    {"int32", DType::kInt32},
    {"int", DType::kInt32},
    {"int64", DType::kInt64},
    {"long", DType::kInt64},
    {"float16", DType::kFloat16},
    {"half", DType::kFloat16},
    {"bfloat16", DType::kBFloat16},
    {"float32", DType::kFloat32},
    {"float", DType::kFloat32},
    {"float64", DType::kFloat64},
    {"double", DType::kFloat64},
    {"float8_e4m3fn", DType::kFloat8E4M3FN},
    {"float8_e5m2", DType::kFloat8E5M2},
    {"uint16", DType::kUInt16},
    {"uint32", DType::kUInt32},
    {"uint64", DType::kUInt64},
    {"complex64", DType::kComplex64},
    {"cfloat", DType::kComplex64},
    {"float8_e4m3fnuz", DType::kFloat8E4M3FNUZ},
    {"float8_e5m2fnuz", DType::kFloat8E5M2FNUZ},
    {"float8_e8m0fnu", DType::kFloat8E8M0FNU},
    {"float4_e2m1fn_x2", DType::kFloat4E2M1FNx2},
    {"float6_e2m3fn_x4", DType::kFloat6E2M3FNx4},
    {"float6_e3m2fn_x4", DType::kFloat6E3M2FNx4},
    {"|b1", DType::kBool},
    {"|u1", DType::kUInt8},
    {"|i1", DType::kInt8},
    {"<i2", DType::kInt16},
    {"<i4", DType::kInt32},
    {"<i8", DType::kInt64},
    {"<f2", DType::kFloat16},
    {"<f4", DType::kFloat32},
    {"<f8", DType::kFloat64},
    {"<u2", DType::kUInt16},
    {"<u4", DType::kUInt32},
    {"<u8", DType::kUInt64},
    {"<c8", DType::kComplex64},
};

constexpr Alias kSafetensorsNames[] = {
    {"BOOL", DType::kBool},         {"U8", DType::kUInt8},    {"I8", DType::kInt8},
    {"I16", DType::kInt16},         {"I32", DType::kInt32},   {"I64", DType::kInt64},
    {"F16", DType::kFloat16},       {"BF16", DType::kBFloat16}, {"F32", DType::kFloat32},
    {"F64", DType::kFloat64},       {"F8_E4M3", DType::kFloat8E4M3FN},
    {"F8_E5M2", DType::kFloat8E5M2},
    {"U16", DType::kUInt16},        {"U32", DType::kUInt32},  {"U64", DType::kUInt64},
    {"C64", DType::kComplex64},     {"F8_E4M3FNUZ", DType::kFloat8E4M3FNUZ},
    {"F8_E5M2FNUZ", DType::kFloat8E5M2FNUZ},
    {"F8_E8M0", DType::kFloat8E8M0FNU},
    {"F4", DType::kFloat4E2M1FNx2},       {"F6_E2M3", DType::kFloat6E2M3FNx4},
    {"F6_E3M2", DType::kFloat6E3M2FNx4},
};

// Safetensors dtype strings that no DType holds: C128, which some third-party readers list.
constexpr std::string_view kSafetensorsUnsupported[] = {"C128"};

}  // namespace

Result<DType> ParseSafetensorsDType(std::string_view name) {
  for (const Alias& a : kSafetensorsNames) {
    if (a.name == name) return a.dtype;
  }
  for (std::string_view u : kSafetensorsUnsupported) {
    if (u == name) {
      return UnimplementedError("safetensors dtype '" + std::string(name) +
                                "' is not supported");
    }
  }
  return InvalidArgumentError("unknown safetensors dtype '" + std::string(name) + "'");
}

Result<DType> ParseDType(std::string_view name) {
  std::string_view n = name;
  constexpr std::string_view kTorchPrefix = "torch.";
  if (n.substr(0, kTorchPrefix.size()) == kTorchPrefix) n.remove_prefix(kTorchPrefix.size());
  for (const Alias& a : kTorchAndNumpyNames) {
    if (a.name == n) return a.dtype;
  }
  if (n.size() == name.size()) {  // no "torch." prefix: also accept safetensors names
    for (const Alias& a : kSafetensorsNames) {
      if (a.name == n) return a.dtype;
    }
  }
  return InvalidArgumentError("unknown dtype '" + std::string(name) + "'");
}

}  // namespace fc
