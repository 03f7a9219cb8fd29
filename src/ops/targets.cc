#include "fc/ops/targets.h"

namespace fc {

std::vector<OutputTensor> IdentityOutputs(const CheckpointIndex& index) {
  std::vector<OutputTensor> out;
  out.reserve(index.tensors.size());
  for (const TensorEntry& t : index.tensors) {
    SourcePiece piece;
    piece.source = &t;
    piece.src_box = Box::Whole(t.global_shape);
    piece.dst_box = piece.src_box;
    out.push_back({t.key, t.dtype, t.global_shape, {std::move(piece)}});
  }
  return out;
}

}  // namespace fc
