#include "fc/core/checked_math.h"

#include <string>

namespace fc {

Result<int64_t> CheckedNumElements(std::span<const int64_t> dims) {
  bool has_zero = false;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return InvalidArgumentError("negative extent " + std::to_string(dims[i]) + " on axis " +
                                  std::to_string(i));
    }
    if (dims[i] == 0) has_zero = true;
  }
  if (has_zero) return int64_t{0};
  int64_t n = 1;
  for (int64_t d : dims) {
    std::optional<int64_t> m = CheckedMul(n, d);
    if (!m) return OutOfRangeError("element count overflows int64");
    n = *m;
  }
  return n;
}

Result<uint64_t> CheckedByteSize(std::span<const int64_t> dims, uint64_t element_size) {
  Result<int64_t> n = CheckedNumElements(dims);
  if (!n.ok()) return n.status();
  std::optional<uint64_t> bytes = CheckedMulU(static_cast<uint64_t>(*n), element_size);
  if (!bytes) return OutOfRangeError("byte size overflows uint64");
  return *bytes;
}

}  // namespace fc
