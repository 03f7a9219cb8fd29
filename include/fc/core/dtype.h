// Element types of checkpoint tensors, their names in the torch, numpy and safetensors
// spellings, and element sizes. Conversions between types live in core/dtype_convert.h.
//
// Thread-safety: pure functions.
#ifndef FC_CORE_DTYPE_H_
#define FC_CORE_DTYPE_H_

#include <cstddef>
#include <string_view>

#include "fc/core/status.h"

namespace fc {

enum class DType {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kFloat8E4M3FN,
  kFloat8E5M2,
};

inline constexpr DType kAllDTypes[] = {
    DType::kBool,    DType::kUInt8,    DType::kInt8,    DType::kInt16,
    DType::kInt32,   DType::kInt64,    DType::kFloat16, DType::kBFloat16,
    DType::kFloat32, DType::kFloat64,  DType::kFloat8E4M3FN, DType::kFloat8E5M2,
};

// Bytes per element: 1, 2, 4 or 8.
size_t DTypeSize(DType dtype);

// True for float16, bfloat16, float32, float64 and the two float8 types.
bool IsFloating(DType dtype);

// Canonical (torch) name: "bool", "uint8", ..., "bfloat16", "float8_e4m3fn", "float8_e5m2".
std::string_view DTypeName(DType dtype);
// safetensors name: "BOOL", "U8", "I8", "I16", "I32", "I64", "F16", "BF16", "F32", "F64",
// "F8_E4M3", "F8_E5M2".
std::string_view DTypeSafetensorsName(DType dtype);
// numpy type string (little-endian): "|b1", "|u1", "|i1", "<i2", "<i4", "<i8", "<f2",
// "<f4", "<f8". bfloat16 and float8 have no numpy type; they return "<u2" and "|u1"
// (the bit patterns), which is how numpy-based tools carry them.
std::string_view DTypeNumpyName(DType dtype);

// Parses any of the spellings above, plus torch aliases ("float", "half", "double",
// "long", "int") and "torch."-prefixed names. Errors: kInvalidArgument naming `name`.
Result<DType> ParseDType(std::string_view name);
// Parses a safetensors dtype string only. Errors: kUnimplemented for known-but-unsupported
// strings (U16, C64, F8_E8M0, ...), kInvalidArgument otherwise.
Result<DType> ParseSafetensorsDType(std::string_view name);

}  // namespace fc

#endif  // FC_CORE_DTYPE_H_
