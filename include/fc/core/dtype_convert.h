// Element-wise conversion between any two DTypes.
//
// Float to float: exact where representable, otherwise round-to-nearest-even; NaN stays NaN
// (sign and, where the target can hold it, payload top bits kept), +-Inf stays +-Inf where the
// target has Inf. float8_e4m3fn has no Inf: Inf and values beyond its range become NaN
// (the torch "fn" saturation-free convention); float8_e5m2 overflows to Inf.
// Float to integer: truncation toward zero (torch semantics); NaN and out-of-range values are
// reported as an error rather than written as garbage. Integer to float: round-to-nearest-even.
// bool: nonzero -> 1.
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

// Converts `count` elements from `src` (type `src_dtype`) to `dst` (type `dst_dtype`).
// Buffers are little-endian, packed, and must not overlap unless identical and the sizes
// are equal. Errors: kInvalidArgument when a float->int conversion meets NaN or a value out
// of the integer range (the message names the element index and value).
Status ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                       size_t count);

}  // namespace fc

#endif  // FC_CORE_DTYPE_CONVERT_H_
