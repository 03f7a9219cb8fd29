// Element-wise conversion between any two DTypes.
//
// Float to float: exact where representable, otherwise round-to-nearest-even; NaN stays NaN
// (sign and, where the target can hold it, payload top bits kept), +-Inf stays +-Inf where the
// target has Inf. float8_e4m3fn has no Inf: Inf and values beyond its range become NaN
// (the torch "fn" saturation-free convention); float8_e5m2 overflows to Inf.
// Float to integer: truncation toward zero (torch semantics); NaN and out-of-range values are
// reported as an error rather than written as garbage. Integer to float: round-to-nearest-even.
// bool: nonzero -> 1. Integer to narrower integer: modulo 2^bits (torch semantics).
// float8 FNUZ (e4m3fnuz, e5m2fnuz): no Inf and no -0; NaN, +-Inf and values that round past
// the largest finite (240, 57344) become the NaN pattern 0x80; values that round to zero
// become +0 whatever their sign.
// float8_e8m0fnu (2^(b-127), b in [0, 254], 0xFF NaN): rounds to nearest between powers of
// two (midpoint 1.5 * 2^e, ties to the even pattern); zero and values below 2^-127 give 0x00
// (2^-127, the nearest representable value); negative values (no sign bit), NaN, Inf and
// values that round past 2^127 give NaN 0xFF. (torch ignores the sign instead.)
// complex64 and the packed sub-byte types: copied only (same dtype); a conversion to or from
// them is kUnimplemented.
//
// Thread-safety: pure functions.
#ifndef FC_CORE_DTYPE_CONVERT_H_
#define FC_CORE_DTYPE_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "fc/core/dtype.h"
#include "fc/core/status.h"

namespace fc {

// Scalar helpers (bit patterns in, bit patterns out).
float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);   // round-to-nearest-even
float Float16ToFloat(uint16_t bits);
uint16_t FloatToFloat16(float value);    // round-to-nearest-even
uint16_t DoubleToFloat16(double value);  // rounds once, directly from double
uint16_t DoubleToBFloat16(double value); // rounds once, directly from double
float Float8E4M3FNToFloat(uint8_t bits);
uint8_t FloatToFloat8E4M3FN(float value);
float Float8E5M2ToFloat(uint8_t bits);
uint8_t FloatToFloat8E5M2(float value);
float Float8E4M3FNUZToFloat(uint8_t bits);
uint8_t FloatToFloat8E4M3FNUZ(float value);
float Float8E5M2FNUZToFloat(uint8_t bits);
uint8_t FloatToFloat8E5M2FNUZ(float value);
float Float8E8M0FNUToFloat(uint8_t bits);
uint8_t FloatToFloat8E8M0FNU(float value);

// Converts `count` elements from `src` (type `src_dtype`) to `dst` (type `dst_dtype`).
// Buffers are little-endian, packed, and must not overlap unless identical and the sizes
// are equal. Errors: kInvalidArgument when a float->int conversion meets NaN or a value out
// of the integer range (the message names the element index and value); kUnimplemented for
// a conversion between complex64 and another dtype.
Status ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                       size_t count);

}  // namespace fc

#endif  // FC_CORE_DTYPE_CONVERT_H_
