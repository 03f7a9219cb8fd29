// Flattened ranges: ZeRO / sharding optimizer state stores `[inclusive_min, exclusive_max)`
// of the row-major flattening of a box. This header converts such a range into the exact,
// minimal list of boxes that hold the same elements (at most 2*rank-1 of them), and back.
//
// Thread-safety: values and pure functions.
#ifndef FC_CORE_FLAT_RANGE_H_
#define FC_CORE_FLAT_RANGE_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "fc/core/box.h"

namespace fc {

struct FlatRange {
  int64_t inclusive_min = 0;
  int64_t exclusive_max = 0;

  bool SatisfiesInvariants() const { return inclusive_min >= 0 && exclusive_max >= inclusive_min; }
  int64_t size() const { return exclusive_max - inclusive_min; }
  friend bool operator==(const FlatRange&, const FlatRange&) = default;
  std::string ToString() const;  // "[a, b)"
  friend std::ostream& operator<<(std::ostream& os, const FlatRange& r) { return os << r.ToString(); }
};

// Decomposes `range` of the row-major flattening of a block of `shape` into boxes, in flat
// order, whose concatenation (each box row-major) is exactly the range. Box offsets are
// relative to the block origin. The list is minimal: at most 2*rank-1 boxes (prefix partial
// rows, a middle full block, suffix partial rows, recursively); an empty range gives an
// empty list; a rank-0 shape with range [0, 1) gives one rank-0 box.
// Precondition: range within [0, numel(shape)].
std::vector<Box> DecomposeFlatRange(std::span<const int64_t> shape, FlatRange range);

// The flat range covered by `box` (relative to the block origin) when the box is contiguous
// in the row-major flattening of `shape`; nullopt otherwise (also when the box does not fit
// in `shape`). An empty box gives the empty range [0, 0).
// The boxes, in global coordinates and stored order, whose elements a chunk of `box` stores:
// the box itself, or its flat range decomposed (DecomposeFlatRange shifted by the box's offset).
std::vector<Box> StoredBoxes(const Box& box, const std::optional<FlatRange>& range);

std::optional<FlatRange> FlatRangeOfBox(std::span<const int64_t> shape, const Box& box);

// The smallest box containing every element of `range` (Paddle's minimal_nd_slice, with the
// per-axis bug of semantics.md 2.4 fixed). Precondition: range non-empty and in bounds.
Box MinimalBoxOfFlatRange(std::span<const int64_t> shape, FlatRange range);

// Row-major linear index of `index` in `shape`, and back.
int64_t Ravel(std::span<const int64_t> index, std::span<const int64_t> shape);
Shape Unravel(int64_t linear, std::span<const int64_t> shape);

}  // namespace fc

#endif  // FC_CORE_FLAT_RANGE_H_
