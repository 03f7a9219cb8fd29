// Overflow-checked integer arithmetic for every size computed from file contents or flags.
//
// Thread-safety: pure functions.
#ifndef FC_CORE_CHECKED_MATH_H_
#define FC_CORE_CHECKED_MATH_H_

#include <cstdint>
#include <optional>
#include <span>

#include "fc/core/status.h"

namespace fc {

// nullopt on overflow.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> CheckedAddU(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> CheckedMulU(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Product of `dims` (1 for an empty list). Errors: kOutOfRange on overflow,
// kInvalidArgument on a negative extent.
Result<int64_t> CheckedNumElements(std::span<const int64_t> dims);

// CheckedNumElements(dims) * element_size. Errors as above.
Result<uint64_t> CheckedByteSize(std::span<const int64_t> dims, uint64_t element_size);

}  // namespace fc

#endif  // FC_CORE_CHECKED_MATH_H_
