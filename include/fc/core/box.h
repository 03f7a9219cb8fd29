// Box: an n-dimensional rectangle of a global tensor, `global_offset` + `local_shape`,
// half-open on each axis: axis i covers [global_offset[i], global_offset[i] + local_shape[i]).
// A rank-0 box (both vectors empty) is the single element of a 0-d tensor.
//
// Also the hot data kernel: copying a sub-box between two row-major (or strided) buffers,
// where runs that are contiguous in both become single memcpy calls.
//
// Thread-safety: values and pure functions.
#ifndef FC_CORE_BOX_H_
#define FC_CORE_BOX_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "fc/core/status.h"

namespace fc {

using Shape = std::vector<int64_t>;

struct Box {
  Shape global_offset;
  Shape local_shape;

  // The whole of a tensor of `shape` (offset 0).
  static Box Whole(const Shape& shape);

  size_t rank() const { return local_shape.size(); }
  // Product of local_shape (1 for rank 0). Precondition: SatisfiesInvariants() and no
  // overflow (boxes built from files go through ValidateBox first).
  int64_t num_elements() const;
  bool empty() const { return num_elements() == 0; }
  int64_t inclusive_min(size_t axis) const { return global_offset[axis]; }
  int64_t exclusive_max(size_t axis) const { return global_offset[axis] + local_shape[axis]; }

  // Equal ranks, non-negative offsets and extents.
  bool SatisfiesInvariants() const;

  friend bool operator==(const Box&, const Box&) = default;
  // "[0, 4) x [2, 6)"; rank 0 prints "[]".
  std::string ToString() const;
  friend std::ostream& operator<<(std::ostream& os, const Box& b) { return os << b.ToString(); }
};

// Checks a box read from a file against its tensor's global shape: equal ranks,
// non-negative values, offset + extent <= global extent without overflow, element count
// representable. Errors: kDataLoss with the box and shape in the message.
Status ValidateBox(const Box& box, std::span<const int64_t> global_shape);

// The intersection of two boxes of equal rank, or nullopt when it is empty on any axis
// (touching edges do not intersect). Rank 0 boxes always intersect.
std::optional<Box> Intersect(const Box& a, const Box& b);

// True when every element of `inner` is in `outer`.
bool Contains(const Box& outer, const Box& inner);

// Row-major strides (in elements) of a buffer of `shape`.
Shape RowMajorStrides(std::span<const int64_t> shape);

// Copies the elements of `region` from `src` to `dst`.
//   src holds `src_box` in row-major order, or with `src_strides` (in elements, may be
//     any non-negative strides, e.g. a transposed torch tensor) when not empty;
//   dst holds `dst_box` in row-major order.
// Preconditions: Contains(src_box, region) && Contains(dst_box, region); equal ranks.
// The innermost run that is contiguous in both buffers is copied with one memcpy.
void CopyRegion(const void* src, const Box& src_box, std::span<const int64_t> src_strides,
                void* dst, const Box& dst_box, const Box& region, size_t element_size);

}  // namespace fc

#endif  // FC_CORE_BOX_H_
