// Assembling target data from source chunks: the data path shared by export and convert.
//
// A target tensor is described by SourcePieces (fc/plan/piece.h). AssembleRegion fills any
// box of the target (a write item: a slab of a large tensor, or of a target chunk) from the
// pieces that overlap it, reading only the source elements it needs, and converting to the
// target dtype with round-to-nearest-even. A piece with a reshape is read whole (a reshape
// does not map sub-boxes to sub-boxes); with a PieceBlockCache, such whole blocks (and those
// the plan asks for: transposed or strided sources) are read once and kept for the regions
// that follow.
//
// Thread-safety: AssembleRegion may run concurrently on distinct destination buffers with
// one shared ChunkReader.
#ifndef FC_EXEC_ASSEMBLE_H_
#define FC_EXEC_ASSEMBLE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <map>
#include <string>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/format/chunk_reader.h"
#include "fc/plan/piece.h"

namespace fc {

// Fills `region` of the target (a row-major buffer of `region`'s shape, elements of
// `dst_dtype`) from every piece that overlaps it. Elements no piece covers are left as they
// were: callers check coverage first (PiecesCover). The source chunks must cover each
// piece's src_box (CheckSourceCoverage). Errors: read errors with context, conversion errors
// (e.g. NaN to an integer type, or a fill value out of an integer type's range) naming the
// target and source keys.
// `cache`: where whole blocks of reshaping pieces are kept between the regions that need
// them, so that such a block is read once rather than once per region (nullptr: read per
// region).
class PieceBlockCache;
class SourceReader;
Status AssembleRegion(SourceReader& reader, const std::string& target_key,
                      const std::vector<SourcePiece>& pieces, const Box& region,
                      DType dst_dtype, void* dst, PieceBlockCache* cache = nullptr);
// The same, reading every source element from the files.
Status AssembleRegion(ChunkReader& reader, const std::string& target_key,
                      const std::vector<SourcePiece>& pieces, const Box& region,
                      DType dst_dtype, void* dst, PieceBlockCache* cache = nullptr);

// Where AssembleRegion gets source elements: the files, or, in a multi-process run, partly
// the bytes other processes read and sent (fc/exec/execute.h). Thread-safe.
class SourceReader {
 public:
  virtual ~SourceReader() = default;
  // Copies the elements of `src_sub` (source coordinates) that the replica-0 chunks of
  // `tensor` store into `out`, a row-major buffer holding `out_box` (which contains src_sub).
  virtual Status Read(const TensorEntry& tensor, const Box& src_sub, void* out,
                      const Box& out_box) = 0;
};

// Every element from the files, through a ChunkReader.
class FileSourceReader final : public SourceReader {
 public:
  explicit FileSourceReader(ChunkReader& chunks) : chunks_(chunks) {}
  Status Read(const TensorEntry& tensor, const Box& src_sub, void* out,
              const Box& out_box) override;

 private:
  ChunkReader& chunks_;
};

// Blocks of reshaping pieces (the whole source block after the piece's ops, in the target
// dtype), kept while regions of the target use them. Bounded: when holding more than
// `capacity_bytes`, the least recently used blocks no region is using are dropped (and read
// again if needed later). Thread-safe: concurrent Get calls for one piece compute it once.
// Pieces are known by address: pass AssembleRegion the same pieces vector every time.
class PieceBlockCache {
 public:
  explicit PieceBlockCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}
  // Pieces without a reshape whose whole block should be read once and kept too (transposed
  // or strided sources). Call before any Get; not thread-safe against Get.
  void Allow(const SourcePiece* piece) { allowed_.insert(piece); }
  bool Allowed(const SourcePiece* piece) const { return allowed_.count(piece) > 0; }
  using Block = std::shared_ptr<const std::vector<std::byte>>;
  Result<Block> Get(const SourcePiece* piece,
                    const std::function<Result<std::vector<std::byte>>()>& make);
  uint64_t peak_bytes() const;  // most bytes held at once

 private:
  struct Entry {
    Block block;          // null while being made
    uint64_t last_use = 0;
  };
  void EvictLocked();
  uint64_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable made_;
  std::map<const SourcePiece*, Entry> entries_;
  std::set<const SourcePiece*> allowed_;
  uint64_t held_ = 0;
  uint64_t peak_ = 0;
  uint64_t clock_ = 0;
};


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
