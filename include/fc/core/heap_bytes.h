// What a value holds on the heap, counted the way glibc's malloc hands memory out: each
// allocation of n bytes takes max(32, n + 8 rounded up to 16) bytes. Used to charge the
// jobs' own bookkeeping (the checkpoint index, the plan) to --memory-budget
// (fc/plan/plan.h, PlanRequest::held_bytes); an estimate of the allocator's real use
// within a few percent for the many small allocations these structures make.
//
// Thread-safety: pure functions.
#ifndef FC_CORE_HEAP_BYTES_H_
#define FC_CORE_HEAP_BYTES_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fc/core/box.h"

namespace fc {

// One allocation of `n` bytes (0: none).
inline uint64_t HeapBytes(uint64_t n) {
  return n == 0 ? 0 : std::max<uint64_t>(32, (n + 8 + 15) & ~uint64_t{15});
}

// A vector's buffer (its capacity), not what its elements hold.
template <typename T>
uint64_t HeapBytes(const std::vector<T>& v) {
  return HeapBytes(static_cast<uint64_t>(v.capacity()) * sizeof(T));
}

// A string's buffer beyond the small-string storage inside the object.
inline uint64_t HeapBytes(const std::string& s) {
  return s.capacity() > 15 ? HeapBytes(s.capacity() + 1) : 0;
}

inline uint64_t HeapBytes(const Box& b) {
  return HeapBytes(b.global_offset) + HeapBytes(b.local_shape);
}

}  // namespace fc

#endif  // FC_CORE_HEAP_BYTES_H_
