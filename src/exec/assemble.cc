#include "fc/exec/assemble.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <numeric>

#include "fc/core/box_cover.h"
#include "fc/core/dtype_convert.h"
#include "fc/core/flat_range.h"

namespace fc {
namespace {


Box ZeroOrigin(const Shape& shape) { return Box{Shape(shape.size(), 0), shape}; }

// Reads `src_sub` of `tensor` (row-major, source dtype) into `out`.
Status ReadSourceBlock(SourceReader& reader, const TensorEntry& tensor, const Box& src_sub,
                       void* out, const Box& out_box) {
  return reader.Read(tensor, src_sub, out, out_box);
}

// Reads `src_sub` of the piece's source and applies the piece's ops and the conversion to
// `dst_dtype`: the result is row-major over the target box the block lands on.
Result<std::vector<std::byte>> PieceBlock(SourceReader& reader, const SourcePiece& piece,
                                          const Box& src_sub, DType dst_dtype,
                                          const std::function<std::string()>& context) {
  const TensorEntry& source = *piece.source;
  const size_t dst_esize = DTypeSize(dst_dtype);
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
      FC_RETURN_IF_ERROR_WITH(ConvertElements(block.data(), dtype, scratch.data(), op.dtype,
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
  return block;
}

}  // namespace

Status FileSourceReader::Read(const TensorEntry& tensor, const Box& src_sub, void* out,
                              const Box& out_box) {
  for (const Chunk& chunk : tensor.chunks) {
    if (chunk.replica_id != 0) continue;
    FC_RETURN_IF_ERROR(chunks_.CopyChunkRegion(tensor, chunk, src_sub, out, out_box));
  }
  return Status::Ok();
}

Status AssembleRegion(ChunkReader& reader, const std::string& target_key,
                      const std::vector<SourcePiece>& pieces, const Box& region,
                      DType dst_dtype, void* dst, PieceBlockCache* cache) {
  FileSourceReader files(reader);
  return AssembleRegion(files, target_key, pieces, region, dst_dtype, dst, cache);
}

Status AssembleRegion(SourceReader& reader, const std::string& target_key,
                      const std::vector<SourcePiece>& pieces, const Box& region,
                      DType dst_dtype, void* dst, PieceBlockCache* cache) {
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
    // Whole: the piece's entire block is read and transformed once (a reshape needs it; the
    // plan asks for it for transposed and strided pieces, which would otherwise read much of
    // the block for every region).
    const bool whole = PieceReshapes(piece) || (cache != nullptr && cache->Allowed(&piece));
    const Box src_sub = whole ? piece.src_box : SourceSubBox(piece, *dst_sub);
    auto context = [&] {
      return "target '" + target_key + "' " + dst_sub->ToString() + " from '" + source.key +
             "' " + src_sub.ToString();
    };
    if (!whole && piece.ops.empty() && source.dtype == dst_dtype) {
      // Fast path: chunk bytes go straight into the destination. The destination buffer,
      // seen in source coordinates, is `region` shifted by the piece's offset.
      Box shifted = region;
      for (size_t i = 0; i < rank; ++i) {
        shifted.global_offset[i] += piece.src_box.global_offset[i] - piece.dst_box.global_offset[i];
      }
      FC_RETURN_IF_ERROR_WITH(ReadSourceBlock(reader, source, src_sub, dst, shifted), context());
      continue;
    }
    std::shared_ptr<const std::vector<std::byte>> held;
    const std::vector<std::byte>* block = nullptr;
    std::vector<std::byte> own;
    if (whole && cache != nullptr) {
      FC_ASSIGN_OR_RETURN(held, cache->Get(&piece, [&] {
        return PieceBlock(reader, piece, src_sub, dst_dtype, context);
      }));
      block = held.get();
    } else {
      FC_ASSIGN_OR_RETURN(own, PieceBlock(reader, piece, src_sub, dst_dtype, context));
      block = &own;
    }
    // The block now holds the target box it came for: dst_sub, or the whole dst_box.
    CopyRegion(block->data(), whole ? piece.dst_box : *dst_sub, {}, dst, region, *dst_sub,
               dst_esize);
  }
  return Status::Ok();
}

Result<PieceBlockCache::Block> PieceBlockCache::Get(
    const SourcePiece* piece, const std::function<Result<std::vector<std::byte>>()>& make) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = entries_.find(piece);
    if (it == entries_.end()) break;
    if (it->second.block) {
      it->second.last_use = ++clock_;
      return it->second.block;
    }
    made_.wait(lock);  // another worker is making it
  }
  entries_[piece] = Entry{};
  lock.unlock();
  Result<std::vector<std::byte>> made = make();
  lock.lock();
  if (!made.ok()) {
    entries_.erase(piece);
    made_.notify_all();
    return made.status();
  }
  Block block = std::make_shared<const std::vector<std::byte>>(std::move(*made));
  held_ += block->size();
  peak_ = std::max(peak_, held_);
  entries_[piece] = Entry{block, ++clock_};
  EvictLocked();
  made_.notify_all();
  return block;
}

void PieceBlockCache::EvictLocked() {
  while (held_ > capacity_) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      // In use elsewhere (or being made): not a candidate.
      if (!it->second.block || it->second.block.use_count() > 1) continue;
      if (victim == entries_.end() || it->second.last_use < victim->second.last_use) victim = it;
    }
    if (victim == entries_.end()) return;
    held_ -= victim->second.block->size();
    entries_.erase(victim);
  }
}

uint64_t PieceBlockCache::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
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
