#include "fc/format/chunk_reader.h"

// Header-only xxHash: inlined and unrolled here it hashes about 5x faster (43 GB/s, SSE2)
// than Debian's libxxhash build (8 GB/s), which keeps checksums on every read cheap.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>

#include "fc/core/flat_range.h"
#include "fc/format/fc_distcp.h"
#include "fc/format/torch_dcp.h"
#include "fc/format/torch_dcp_transform.h"
#include "src/format/fc_distcp/internal.h"

namespace fc {
namespace {

// Runs of at least this many bytes are read one by one rather than as whole rows: one
// system call per run costs less than reading the rest of the row (measured per call from
// the page cache: about a microsecond, the time to copy a few KiB).
constexpr uint64_t kMinRunBytes = 512;

// True when `box` covers the whole of `outer` on every axis after the first, so its elements
// are one contiguous run in a row-major buffer holding `outer`.
bool ContiguousIn(const Box& outer, const Box& box) {
  for (size_t i = 1; i < box.rank(); ++i) {
    if (box.global_offset[i] != outer.global_offset[i] ||
        box.local_shape[i] != outer.local_shape[i]) {
      return false;
    }
  }
  return true;
}

// True when `box`'s elements are one run of `outer`'s row-major order: whole on every axis
// after some axis k, a single index on every axis before it (k is free). Wider than
// ContiguousIn: part of one row is a run too (a flattened range that cuts a row ends in one).
bool OneRunIn(const Box& outer, const Box& box) {
  size_t last_partial = box.rank();
  for (size_t i = 0; i < box.rank(); ++i) {
    if (box.local_shape[i] != outer.local_shape[i]) last_partial = i;
  }
  if (last_partial == box.rank()) return true;
  for (size_t i = 0; i < last_partial; ++i) {
    if (box.local_shape[i] != 1) return false;
  }
  return true;
}

// Row-major element offset of box's first element inside `outer`.
int64_t FirstElementOffset(const Box& outer, const Box& box) {
  int64_t offset = 0;
  for (size_t i = 0; i < box.rank(); ++i) {
    offset = offset * outer.local_shape[i] + (box.global_offset[i] - outer.global_offset[i]);
  }
  return offset;
}

std::string ChunkContext(const TensorEntry& tensor, const Chunk& chunk) {
  std::string s = "tensor '" + tensor.key + "' chunk " + chunk.box.ToString();
  if (chunk.flat_range) s += " flat " + chunk.flat_range->ToString();
  return s;
}

// Reads `dst` at `offset` of the chunk's data: the file itself, or the decoded item.
Status ReadStored(const RandomAccessFile& f, const Chunk& chunk, uint64_t offset,
                  std::span<std::byte> dst) {
  if (chunk.encoded_item) return ReadDecodedRange(f, *chunk.encoded_item, offset, dst);
  return f.ReadAt(offset, dst);
}

std::atomic<bool> g_verify_checksums{true};

struct Xxh3StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using Xxh3State = std::unique_ptr<XXH3_state_t, Xxh3StateDeleter>;

// Calls fn(byte offset in dst, bytes) for the runs of `box` that are contiguous in `dst_box`
// (row-major, elements of `esize` bytes; box inside dst_box), in the
// row-major order of `box`: the trailing axes `box` covers whole, times the first it does not.
template <typename Fn>
void ForEachRunIn(const Box& dst_box, const Box& box, size_t esize, Fn&& fn) {
  size_t merged = box.rank();
  int64_t run = 1;
  while (merged > 0) {
    --merged;
    run *= box.local_shape[merged];
    if (box.local_shape[merged] != dst_box.local_shape[merged]) break;
  }
  const int64_t runs = box.num_elements() / run;
  const Shape dst_strides = RowMajorStrides(dst_box.local_shape);
  const size_t run_bytes = static_cast<size_t>(run) * esize;
  Shape idx(merged, 0);  // index over the axes before `merged`
  for (int64_t r = 0; r < runs; ++r) {
    int64_t element = 0;
    for (size_t a = 0; a < box.rank(); ++a) {
      const int64_t i = a < merged ? idx[a] : 0;
      element += (box.global_offset[a] - dst_box.global_offset[a] + i) * dst_strides[a];
    }
    fn(static_cast<size_t>(element) * esize, run_bytes);
    for (size_t a = merged; a-- > 0;) {
      if (++idx[a] < box.local_shape[a]) break;
      idx[a] = 0;
    }
  }
}

// Feeds the elements of `box` (inside `dst_box`, whose row-major bytes start at `dst`) to
// `state` in row-major order of `box`: the order a packed chunk holding `box` has in its file.
void HashBoxIn(XXH3_state_t* state, const std::byte* dst, const Box& dst_box, const Box& box,
               size_t esize) {
  if (box.rank() == 0) {
    XXH3_64bits_update(state, dst, esize);
    return;
  }
  if (box.empty()) return;
  ForEachRunIn(dst_box, box, esize, [&](size_t offset, size_t bytes) {
    XXH3_64bits_update(state, dst + offset, bytes);
  });
}

}  // namespace

Result<std::vector<std::byte>> ReadObjectBytes(const RandomAccessFile& file,
                                               const ObjectEntry& object) {
  if (!object.encoded_item) return file.ReadAt(object.byte_offset, object.byte_length);
  std::vector<std::byte> bytes(static_cast<size_t>(object.byte_length));
  FC_RETURN_IF_ERROR_WITH(ReadDecodedRange(file, *object.encoded_item, object.byte_offset, bytes),
                          "object '" + object.key + "'");
  return bytes;
}
void SetDefaultVerifyChecksums(bool verify) { g_verify_checksums.store(verify); }
bool DefaultVerifyChecksums() { return g_verify_checksums.load(); }

ChunkReader::ChunkReader(const CheckpointIndex& index)
    : ChunkReader(index, ChunkReaderOptions{.verify_checksums = DefaultVerifyChecksums()}) {}

ChunkReader::ChunkReader(const CheckpointIndex& index, ChunkReaderOptions options)
    : index_(index), files_(index.files.size()), options_(options) {
  for (const TensorEntry& t : index.tensors) {
    if (!t.chunks.empty()) chunk_spans_.emplace_back(t.chunks.data(), t.chunks.data() + t.chunks.size());
  }
  std::sort(chunk_spans_.begin(), chunk_spans_.end());
}

Result<const RandomAccessFile*> ChunkReader::File(uint32_t file) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file >= files_.size()) {
    return InternalError("file index " + std::to_string(file) + " out of range");
  }
  if (!files_[file]) {
    FC_ASSIGN_OR_RETURN(files_[file],
                        RandomAccessFile::Open(JoinPath(index_.root, index_.files[file].path)));
  }
  return files_[file].get();
}

uint64_t ChunkReader::bytes_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_read_;
}

uint64_t ChunkReader::verify_bytes_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return verify_bytes_read_;
}

uint64_t ChunkReader::chunks_verified() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_verified_;
}

bool ChunkReader::InIndex(const Chunk& chunk) const {
  auto span = std::upper_bound(
      chunk_spans_.begin(), chunk_spans_.end(), &chunk,
      [](const Chunk* c, const std::pair<const Chunk*, const Chunk*>& s) {
        return std::less<const Chunk*>()(c, s.first);
      });
  return span != chunk_spans_.begin() &&
         std::less<const Chunk*>()(&chunk, std::prev(span)->second);
}

bool ChunkReader::NeedsVerification(const Chunk& chunk) const {
  if (!options_.verify_checksums || !chunk.xxh3_64) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return verified_.count(&chunk) == 0;
}

void ChunkReader::MarkVerified(const Chunk& chunk) {
  const bool in_index = InIndex(chunk);
  std::lock_guard<std::mutex> lock(mu_);
  ++chunks_verified_;
  // A caller's temporary copy is verified on every read (its address could be reused).
  if (in_index) verified_.insert(&chunk);
}

Status ChunkReader::CheckDigest(const TensorEntry& tensor, const Chunk& chunk,
                                uint64_t actual) const {
  if (actual == *chunk.xxh3_64) return Status::Ok();
  const std::string file =
      chunk.file < index_.files.size() ? index_.files[chunk.file].path : std::string("?");
  return DataLossError(file + ": " + ChunkContext(tensor, chunk) + " bytes [" +
                       std::to_string(chunk.byte_offset) + ", " +
                       std::to_string(chunk.byte_offset + chunk.byte_length) +
                       "): checksum mismatch: xxh3-64 of the bytes is " +
                       fcdistcp_internal::Hex64(actual) + ", the metadata says " +
                       fcdistcp_internal::Hex64(*chunk.xxh3_64) +
                       " (damaged data; --no-verify-checksums reads it anyway)");
}

Status ChunkReader::VerifyFromFile(const TensorEntry& tensor, const Chunk& chunk) {
  FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, File(chunk.file));
  FC_ASSIGN_OR_RETURN(uint64_t actual,
                      Xxh3OfFileRange(*f, chunk.byte_offset, chunk.byte_length)
                          .With(index_.files[chunk.file].path + ": " +
                                ChunkContext(tensor, chunk)));
  FC_RETURN_IF_ERROR(CheckDigest(tensor, chunk, actual));
  {
    std::lock_guard<std::mutex> lock(mu_);
    verify_bytes_read_ += chunk.byte_length;
  }
  MarkVerified(chunk);
  return Status::Ok();
}

// A chunk's running hash: bytes [0, hashed) of the chunk are in `state`. Parts copied ahead
// of `hashed` wait in `pending` (packed, in the chunk's byte order, by chunk byte offset)
// until the bytes before them are in.
struct ChunkReader::ChunkStream {
  std::mutex mu;
  const TensorEntry* tensor = nullptr;
  const Chunk* chunk = nullptr;
  Xxh3State state;
  uint64_t hashed = 0;
  bool done = false;
  std::map<uint64_t, std::vector<std::byte>> pending;
};

void ChunkReader::SetReorderLimit(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  reorder_limit_ = bytes;
}

uint64_t ChunkReader::reorder_peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_peak_;
}

Status ChunkReader::HashFromFile(ChunkStream& stream, uint64_t from, uint64_t to) {
  if (from >= to) return Status::Ok();
  const Chunk& chunk = *stream.chunk;
  FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, File(chunk.file));
  constexpr uint64_t kSlab = 4u << 20;
  std::vector<std::byte> buffer(static_cast<size_t>(std::min(kSlab, to - from)));
  for (uint64_t at = from; at < to;) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), to - at);
    std::span<std::byte> slab(buffer.data(), static_cast<size_t>(n));
    FC_RETURN_IF_ERROR_WITH(f->ReadAt(chunk.byte_offset + at, slab),
                            index_.files[chunk.file].path + ": " +
                                ChunkContext(*stream.tensor, chunk));
    XXH3_64bits_update(stream.state.get(), slab.data(), slab.size());
    at += n;
  }
  std::lock_guard<std::mutex> lock(mu_);
  verify_bytes_read_ += to - from;
  return Status::Ok();
}

void ChunkReader::ReleasePending(ChunkStream& stream) {
  uint64_t bytes = 0;
  for (const auto& [at, part] : stream.pending) bytes += part.size();
  stream.pending.clear();
  std::lock_guard<std::mutex> lock(mu_);
  pending_bytes_ -= bytes;
}

void ChunkReader::DrainPending(ChunkStream& stream) {
  uint64_t released = 0;
  while (!stream.pending.empty() && stream.pending.begin()->first <= stream.hashed) {
    auto it = stream.pending.begin();
    const uint64_t end = it->first + it->second.size();
    if (end > stream.hashed) {
      XXH3_64bits_update(stream.state.get(), it->second.data() + (stream.hashed - it->first),
                         static_cast<size_t>(end - stream.hashed));
      stream.hashed = end;
    }
    released += it->second.size();
    stream.pending.erase(it);
  }
  if (released == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  pending_bytes_ -= released;
}

Status ChunkReader::CompleteStream(ChunkStream& stream) {
  stream.done = true;
  ReleasePending(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.erase(stream.chunk);
  }
  FC_RETURN_IF_ERROR(
      CheckDigest(*stream.tensor, *stream.chunk, XXH3_64bits_digest(stream.state.get())));
  MarkVerified(*stream.chunk);
  return Status::Ok();
}

Status ChunkReader::CopyRowsHashing(const TensorEntry& tensor, const Chunk& chunk,
                                    const Box& stored, const Box& rows, void* dst,
                                    const Box& dst_box, void* xxh3_state) {
  auto* state = static_cast<XXH3_state_t*>(xxh3_state);
  // Batches small enough to be hashed while they are still in the CPU cache (hashing a
  // multi-MiB block after the copy costs a second trip through memory).
  constexpr uint64_t kBatchBytes = 256u << 10;
  const size_t esize = DTypeSize(tensor.dtype);
  const uint64_t row_bytes =
      static_cast<uint64_t>(stored.num_elements() / stored.local_shape[0]) * esize;
  const int64_t batch_rows =
      static_cast<int64_t>(std::max<uint64_t>(1, kBatchBytes / std::max<uint64_t>(1, row_bytes)));
  for (int64_t r = 0; r < rows.local_shape[0]; r += batch_rows) {
    Box batch = rows;
    batch.global_offset[0] += r;
    batch.local_shape[0] = std::min(batch_rows, rows.local_shape[0] - r);
    FC_RETURN_IF_ERROR(CopyUnverified(tensor, chunk, batch, dst, dst_box));
    HashBoxIn(state, static_cast<const std::byte*>(dst), dst_box, batch, esize);
  }
  return Status::Ok();
}

Status ChunkReader::CopyPartHashing(const TensorEntry& tensor, const Chunk& chunk,
                                    const Box& stored, uint64_t stored_element,
                                    const Box& part, void* dst, const Box& dst_box) {
  const size_t esize = DTypeSize(tensor.dtype);
  const uint64_t begin =
      (stored_element + static_cast<uint64_t>(FirstElementOffset(stored, part))) * esize;
  const uint64_t end = begin + static_cast<uint64_t>(part.num_elements()) * esize;
  std::shared_ptr<ChunkStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (verified_.count(&chunk) == 0) {
      std::shared_ptr<ChunkStream>& slot = streams_[&chunk];
      if (!slot) {
        slot = std::make_shared<ChunkStream>();
        slot->tensor = &tensor;
        slot->chunk = &chunk;
        slot->state.reset(XXH3_createState());
        if (!slot->state) return ResourceExhaustedError("out of memory for an XXH3 state");
        XXH3_64bits_reset(slot->state.get());
      }
      stream = slot;
    }
  }
  if (!stream) return CopyUnverified(tensor, chunk, part, dst, dst_box);  // verified since
  {
    // The next part of the hash: copy it in cache-sized batches, hashing each as it lands.
    std::lock_guard<std::mutex> lock(stream->mu);
    if (!stream->done && stream->hashed == begin) {
      FC_RETURN_IF_ERROR(
          CopyRowsHashing(tensor, chunk, stored, part, dst, dst_box, stream->state.get()));
      stream->hashed = end;
      DrainPending(*stream);
      if (stream->hashed == chunk.byte_length) return CompleteStream(*stream);
      return Status::Ok();
    }
  }
  // Out of order: copy without the stream's lock, then hand the packed bytes to the hash.
  FC_RETURN_IF_ERROR(CopyUnverified(tensor, chunk, part, dst, dst_box));
  std::lock_guard<std::mutex> lock(stream->mu);
  if (stream->done || end <= stream->hashed) return Status::Ok();  // hashed already
  std::vector<std::byte> packed(static_cast<size_t>(end - begin));
  {
    std::byte* into = packed.data();
    ForEachRunIn(dst_box, part, esize, [&](size_t offset, size_t bytes) {
      std::memcpy(into, static_cast<const std::byte*>(dst) + offset, bytes);
      into += bytes;
    });
  }
  if (begin > stream->hashed) {
    bool keep = false;
    {
      std::lock_guard<std::mutex> map_lock(mu_);
      if (pending_bytes_ + packed.size() <= reorder_limit_) {
        pending_bytes_ += packed.size();
        pending_peak_ = std::max(pending_peak_, pending_bytes_);
        keep = true;
      }
    }
    if (keep) {
      std::vector<std::byte>& slot = stream->pending[begin];
      const uint64_t freed = std::min(slot.size(), packed.size());  // the shorter goes
      if (slot.size() < packed.size()) slot = std::move(packed);
      std::lock_guard<std::mutex> map_lock(mu_);
      pending_bytes_ -= freed;
      return Status::Ok();
    }
    // Over the reorder limit: hash the gap from the file (read again when its turn comes).
    FC_RETURN_IF_ERROR(HashFromFile(*stream, stream->hashed, begin));
    stream->hashed = begin;
  }
  XXH3_64bits_update(stream->state.get(), packed.data() + (stream->hashed - begin),
                     static_cast<size_t>(end - stream->hashed));
  stream->hashed = end;
  DrainPending(*stream);
  if (stream->hashed == chunk.byte_length) return CompleteStream(*stream);
  return Status::Ok();
}

Status ChunkReader::FinishVerification() {
  std::vector<std::shared_ptr<ChunkStream>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [chunk, stream] : streams_) open.push_back(stream);
  }
  for (const std::shared_ptr<ChunkStream>& stream : open) {
    std::lock_guard<std::mutex> lock(stream->mu);
    if (stream->done) continue;
    if (!NeedsVerification(*stream->chunk)) {  // verified since, by a whole read
      stream->done = true;
      ReleasePending(*stream);
      std::lock_guard<std::mutex> map_lock(mu_);
      streams_.erase(stream->chunk);
      continue;
    }
    // The gaps nobody copied (parts the job does not need) from the file.
    for (;;) {
      DrainPending(*stream);
      const uint64_t to = stream->pending.empty() ? stream->chunk->byte_length
                                                  : stream->pending.begin()->first;
      FC_RETURN_IF_ERROR(HashFromFile(*stream, stream->hashed, to));
      stream->hashed = std::max(stream->hashed, to);
      if (stream->pending.empty()) break;
    }
    FC_RETURN_IF_ERROR(CompleteStream(*stream));
  }
  return Status::Ok();
}

Result<ChunkLocation> ChunkReader::LocateUnlocated(const std::string& key, const Chunk& chunk) {
  const bool in_index = InIndex(chunk);
  if (in_index) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = located_.find(&chunk);
    if (it != located_.end()) return it->second;
  }
  if (chunk.file >= index_.files.size()) {
    return InternalError("file index " + std::to_string(chunk.file) + " out of range");
  }
  FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, File(chunk.file));
  // Two threads may locate the same chunk at once; both get the same answer.
  FC_ASSIGN_OR_RETURN(ChunkLocation loc,
                      LocateTorchDcpChunk(*f, index_.files[chunk.file].path, key, chunk));
  if (!in_index) return loc;
  std::lock_guard<std::mutex> lock(mu_);
  return located_.emplace(&chunk, std::move(loc)).first->second;
}

Result<ChunkLocation> ChunkReader::Locate(const TensorEntry& tensor, const Chunk& chunk) {
  if (!chunk.unlocated_item) {
    return ChunkLocation{chunk.byte_offset, chunk.byte_length, chunk.strides};
  }
  return LocateUnlocated(tensor.key, chunk);
}

Status ChunkReader::ReadChunkBytes(const Chunk& chunk, std::span<std::byte> dst) {
  FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, File(chunk.file));
  uint64_t offset = chunk.byte_offset;
  if (chunk.unlocated_item) {
    // Find the tensor holding this chunk, for the error messages.
    const TensorEntry* owner = nullptr;
    for (const TensorEntry& t : index_.tensors) {
      if (!t.chunks.empty() && &chunk >= t.chunks.data() &&
          &chunk < t.chunks.data() + t.chunks.size()) {
        owner = &t;
      }
    }
    FC_ASSIGN_OR_RETURN(ChunkLocation loc,
                        LocateUnlocated(owner ? owner->key : std::string("?"), chunk));
    offset = loc.byte_offset;
  }
  FC_RETURN_IF_ERROR(ReadStored(*f, chunk, offset, dst));
  std::lock_guard<std::mutex> lock(mu_);
  bytes_read_ += dst.size();
  return Status::Ok();
}

// Copies `piece` (global coordinates, inside `stored_box`) from a packed row-major run that
// holds `stored_box` starting at `stored_byte_offset` of the chunk's file.
Status ChunkReader::CopyBoxPiece(const TensorEntry& tensor, const Chunk& chunk,
                                 const Box& stored_box, uint64_t stored_byte_offset,
                                 const Box& piece, void* dst, const Box& dst_box) {
  const size_t esize = DTypeSize(tensor.dtype);
  FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, File(chunk.file));
  if (piece.rank() == 0) {
    std::span<std::byte> out(static_cast<std::byte*>(dst), esize);
    FC_RETURN_IF_ERROR(ReadStored(*f, chunk, stored_byte_offset, out));
    std::lock_guard<std::mutex> lock(mu_);
    bytes_read_ += esize;
    return Status::Ok();
  }
  // Read the rows (axis 0) of the stored box that the piece touches.
  Box rows = stored_box;
  rows.global_offset[0] = piece.global_offset[0];
  rows.local_shape[0] = piece.local_shape[0];
  const uint64_t rows_offset =
      stored_byte_offset + static_cast<uint64_t>(FirstElementOffset(stored_box, rows)) * esize;
  const uint64_t rows_bytes = static_cast<uint64_t>(rows.num_elements()) * esize;
  // Encoded items are decoded from their start for every read: one read of whole rows,
  // never many small ones.
  const bool encoded = chunk.encoded_item.has_value();
  if (ContiguousIn(stored_box, piece) && ContiguousIn(dst_box, piece)) {
    // The piece is whole rows in the file and one run in dst: read straight into place.
    auto* out = static_cast<std::byte*>(dst) + FirstElementOffset(dst_box, piece) * esize;
    FC_RETURN_IF_ERROR(ReadStored(*f, chunk, rows_offset, std::span<std::byte>(out, rows_bytes)));
  } else if (ContiguousIn(stored_box, piece) && !encoded) {
    // Whole rows in the file, scattered in dst (e.g. a row-parallel TP chunk): let the
    // kernel scatter them straight into place, one iovec per run contiguous in dst.
    std::vector<std::span<std::byte>> buffers;
    auto* base = static_cast<std::byte*>(dst);
    ForEachRunIn(dst_box, piece, esize, [&](size_t offset, size_t bytes) {
      buffers.emplace_back(base + offset, bytes);
    });
    FC_RETURN_IF_ERROR(f->ReadScatteredAt(
        stored_byte_offset + static_cast<uint64_t>(FirstElementOffset(stored_box, piece)) * esize,
        buffers));
  } else {
    // Part of each row. The piece's runs contiguous in the file: its trailing axes that
    // cover the stored box whole, times the first one that does not.
    size_t axis = piece.rank();
    int64_t run = 1;
    while (axis > 0) {
      --axis;
      run *= piece.local_shape[axis];
      if (piece.local_shape[axis] != stored_box.local_shape[axis]) break;
    }
    const uint64_t run_bytes = static_cast<uint64_t>(run) * esize;
    const uint64_t piece_bytes = static_cast<uint64_t>(piece.num_elements()) * esize;
    if (!encoded && run_bytes >= kMinRunBytes && rows_bytes > piece_bytes + piece_bytes / 20) {
      // Runs long enough to read one by one: read only the piece (each needed byte once)
      // instead of whole rows, which for a column-cut target would read the rows again for
      // every column block.
      std::unique_ptr<std::byte[]> packed(new std::byte[piece_bytes]);
      const Shape stored_strides = RowMajorStrides(stored_box.local_shape);
      const int64_t runs = piece.num_elements() / run;
      Shape idx(axis, 0);  // index over the axes before `axis`
      for (int64_t r = 0; r < runs; ++r) {
        int64_t element = 0;
        for (size_t a = 0; a < piece.rank(); ++a) {
          const int64_t i = a < axis ? idx[a] : 0;
          element += (piece.global_offset[a] - stored_box.global_offset[a] + i) * stored_strides[a];
        }
        FC_RETURN_IF_ERROR(f->ReadAt(
            stored_byte_offset + static_cast<uint64_t>(element) * esize,
            std::span<std::byte>(packed.get() + static_cast<uint64_t>(r) * run_bytes, run_bytes)));
        for (size_t a = axis; a-- > 0;) {
          if (++idx[a] < piece.local_shape[a]) break;
          idx[a] = 0;
        }
      }
      CopyRegion(packed.get(), piece, {}, dst, dst_box, piece, esize);
      std::lock_guard<std::mutex> lock(mu_);
      bytes_read_ += piece_bytes;
      return Status::Ok();
    }
    // Not value-initialised: every byte is overwritten by the read.
    std::unique_ptr<std::byte[]> buffer(new std::byte[rows_bytes]);
    FC_RETURN_IF_ERROR(
        ReadStored(*f, chunk, rows_offset, std::span<std::byte>(buffer.get(), rows_bytes)));
    CopyRegion(buffer.get(), rows, {}, dst, dst_box, piece, esize);
  }
  std::lock_guard<std::mutex> lock(mu_);
  bytes_read_ += rows_bytes;
  return Status::Ok();
}

Status ChunkReader::CopyChunkRegion(const TensorEntry& tensor, const Chunk& chunk,
                                    const Box& region, void* dst, const Box& dst_box) {
  if (NeedsVerification(chunk)) {
    std::optional<Box> overlap = Intersect(chunk.box, region);
    if (!overlap || overlap->empty()) return Status::Ok();
    // Checksummed chunks (fc distcp) are packed: row-major, or a flat range of their box.
    if (chunk.unlocated_item || !chunk.strides.empty()) {
      return InternalError(ChunkContext(tensor, chunk) +
                           ": a checksummed chunk must be located and packed");
    }
    if (!Contains(region, chunk.box)) {
      // Parts of the chunk: each overlap with one of its stored boxes. A part that is one run
      // of the chunk's bytes (whole rows, or part of one row) is hashed as copied (in order,
      // or kept until the bytes before them are in); anything else (a column cut over
      // several rows) is verified from the file.
      const size_t esize = DTypeSize(tensor.dtype);
      struct Part {
        Box stored;
        uint64_t element = 0;  // the stored box's first element in the chunk's data
        Box part;
      };
      std::vector<Part> parts;
      bool runs = chunk.box.rank() > 0 && InIndex(chunk) &&
                  chunk.byte_length == static_cast<uint64_t>(chunk.flat_range
                                                                 ? chunk.flat_range->size()
                                                                 : chunk.box.num_elements()) *
                                           esize;
      uint64_t element = 0;
      for (const Box& stored : runs ? StoredBoxes(chunk.box, chunk.flat_range)
                                    : std::vector<Box>{}) {
        std::optional<Box> part = Intersect(stored, region);
        if (part && !part->empty()) {
          if (!OneRunIn(stored, *part)) runs = false;
          parts.push_back({stored, element, *part});
        }
        element += static_cast<uint64_t>(stored.num_elements());
      }
      if (!runs) {
        FC_RETURN_IF_ERROR(VerifyFromFile(tensor, chunk));
        return CopyUnverified(tensor, chunk, region, dst, dst_box);
      }
      for (const Part& p : parts) {
        FC_RETURN_IF_ERROR(CopyPartHashing(tensor, chunk, p.stored, p.element, p.part, dst, dst_box));
      }
      return Status::Ok();
    }
    // The whole chunk: copy, then hash what was copied, in the chunk's byte order.
    Xxh3State state(XXH3_createState());
    if (!state) return ResourceExhaustedError("out of memory for an XXH3 state");
    XXH3_64bits_reset(state.get());
    const size_t esize = DTypeSize(tensor.dtype);
    if (!chunk.flat_range && chunk.box.rank() > 0) {
      FC_RETURN_IF_ERROR(
          CopyRowsHashing(tensor, chunk, chunk.box, chunk.box, dst, dst_box, state.get()));
      FC_RETURN_IF_ERROR(CheckDigest(tensor, chunk, XXH3_64bits_digest(state.get())));
      MarkVerified(chunk);
      return Status::Ok();
    }
    FC_RETURN_IF_ERROR(CopyUnverified(tensor, chunk, region, dst, dst_box));
    const auto* bytes = static_cast<const std::byte*>(dst);
    if (chunk.flat_range) {
      for (Box piece : DecomposeFlatRange(chunk.box.local_shape, *chunk.flat_range)) {
        for (size_t i = 0; i < piece.rank(); ++i) piece.global_offset[i] += chunk.box.global_offset[i];
        HashBoxIn(state.get(), bytes, dst_box, piece, esize);
      }
    } else {
      HashBoxIn(state.get(), bytes, dst_box, chunk.box, esize);
    }
    FC_RETURN_IF_ERROR(CheckDigest(tensor, chunk, XXH3_64bits_digest(state.get())));
    MarkVerified(chunk);
    return Status::Ok();
  }
  return CopyUnverified(tensor, chunk, region, dst, dst_box);
}

Status ChunkReader::CopyUnverified(const TensorEntry& tensor, const Chunk& chunk,
                                   const Box& region, void* dst, const Box& dst_box) {
  const size_t esize = DTypeSize(tensor.dtype);
  // An unlocated chunk (torch DCP) is located once; its region reads then use the place.
  std::optional<ChunkLocation> found;
  if (chunk.unlocated_item) {
    std::optional<Box> overlap = Intersect(chunk.box, region);
    if (!overlap || overlap->empty()) return Status::Ok();
    FC_ASSIGN_OR_RETURN(found, LocateUnlocated(tensor.key, chunk));
  }
  const uint64_t byte_offset = found ? found->byte_offset : chunk.byte_offset;
  const uint64_t byte_length = found ? found->byte_length : chunk.byte_length;
  const Shape& strides = found ? found->strides : chunk.strides;
  if (chunk.flat_range) {
    // The chunk stores a flat range of its box: each decomposed piece is a packed
    // row-major box at a known element offset in the chunk's data.
    int64_t element_offset = 0;
    for (Box piece : DecomposeFlatRange(chunk.box.local_shape, *chunk.flat_range)) {
      for (size_t i = 0; i < piece.rank(); ++i) piece.global_offset[i] += chunk.box.global_offset[i];
      const int64_t piece_elements = piece.num_elements();
      if (auto overlap = Intersect(piece, region)) {
        FC_RETURN_IF_ERROR_WITH(
            CopyBoxPiece(tensor, chunk, piece,
                         byte_offset + static_cast<uint64_t>(element_offset) * esize,
                         *overlap, dst, dst_box),
            ChunkContext(tensor, chunk));
      }
      element_offset += piece_elements;
    }
    return Status::Ok();
  }
  std::optional<Box> overlap = Intersect(chunk.box, region);
  if (!overlap || overlap->empty()) return Status::Ok();
  if (strides.empty()) {
    return CopyBoxPiece(tensor, chunk, chunk.box, byte_offset, *overlap, dst, dst_box)
        .With(ChunkContext(tensor, chunk));
  }
  // Strided (e.g. a transposed torch tensor saved without a copy): read the chunk's whole
  // byte span once and gather with strides. Such chunks are rare and small in practice.
  std::vector<std::byte> buffer(byte_length);
  FC_ASSIGN_OR_RETURN(const RandomAccessFile* f, File(chunk.file));
  FC_RETURN_IF_ERROR_WITH(ReadStored(*f, chunk, byte_offset, std::span<std::byte>(buffer)),
                          ChunkContext(tensor, chunk));
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_read_ += byte_length;
  }
  CopyRegion(buffer.data(), chunk.box, strides, dst, dst_box, *overlap, esize);
  return Status::Ok();
}

}  // namespace fc
