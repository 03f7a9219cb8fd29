// Exact-cover checks: do a set of boxes store every element of a region exactly once?
// Used by --verify (chunks of a stored tensor), export and convert (pieces of a target).
//
// Thread-safety: pure functions.
#ifndef FC_CORE_BOX_COVER_H_
#define FC_CORE_BOX_COVER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "fc/core/box.h"

namespace fc {

struct CoverReport {
  int64_t covered_elements = 0;  // sum of the pieces' volumes inside `whole`
  int64_t whole_elements = 0;
  uint64_t overlap_count = 0;  // pairs of pieces that intersect (counting stops at 2^20)
  std::vector<std::pair<Box, Box>> overlaps;      // the first few such pairs
  std::vector<Box> missing;                       // the first few uncovered boxes
  bool exact() const { return overlap_count == 0 && covered_elements == whole_elements; }
};

// Checks `pieces` (same rank as `whole`; parts outside `whole` are ignored) against `whole`.
// Overlaps are found with a sweep along the axis with the most distinct piece starts:
// O(n log n) for pieces cut along any one axis, O(n * min(g0, g1)) for a g0 x g1 grid. When
// there is no overlap and elements are missing, up to `max_listed` uncovered boxes are
// listed, found on the grid of all piece boundaries (skipped, with only the count left,
// above about a million grid cells or 2^26 cell-piece tests).
// Precondition: every box satisfies its invariants and volumes fit in int64.
CoverReport CheckCover(const Box& whole, std::vector<Box> pieces, size_t max_listed = 4);

}  // namespace fc

#endif  // FC_CORE_BOX_COVER_H_
