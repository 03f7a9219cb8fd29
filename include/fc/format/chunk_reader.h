// Reading tensor bytes out of a checkpoint: the elements of a region of a chunk, placed into
// a caller's row-major buffer. Understands the three chunk layouts of checkpoint.h (packed
// row-major, strided, flattened range).
//
// Chunks opened without their exact data place (Chunk::unlocated_item, torch DCP) are
// located on first use (LocateTorchDcpChunk: a couple of small reads of the item) and the
// place is cached per chunk for the reader's lifetime; a corrupt item is reported then, with
// the file, tensor and chunk named.
//
// Chunks of encoded items (Chunk::encoded_item, torch DCP stream transforms) are decoded on
// each read from the item's start (fc/format/torch_dcp_transform.h): bounded memory, CPU for
// the skipped prefix; their reads always take whole rows.
//
// Thread-safety: ChunkReader is safe to use from several threads at once (files are opened
// and locations cached under a mutex; reads use pread).
#ifndef FC_FORMAT_CHUNK_READER_H_
#define FC_FORMAT_CHUNK_READER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/io/file.h"

namespace fc {

// The bytes of an object: [byte_offset, + byte_length) of `file`, or of the decoded item
// when object.encoded_item is set. Errors: kDataLoss / kIoError, naming the file.
Result<std::vector<std::byte>> ReadObjectBytes(const RandomAccessFile& file,
                                               const ObjectEntry& object);

class ChunkReader {
 public:
  // `index` must outlive the reader.
  explicit ChunkReader(const CheckpointIndex& index);

  // The open file `files[file]` of the index (opened on first use).
  Result<const RandomAccessFile*> File(uint32_t file);

  // Copies every element that lies both in `region` (global coordinates) and in what `chunk`
  // stores into `dst`, a row-major buffer holding `dst_box` of the same tensor. Elements of
  // `region` that the chunk does not store are left untouched. Precondition:
  // Contains(dst_box, region). Reads only the rows of the chunk that the region needs; when
  // the overlap is contiguous in both the file and `dst`, reads straight into `dst`.
  // Errors: as RandomAccessFile::ReadAt, with the tensor key and chunk box as context.
  Status CopyChunkRegion(const TensorEntry& tensor, const Chunk& chunk, const Box& region,
                         void* dst, const Box& dst_box);

  // The raw bytes [chunk.byte_offset, + byte_length) (for checksums and copies).
  Status ReadChunkBytes(const Chunk& chunk, std::span<std::byte> dst);

  // Where `chunk` (of `tensor`) keeps its data: its own byte_offset/byte_length/strides, or,
  // for an unlocated chunk, the place found in its item (cached). Errors: kDataLoss /
  // kUnimplemented for a corrupt or unsupported item, kIoError.
  Result<ChunkLocation> Locate(const TensorEntry& tensor, const Chunk& chunk);

  // Bytes read from files so far (for progress and benchmarks).
  uint64_t bytes_read() const;

 private:
  Status CopyBoxPiece(const TensorEntry& tensor, const Chunk& chunk, const Box& stored_box,
                      uint64_t stored_byte_offset, const Box& piece, void* dst,
                      const Box& dst_box);

  // Locate for an unlocated chunk; `key` names the tensor in errors.
  Result<ChunkLocation> LocateUnlocated(const std::string& key, const Chunk& chunk);

  const CheckpointIndex& index_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::unordered_map<const Chunk*, ChunkLocation> located_;  // guarded by mu_
  // [begin, end) of every tensor's chunk array in index_, sorted: only chunks stored in the
  // index are cached (a caller's temporary copy could reuse an address).
  std::vector<std::pair<const Chunk*, const Chunk*>> chunk_spans_;
  uint64_t bytes_read_ = 0;
};

}  // namespace fc

#endif  // FC_FORMAT_CHUNK_READER_H_
