// ShardMapping: one piece of the answer to "where does this target box come from?"
// (AoaEngine::FindShardSources).
//
// A query box is answered by a list of mappings whose target boxes are disjoint and lie in
// the query box. Their union is the part of the query that has data: the whole query,
// except for targets declared with `_ -> name` and no shape (nothing to load).
//
//   kCopy  read `source_box` of source tensor `source_key` (a box in that tensor's own axis
//          order and global coordinates; local_shape may differ from the target's when
//          there are Permute/Reshape ops), apply `ops` in order, write the result to
//          `target_box` of the target.
//   kFill  write `fill_value` (converted to result_dtype) to every element of `target_box`.
//          Comes from `_ -> name, shape=..., dtype=..., fill=...`.
//
// Thread-safety: values.
#ifndef FC_AOA_SHARD_MAPPING_H_
#define FC_AOA_SHARD_MAPPING_H_

#include <string>
#include <vector>

#include "fc/aoa/post_op.h"
#include "fc/core/box.h"
#include "fc/core/dtype.h"

namespace fc::aoa {

enum class MappingKind { kCopy, kFill };

struct ShardMapping {
  MappingKind kind = MappingKind::kCopy;
  Box target_box;                // target global coordinates, inside the query box
  DType result_dtype = DType::kFloat32;  // element type written to the target

  // kCopy only.
  std::string source_key;        // including the optimizer suffix for state queries
  Box source_box;                // source global coordinates, source axis order
  Shape source_shape;            // the source tensor's global shape
  DType source_dtype = DType::kFloat32;
  std::vector<PostOp> ops;

  // kFill only.
  double fill_value = 0.0;

  friend bool operator==(const ShardMapping&, const ShardMapping&) = default;
  // "[0, 1) x [0, 2) <- s0 [1, 2) x [0, 2) ['[1, 0]']" or "[0, 24) x [0, 8) <- fill 0".
  std::string ToString() const;
};

}  // namespace fc::aoa

#endif  // FC_AOA_SHARD_MAPPING_H_
