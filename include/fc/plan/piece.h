// How a target tensor is filled: SourcePieces, "block `src_box` of source tensor `source`,
// after `ops` (in order), lands at `dst_box` of the target". Pieces come from the AOA engine
// (or are identities when there is no program). Plain data; the data path is
// fc/exec/assemble.h.
#ifndef FC_PLAN_PIECE_H_
#define FC_PLAN_PIECE_H_

#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

struct PieceOp {
  enum class Kind { kPermute, kCast, kReshape };
  Kind kind = Kind::kPermute;
  // kPermute: output axis i is input axis permutation[i]; empty reverses all axes.
  std::vector<int> permutation;
  DType dtype = DType::kFloat32;  // kCast: the element type after the cast
  Shape shape;                    // kReshape: the block's shape after (row-major order kept)

  friend bool operator==(const PieceOp&, const PieceOp&) = default;
};

struct SourcePiece {
  const TensorEntry* source = nullptr;  // nullptr: no source, dst_box is filled with fill_value
  Box src_box;                          // in the source tensor's coordinates
  Box dst_box;                          // in the target tensor's coordinates
  std::vector<PieceOp> ops;             // applied to the source block, in order
  double fill_value = 0.0;              // no source: the value, converted to the target dtype
};

// The dtype a piece's data has after its ops (the source dtype, or that of the last cast).
DType PieceDType(const SourcePiece& piece);

// Whether any op of the piece is a reshape (a reshape does not map sub-boxes to sub-boxes,
// so such a piece's source block is read whole).
bool PieceReshapes(const SourcePiece& piece);

// Whether the piece's permutes, taken together, move any axis.
bool PieceTransposes(const SourcePiece& piece);

// The block of the piece's source that lands on `dst_sub` (a box inside the piece's
// dst_box): all of src_box when the piece reshapes.
Box SourceSubBox(const SourcePiece& piece, const Box& dst_sub);

// The permutation a kPermute op applies to a block of `rank` axes (its own, or the reversal
// when empty).
std::vector<int> ResolvePermutation(const PieceOp& op, size_t rank);

}  // namespace fc

#endif  // FC_PLAN_PIECE_H_
