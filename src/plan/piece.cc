#include "fc/plan/piece.h"

#include <algorithm>
#include <numeric>

namespace fc {
namespace {

// view[i] = the source axis that ends up at target axis i after every permute of `ops`.
std::vector<int> ViewAxes(const std::vector<PieceOp>& ops, size_t rank) {
  std::vector<int> view(rank);
  std::iota(view.begin(), view.end(), 0);
  for (const PieceOp& op : ops) {
    if (op.kind != PieceOp::Kind::kPermute) continue;  // reshapes: see AssembleRegion
    std::vector<int> p = ResolvePermutation(op, rank);
    std::vector<int> next(rank);
    for (size_t i = 0; i < rank; ++i) next[i] = view[static_cast<size_t>(p[i])];
    view = std::move(next);
  }
  return view;
}

}  // namespace

std::vector<int> ResolvePermutation(const PieceOp& op, size_t rank) {
  if (!op.permutation.empty()) return op.permutation;
  std::vector<int> reversed(rank);
  for (size_t i = 0; i < rank; ++i) reversed[i] = static_cast<int>(rank - 1 - i);
  return reversed;
}

Box SourceSubBox(const SourcePiece& piece, const Box& dst_sub) {
  Box src_sub = piece.src_box;
  if (PieceReshapes(piece)) return src_sub;
  const std::vector<int> view = ViewAxes(piece.ops, piece.src_box.rank());
  for (size_t i = 0; i < dst_sub.rank(); ++i) {
    const size_t s = static_cast<size_t>(view[i]);
    src_sub.global_offset[s] =
        piece.src_box.global_offset[s] + (dst_sub.global_offset[i] - piece.dst_box.global_offset[i]);
    src_sub.local_shape[s] = dst_sub.local_shape[i];
  }
  return src_sub;
}

bool PieceTransposes(const SourcePiece& piece) {
  const std::vector<int> view = ViewAxes(piece.ops, piece.src_box.rank());
  for (size_t i = 0; i < view.size(); ++i) {
    if (view[i] != static_cast<int>(i)) return true;
  }
  return false;
}

DType PieceDType(const SourcePiece& piece) {
  DType dtype = piece.source ? piece.source->dtype : DType::kFloat32;
  for (const PieceOp& op : piece.ops) {
    if (op.kind == PieceOp::Kind::kCast) dtype = op.dtype;
  }
  return dtype;
}

bool PieceReshapes(const SourcePiece& piece) {
  return std::any_of(piece.ops.begin(), piece.ops.end(),
                     [](const PieceOp& op) { return op.kind == PieceOp::Kind::kReshape; });
}

}  // namespace fc
