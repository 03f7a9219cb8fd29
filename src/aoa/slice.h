// Internal slice algebra of the AOA engine (not installed API).
//
// A variable is a list of Slices. A Slice says: block `src` of source `source` (in the
// source's own axis order), transformed by `ops` in order, is block `dst` of the variable.
// Every op maps a block onto a block of the same elements:
//   kPermute  axes reordered: after.shape[i] = before.shape[perm[i]];
//   kCast     element type only;
//   kReshape  the block's row-major order reinterpreted from `before` to `after`, per group
//             of consecutive axes (groups[g] = {#axes before, #axes after}).
// Reshape blocks are local: a sub-block is mappable only when, in each group, its extent
// is a contiguous run on one side and a rectangle on the other; otherwise it is cut.
#ifndef FC_SRC_AOA_SLICE_H_
#define FC_SRC_AOA_SLICE_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "fc/aoa/post_op.h"
#include "fc/core/box.h"
#include "fc/core/dtype.h"

namespace fc::aoa::internal {

struct ViewOp {
  enum class Kind { kPermute, kCast, kReshape };
  Kind kind = Kind::kCast;
  std::vector<int64_t> perm;                // kPermute
  DType dtype = DType::kFloat32;            // kCast
  Shape before, after;                      // kReshape: local block shapes
  std::vector<std::pair<int, int>> groups;  // kReshape
};

struct Slice {
  int32_t source = -1;  // index into the engine's source table
  Box src;
  Box dst;
  std::vector<ViewOp> ops;
};

// out.offset[i] = in.offset[perm[i]] (same for extents).
Box PermuteBox(const Box& box, const std::vector<int64_t>& perm);
// The inverse: out.offset[perm[i]] = in.offset[i].
Box InversePermuteBox(const Box& box, const std::vector<int64_t>& perm);

// The finest grouping of consecutive axes of `a` and `b` with equal products.
// Precondition: equal, non-zero element counts.
std::vector<std::pair<int, int>> ReshapeGroups(const Shape& a, const Shape& b);

// Maps `box` of a tensor of shape `from` through a reshape to shape `to` with `groups`
// (first = #axes of `from` when !swap, of `to` when swap). nullopt when the image is not
// a box.
std::optional<Box> MapThroughReshape(const Box& box, const Shape& from, const Shape& to,
                                     const std::vector<std::pair<int, int>>& groups, bool swap);

// The slice restricted to `rel` (a box relative to s.dst's origin, inside it); nullopt when
// a reshape makes that part non-rectangular at the source.
std::optional<Slice> Restrict(const Slice& s, const Box& rel);

// Like Restrict, but cuts `rel` into pieces (halving along the leading axis that has more
// than one element) until every piece maps, appending them to `out`.
void RestrictAll(const Slice& s, const Box& rel, std::vector<Slice>* out);

// The typed ops of `s` for the data path.
std::vector<PostOp> ToPostOps(const std::vector<ViewOp>& ops);

}  // namespace fc::aoa::internal

#endif  // FC_SRC_AOA_SLICE_H_
