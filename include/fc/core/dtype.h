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
  kUInt16,
  kUInt32,
  kUInt64,
  kComplex64,        // two float32 (real, imaginary)
  kFloat8E4M3FNUZ,   // bias 8, no Inf, no -0: 0x80 is the only NaN
  kFloat8E5M2FNUZ,   // bias 16, no Inf, no -0: 0x80 is the only NaN
  kFloat8E8M0FNU,    // exponent only: 2^(bits - 127), no sign, no zero; 0xFF is NaN
  // Packed sub-byte floats (safetensors F4, F6_E2M3, F6_E3M2). One element is the smallest
  // run of values that fills whole bytes, as torch's float4_e2m1fn_x2 is: shapes count
  // these elements, so the last dimension is the values' last dimension / 2 (F4) or / 4
  // (F6). fc moves their bytes and never converts them (see DTypeValuesPerElement).
  kFloat4E2M1FNx2,   // 2 F4 (E2M1) values in 1 byte
  kFloat6E2M3FNx4,   // 4 F6 (E2M3) values in 3 bytes
  kFloat6E3M2FNx4,   // 4 F6 (E3M2) values in 3 bytes
};

inline constexpr DType kAllDTypes[] = {
    DType::kBool,    DType::kUInt8,    DType::kInt8,    DType::kInt16,
    DType::kInt32,   DType::kInt64,    DType::kFloat16, DType::kBFloat16,
    DType::kFloat32, DType::kFloat64,  DType::kFloat8E4M3FN, DType::kFloat8E5M2,
    DType::kUInt16,  DType::kUInt32,   DType::kUInt64,  DType::kComplex64,
    DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2FNUZ, DType::kFloat8E8M0FNU,
};
// The packed sub-byte types (not in kAllDTypes: they have no values to convert).
inline constexpr DType kPackedDTypes[] = {DType::kFloat4E2M1FNx2, DType::kFloat6E2M3FNx4,
                                          DType::kFloat6E3M2FNx4};

// Bytes per element: 1, 2, 4 or 8 (complex64: 8); the packed types: 1 (F4 x2) and 3
// (F6 x4). Every element is a whole number of bytes.
size_t DTypeSize(DType dtype);
// Values per element: 2 for kFloat4E2M1FNx2, 4 for the F6 x4 types, 1 otherwise. The
// safetensors shape of a packed tensor is its fc shape with the last dimension times this.
int DTypeValuesPerElement(DType dtype);
// Bits per value: 4 (F4), 6 (F6), else 8 * DTypeSize.
int DTypeValueBits(DType dtype);
bool IsPacked(DType dtype);  // DTypeValuesPerElement(dtype) > 1

// True for float16, bfloat16, float32, float64 and the float8 types (FNUZ and E8M0
// included). False for complex64 (as torch.is_floating_point), integers, bool and the
// packed types (their bytes are moved, never cast: --dtype leaves them alone).
bool IsFloating(DType dtype);

// Canonical (torch) name: "bool", "uint8", ..., "bfloat16", "float8_e4m3fn", "float8_e5m2",
// "uint16", "uint32", "uint64", "complex64", "float8_e4m3fnuz", "float8_e5m2fnuz",
// "float8_e8m0fnu", "float4_e2m1fn_x2" (torch's name), "float6_e2m3fn_x4", "float6_e3m2fn_x4"
// (fc's names; torch has no F6 type).
std::string_view DTypeName(DType dtype);
// safetensors name: "BOOL", "U8", "I8", "I16", "I32", "I64", "F16", "BF16", "F32", "F64",
// "F8_E4M3", "F8_E5M2", "U16", "U32", "U64", "C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0",
// "F4", "F6_E2M3", "F6_E3M2".
std::string_view DTypeSafetensorsName(DType dtype);
// numpy type string (little-endian): "|b1", "|u1", "|i1", "<i2", "<i4", "<i8", "<f2",
// "<f4", "<f8", "<u2", "<u4", "<u8", "<c8". bfloat16 and the float8 types have no numpy
// type; they return "<u2" and "|u1" (the bit patterns), which is how numpy-based tools carry
// them (so "<u2" parses back as uint16, not bfloat16). F4 x2: "|u1"; F6 x4: "|V3".
std::string_view DTypeNumpyName(DType dtype);

// Parses any of the spellings above, plus torch aliases ("float", "half", "double",
// "long", "int") and "torch."-prefixed names. Errors: kInvalidArgument naming `name`.
Result<DType> ParseDType(std::string_view name);
// Parses a safetensors dtype string only (F4, F6_E2M3, F6_E3M2 give the packed types).
// Errors: kUnimplemented for C128 (no DType holds it), kInvalidArgument otherwise.
Result<DType> ParseSafetensorsDType(std::string_view name);

}  // namespace fc

#endif  // FC_CORE_DTYPE_H_
