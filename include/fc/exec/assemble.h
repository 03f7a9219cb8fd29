// Assembling target data from source chunks: the data path shared by export and convert.
//
// A target tensor is described by SourcePieces: "block `src_box` of source tensor `source`,
// after `ops` (in order), lands at `dst_box` of the target". Pieces come from the AOA engine
// (or are identities when there is no program). AssembleRegion fills any box of the target
// (a slab of a large tensor, or a target chunk) from the pieces that overlap it, reading only
// the source rows it needs (a piece with a reshape is read whole, since a reshape does not
// map sub-boxes to sub-boxes), and converting to the target dtype with round-to-nearest-even.
//
// Thread-safety: AssembleRegion may run concurrently on distinct destination buffers with
// one shared ChunkReader.
#ifndef FC_EXEC_ASSEMBLE_H_
#define FC_EXEC_ASSEMBLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/format/chunk_reader.h"

namespace fc {

struct PieceOp {
  enum class Kind { kPermute, kCast, kReshape };
  Kind kind = Kind::kPermute;
  // kPermute: output axis i is input axis permutation[i]; empty reverses all axes.
  std::vector<int> permutation;
  DType dtype = DType::kFloat32;  // kCast: the element type after the cast
  Shape shape;                    // kReshape: the block's shape after (row-major order kept)
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

// Fills `region` of the target (a row-major buffer of `region`'s shape, elements of
// `dst_dtype`) from every piece that overlaps it. Elements no piece covers are left as they
// were: callers check coverage first (PiecesCover). The source chunks must cover each
// piece's src_box (CheckSourceCoverage). Errors: read errors with context, conversion errors
// (e.g. NaN to an integer type, or a fill value out of an integer type's range) naming the
// target and source keys.
Status AssembleRegion(ChunkReader& reader, const std::string& target_key,
                      const std::vector<SourcePiece>& pieces, const Box& region,
                      DType dst_dtype, void* dst);

// Adds, per source file, the bytes AssembleRegion(pieces, region) would take from it
// (element volumes; row over-reads not counted). For plans and --dry-run.
void AccumulateRegionReads(const std::vector<SourcePiece>& pieces, const Box& region,
                           std::map<uint32_t, uint64_t>& bytes_per_file);

// Whether pieces' dst boxes cover `target` exactly once. Returns kNotFound naming the first
// uncovered box, or kInvalidArgument naming two overlapping pieces.
Status PiecesCover(const std::string& target_key, const std::vector<SourcePiece>& pieces,
                   const Box& target);

// Whether the replica-0 chunks of `tensor` store every element exactly once. kNotFound names
// a missing box ("source tensor 'w' is missing [4, 8) x [0, 6): a chunk is absent"),
// kDataLoss two overlapping chunks.
Status CheckSourceCoverage(const TensorEntry& tensor);

}  // namespace fc

#endif  // FC_EXEC_ASSEMBLE_H_
