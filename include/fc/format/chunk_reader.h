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
// Checksums: a chunk that carries an xxh3_64 (fc distcp) is verified from the bytes
// CopyChunkRegion copies, and remembered as verified for the reader's lifetime:
//   - a read of the whole chunk hashes what it copied (no second read);
//   - reads of whole rows (axis 0), or of part of one row, of a row-major chunk or of one of
//     a flattened range's stored boxes, are runs of the chunk's bytes: hashed as copied when a run is the next in
//     the chunk's byte order, else copied, packed and kept until the runs before it are in
//     (other threads, other rounds, parts read for other processes first), so a chunk read
//     in parts by one process is read once; past the reorder limit (SetReorderLimit) the gap
//     before such a run is hashed from the file; the digest is checked when the last byte
//     is in;
//   - other partial reads (column cuts) hash the chunk from its file before the first part
//     is used.
// Extra reads are counted in verify_bytes_read(), not in bytes_read(). A chunk read only in
// part is finished by FinishVerification (reading the bytes nobody copied), which callers that read in parts (Execute, fc-diff)
// call before they trust what they copied. A mismatch is kDataLoss naming the file, tensor and
// chunk, e.g. "1_0.distcp: tensor 'w' chunk [4, 8) x [0, 6) bytes [384, 408): checksum
// mismatch: xxh3-64 of the bytes is ..., the metadata says ...".
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
#include <unordered_set>
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
struct ChunkReaderOptions {
  // Verify chunk checksums on read (see above). Default: DefaultVerifyChecksums().
  bool verify_checksums = true;
};

// The process-wide default of ChunkReaderOptions::verify_checksums for readers constructed
// without options (true unless a tool was given --no-verify-checksums). Set it before
// constructing readers; reading it is thread-safe.
void SetDefaultVerifyChecksums(bool verify);
bool DefaultVerifyChecksums();

class ChunkReader {
 public:
  // `index` must outlive the reader. Verifies checksums when DefaultVerifyChecksums().
  explicit ChunkReader(const CheckpointIndex& index);
  ChunkReader(const CheckpointIndex& index, ChunkReaderOptions options);

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

  // The raw bytes [chunk.byte_offset, + byte_length) (for checksums and copies); not
  // verified against the chunk's checksum (its callers compute checksums themselves).
  Status ReadChunkBytes(const Chunk& chunk, std::span<std::byte> dst);

  // Where `chunk` (of `tensor`) keeps its data: its own byte_offset/byte_length/strides, or,
  // for an unlocated chunk, the place found in its item (cached). Errors: kDataLoss /
  // kUnimplemented for a corrupt or unsupported item, kIoError.
  Result<ChunkLocation> Locate(const TensorEntry& tensor, const Chunk& chunk);

  // Completes the verification of every chunk read so far only in part (hashing its unread
  // bytes from its file) and checks the digests. Errors: the first mismatch (kDataLoss), or
  // a read error.
  Status FinishVerification();

  // Most bytes of parts read ahead of their chunk's hash that may wait in memory (default
  // 64 MiB); past it, the gap before such a part is hashed from the file (a second read).
  void SetReorderLimit(uint64_t bytes);
  // Most bytes that waited at once so far.
  uint64_t reorder_peak_bytes() const;

  // Bytes read from files so far (for progress and benchmarks).
  uint64_t bytes_read() const;
  // Bytes read only to verify checksums (a chunk whose first read was partial).
  uint64_t verify_bytes_read() const;
  // Chunks verified so far.
  uint64_t chunks_verified() const;

 private:
  Status CopyBoxPiece(const TensorEntry& tensor, const Chunk& chunk, const Box& stored_box,
                      uint64_t stored_byte_offset, const Box& piece, void* dst,
                      const Box& dst_box);

  // CopyChunkRegion without checksum verification.
  Status CopyUnverified(const TensorEntry& tensor, const Chunk& chunk, const Box& region,
                        void* dst, const Box& dst_box);

  // Locate for an unlocated chunk; `key` names the tensor in errors.
  Result<ChunkLocation> LocateUnlocated(const std::string& key, const Chunk& chunk);

  // Whether `chunk` is one of the index's own chunks (not a caller's copy).
  bool InIndex(const Chunk& chunk) const;
  // True when `chunk` has a checksum, verification is on and it was not verified yet.
  bool NeedsVerification(const Chunk& chunk) const;
  void MarkVerified(const Chunk& chunk);
  // kDataLoss naming file, tensor and chunk unless `actual` is the chunk's checksum.
  Status CheckDigest(const TensorEntry& tensor, const Chunk& chunk, uint64_t actual) const;
  // Hashes the chunk's bytes from its file and checks them.
  Status VerifyFromFile(const TensorEntry& tensor, const Chunk& chunk);
  // Copies `part` (one run of `stored`: whole rows or part of one row; `stored` is one of
  // the chunk's stored boxes, whose data starts at element `stored_element` of the chunk)
  // and feeds it to the chunk's running hash:
  // directly when it is the next run of the chunk's bytes, else kept (packed) until the
  // bytes before it are in, within the reorder limit, else after hashing the gap from the
  // file. Checks the digest once the chunk is complete.
  Status CopyPartHashing(const TensorEntry& tensor, const Chunk& chunk, const Box& stored,
                         uint64_t stored_element, const Box& part, void* dst,
                         const Box& dst_box);
  // Copies `rows` (one run of `stored`, a stored box of `chunk`) in batches of rows, feeding
  // each to `xxh3_state` (an XXH3_state_t; opaque here, the source inlines xxHash under renamed
  // types).
  Status CopyRowsHashing(const TensorEntry& tensor, const Chunk& chunk, const Box& stored,
                         const Box& rows, void* dst, const Box& dst_box, void* xxh3_state);
  struct ChunkStream;
  // Appends [from, to) of the chunk's bytes, read from its file, to the stream.
  Status HashFromFile(ChunkStream& stream, uint64_t from, uint64_t to);
  // Digest check once the stream holds every byte of its chunk.
  Status CompleteStream(ChunkStream& stream);
  // Hashes the pending parts that now follow the stream's hashed bytes; frees them.
  void DrainPending(ChunkStream& stream);
  // Frees every pending part of the stream.
  void ReleasePending(ChunkStream& stream);

  const CheckpointIndex& index_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::unordered_map<const Chunk*, ChunkLocation> located_;  // guarded by mu_
  // [begin, end) of every tensor's chunk array in index_, sorted: only chunks stored in the
  // index are cached (a caller's temporary copy could reuse an address).
  std::vector<std::pair<const Chunk*, const Chunk*>> chunk_spans_;
  uint64_t bytes_read_ = 0;
  const ChunkReaderOptions options_;
  std::unordered_set<const Chunk*> verified_;  // guarded by mu_; index chunks only
  uint64_t verify_bytes_read_ = 0;             // guarded by mu_
  uint64_t chunks_verified_ = 0;               // guarded by mu_
  // Running hashes of chunks read in parts, until complete; guarded by mu_ (each stream
  // by its own mutex).
  std::unordered_map<const Chunk*, std::shared_ptr<ChunkStream>> streams_;
  uint64_t reorder_limit_ = 64u << 20;  // guarded by mu_
  uint64_t pending_bytes_ = 0;          // guarded by mu_: parts waiting in streams
  uint64_t pending_peak_ = 0;           // guarded by mu_
};

}  // namespace fc

#endif  // FC_FORMAT_CHUNK_READER_H_
