#include "fc/exec/assemble.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "fc/core/box_cover.h"
#include "fc/core/dtype_convert.h"
#include "fc/core/flat_range.h"

namespace fc {
namespace {

std::vector<int> ResolvePermutation(const PieceOp& op, size_t rank) {
  if (!op.permutation.empty()) return op.permutation;
  std::vector<int> reversed(rank);
  for (size_t i = 0; i < rank; ++i) reversed[i] = static_cast<int>(rank - 1 - i);
  return reversed;
}

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

bool PieceReshapes(const SourcePiece& piece) {
  return std::any_of(piece.ops.begin(), piece.ops.end(),
                     [](const PieceOp& op) { return op.kind == PieceOp::Kind::kReshape; });
}

// The block of the piece's source that lands on `dst_sub` (inside the piece's dst_box): all
// of src_box when the piece reshapes, since a reshape does not map sub-boxes to sub-boxes.
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

Box ZeroOrigin(const Shape& shape) { return Box{Shape(shape.size(), 0), shape}; }

// Reads `src_sub` of `tensor` (row-major, source dtype) into `out`.
Status ReadSourceBlock(ChunkReader& reader, const TensorEntry& tensor, const Box& src_sub,
                       void* out, const Box& out_box) {
  for (const Chunk& chunk : tensor.chunks) {
    if (chunk.replica_id != 0) continue;
    FC_RETURN_IF_ERROR(reader.CopyChunkRegion(tensor, chunk, src_sub, out, out_box));
  }
  return Status::Ok();
}

}  // namespace

DType PieceDType(const SourcePiece& piece) {
  DType dtype = piece.source ? piece.source->dtype : DType::kFloat32;
  for (const PieceOp& op : piece.ops) {
    if (op.kind == PieceOp::Kind::kCast) dtype = op.dtype;
  }
  return dtype;
}

Status AssembleRegion(ChunkReader& reader, const std::string& target_key,
                      const std::vector<SourcePiece>& pieces, const Box& region,
                      DType dst_dtype, void* dst) {
  const size_t dst_esize = DTypeSize(dst_dtype);
  for (const SourcePiece& piece : pieces) {
    std::optional<Box> dst_sub = Intersect(piece.dst_box, region);
    if (!dst_sub || dst_sub->empty()) continue;
    if (piece.source == nullptr) {
      // One element of the value in the target type, repeated over the box.
      std::vector<std::byte> fill(static_cast<size_t>(dst_sub->num_elements()) * dst_esize);
      if (!fill.empty()) {
        FC_RETURN_IF_ERROR_WITH(
            ConvertElements(&piece.fill_value, DType::kFloat64, fill.data(), dst_dtype, 1),
            "target '" + target_key + "': fill value");
        for (size_t at = dst_esize; at < fill.size(); at += dst_esize) {
          std::memcpy(fill.data() + at, fill.data(), dst_esize);
        }
      }
      CopyRegion(fill.data(), *dst_sub, {}, dst, region, *dst_sub, dst_esize);
      continue;
    }
    const TensorEntry& source = *piece.source;
    const size_t rank = dst_sub->rank();
    const bool reshapes = PieceReshapes(piece);
    const Box src_sub = SourceSubBox(piece, *dst_sub);
    auto context = [&] {
      return "target '" + target_key + "' " + dst_sub->ToString() + " from '" + source.key +
             "' " + src_sub.ToString();
    };
    if (piece.ops.empty() && source.dtype == dst_dtype) {
      // Fast path: chunk bytes go straight into the destination. The destination buffer,
      // seen in source coordinates, is `region` shifted by the piece's offset.
      Box shifted = region;
      for (size_t i = 0; i < rank; ++i) {
        shifted.global_offset[i] += piece.src_box.global_offset[i] - piece.dst_box.global_offset[i];
      }
      FC_RETURN_IF_ERROR_WITH(ReadSourceBlock(reader, source, src_sub, dst, shifted), context());
      continue;
    }
    std::vector<std::byte> block(static_cast<size_t>(src_sub.num_elements()) *
                                 DTypeSize(source.dtype));
    FC_RETURN_IF_ERROR_WITH(ReadSourceBlock(reader, source, src_sub, block.data(), src_sub),
                            context());
    Shape shape = src_sub.local_shape;
    DType dtype = source.dtype;
    std::vector<std::byte> scratch;
    for (const PieceOp& op : piece.ops) {
      if (op.kind == PieceOp::Kind::kPermute) {
        const std::vector<int> p = ResolvePermutation(op, shape.size());
        const Shape strides = RowMajorStrides(shape);
        Shape next_shape(shape.size()), view_strides(shape.size());
        for (size_t i = 0; i < shape.size(); ++i) {
          next_shape[i] = shape[static_cast<size_t>(p[i])];
          view_strides[i] = strides[static_cast<size_t>(p[i])];
        }
        scratch.resize(block.size());
        const Box whole = ZeroOrigin(next_shape);
        CopyRegion(block.data(), whole, view_strides, scratch.data(), whole, whole,
                   DTypeSize(dtype));
        block.swap(scratch);
        shape = std::move(next_shape);
      } else if (op.kind == PieceOp::Kind::kReshape) {
        shape = op.shape;
      } else if (op.dtype != dtype) {
        scratch.resize(block.size() / DTypeSize(dtype) * DTypeSize(op.dtype));
        FC_RETURN_IF_ERROR_WITH(
            ConvertElements(block.data(), dtype, scratch.data(), op.dtype,
                            block.size() / DTypeSize(dtype)),
            context());
        block.swap(scratch);
        dtype = op.dtype;
      }
    }
    if (dtype != dst_dtype) {
      scratch.resize(block.size() / DTypeSize(dtype) * dst_esize);
      FC_RETURN_IF_ERROR_WITH(ConvertElements(block.data(), dtype, scratch.data(), dst_dtype,
                                              block.size() / DTypeSize(dtype)),
                              context());
      block.swap(scratch);
    }
    // The block now holds the target box it came for: dst_sub, or the whole dst_box when
    // the piece reshapes.
    CopyRegion(block.data(), reshapes ? piece.dst_box : *dst_sub, {}, dst, region, *dst_sub,
               dst_esize);
  }
  return Status::Ok();
}

void AccumulateRegionReads(const std::vector<SourcePiece>& pieces, const Box& region,
                           std::map<uint32_t, uint64_t>& bytes_per_file) {
  for (const SourcePiece& piece : pieces) {
    std::optional<Box> dst_sub = Intersect(piece.dst_box, region);
    if (!dst_sub || dst_sub->empty() || piece.source == nullptr) continue;
    const Box src_sub = SourceSubBox(piece, *dst_sub);
    const uint64_t esize = DTypeSize(piece.source->dtype);
    for (const Chunk& chunk : piece.source->chunks) {
      if (chunk.replica_id != 0) continue;
      std::vector<Box> stored = {chunk.box};
      if (chunk.flat_range) {
        stored = DecomposeFlatRange(chunk.box.local_shape, *chunk.flat_range);
        for (Box& b : stored) {
          for (size_t i = 0; i < b.rank(); ++i) b.global_offset[i] += chunk.box.global_offset[i];
        }
      }
      for (const Box& b : stored) {
        if (auto o = Intersect(b, src_sub); o && !o->empty()) {
          bytes_per_file[chunk.file] += static_cast<uint64_t>(o->num_elements()) * esize;
        }
      }
    }
  }
}

Status PiecesCover(const std::string& target_key, const std::vector<SourcePiece>& pieces,
                   const Box& target) {
  std::vector<Box> boxes;
  boxes.reserve(pieces.size());
  for (const SourcePiece& p : pieces) boxes.push_back(p.dst_box);
  const CoverReport cover = CheckCover(target, std::move(boxes), 1);
  if (!cover.overlaps.empty()) {
    return InvalidArgumentError("target '" + target_key + "': sources overlap at " +
                                cover.overlaps[0].first.ToString() + " and " +
                                cover.overlaps[0].second.ToString());
  }
  if (!cover.exact()) {
    std::string what = "target '" + target_key + "': " +
                       std::to_string(cover.whole_elements - cover.covered_elements) +
                       " of " + std::to_string(cover.whole_elements) + " elements have no source";
    if (!cover.missing.empty()) what += ", e.g. " + cover.missing[0].ToString();
    return NotFoundError(what);
  }
  return Status::Ok();
}

Status CheckSourceCoverage(const TensorEntry& tensor) {
  std::vector<Box> boxes;
  for (const Chunk& c : tensor.chunks) {
    if (c.replica_id != 0) continue;
    if (!c.flat_range) {
      boxes.push_back(c.box);
      continue;
    }
    for (Box& p : DecomposeFlatRange(c.box.local_shape, *c.flat_range)) {
      for (size_t i = 0; i < p.rank(); ++i) p.global_offset[i] += c.box.global_offset[i];
      boxes.push_back(std::move(p));
    }
  }
  const CoverReport cover = CheckCover(Box::Whole(tensor.global_shape), std::move(boxes), 1);
  if (!cover.overlaps.empty()) {
    return DataLossError("source tensor '" + tensor.key + "': chunks " +
                         cover.overlaps[0].first.ToString() + " and " +
                         cover.overlaps[0].second.ToString() + " overlap");
  }
  if (!cover.exact()) {
    std::string what = "source tensor '" + tensor.key + "' is missing " +
                       std::to_string(cover.whole_elements - cover.covered_elements) + " of " +
                       std::to_string(cover.whole_elements) + " elements";
    if (!cover.missing.empty()) what += ", e.g. " + cover.missing[0].ToString();
    return NotFoundError(what + ": a chunk or data file is absent");
  }
  return Status::Ok();
}

}  // namespace fc
