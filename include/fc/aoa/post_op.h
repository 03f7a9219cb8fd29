// Postprocess ops: what the data path does to a source block, in order, before it lands in
// its target box. Transposes, casts and reshapes are never applied to whole tensors during
// planning; the plan carries source-coordinate blocks plus this recipe.
//
//   Permute{perm}   numpy transpose: out.shape[i] = in.shape[perm[i]], and
//                   out[i_0, ..., i_k] = in[j] with j[perm[a]] = i_a.
//   Cast{dtype}     convert every element to `dtype` (fc/core/dtype_convert.h).
//   Reshape{shape}  reinterpret the row-major block as `shape` (same element count, same
//                   element order). The engine only emits it where that is exact.
//
// Applying the ops of a ShardMapping to a block of shape source_box.local_shape yields a
// block of shape target_box.local_shape whose element type is ShardMapping::result_dtype.
//
// Thread-safety: values and pure functions.
#ifndef FC_AOA_POST_OP_H_
#define FC_AOA_POST_OP_H_

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"

namespace fc::aoa {

struct Permute {
  std::vector<int64_t> perm;
  friend bool operator==(const Permute&, const Permute&) = default;
};
struct Cast {
  DType dtype = DType::kFloat32;
  friend bool operator==(const Cast&, const Cast&) = default;
};
struct Reshape {
  Shape shape;
  friend bool operator==(const Reshape&, const Reshape&) = default;
};

using PostOp = std::variant<Permute, Cast, Reshape>;

// The reference's spelling of one op: "[1, 0]", "float16", "reshape:[1, 3, 2, 2]".
std::string PostOpToString(const PostOp& op);
// The list as the reference prints it: "['float16', '[1, 0]']"; "None" for an empty list.
std::string PostOpsToString(std::span<const PostOp> ops);

// The shape of a block of `shape` after `ops` (Permute and Reshape change it).
Shape ShapeAfter(std::span<const PostOp> ops, Shape shape);
// The element type after `ops`: the last Cast, else `dtype`.
DType DTypeAfter(std::span<const PostOp> ops, DType dtype);

}  // namespace fc::aoa

#endif  // FC_AOA_POST_OP_H_
