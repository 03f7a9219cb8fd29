#include "fc/ops/locate_chunks.h"

#include <algorithm>
#include <tuple>

#include "fc/exec/parallel.h"
#include "fc/format/torch_dcp.h"
#include "fc/format/torch_save.h"

namespace fc {
namespace {

// Chunks [begin, end) of the sorted order, and the file bytes [read_begin, read_end) that
// hold all their items (read_end == read_begin: located one by one through the file).
struct Run {
  size_t begin = 0, end = 0;
  uint64_t read_begin = 0, read_end = 0;
};

bool Prefetchable(const Chunk& c, uint64_t file_size) {
  return c.unlocated_item && !c.encoded_item && c.byte_length <= kSmallItemBytes &&
         c.byte_offset <= file_size && c.byte_length <= file_size - c.byte_offset;
}

}  // namespace

std::vector<Result<ChunkLocation>> LocateChunks(const CheckpointIndex& index,
                                                ChunkReader& files,
                                                std::span<const ChunkToLocate> chunks,
                                                int threads) {
  // Every entry is assigned below (located chunks here, the rest by their run).
  std::vector<Result<ChunkLocation>> results(chunks.size(), ChunkLocation{});
  // Located chunks answer from the index; the rest are sorted by file and item offset.
  std::vector<size_t> order;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = *chunks[i].chunk;
    if (!c.unlocated_item) {
      results[i] = ChunkLocation{c.byte_offset, c.byte_length, c.strides};
    } else {
      order.push_back(i);
    }
  }
  if (order.empty()) return results;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Chunk& x = *chunks[a].chunk;
    const Chunk& y = *chunks[b].chunk;
    return std::tie(x.file, x.byte_offset, a) < std::tie(y.file, y.byte_offset, b);
  });
  // Runs of small items close together in one file. A file's size comes from the index (its
  // size when listed); the read itself checks the file as it is.
  std::vector<Run> runs;
  for (size_t k = 0; k < order.size(); ++k) {
    const Chunk& c = *chunks[order[k]].chunk;
    const uint64_t file_size = c.file < index.files.size() ? index.files[c.file].size : 0;
    const bool small = Prefetchable(c, file_size);
    if (!runs.empty() && small) {
      Run& r = runs.back();
      const Chunk& prev = *chunks[order[r.end - 1]].chunk;
      const uint64_t end = c.byte_offset + c.byte_length;
      if (r.read_end > r.read_begin && prev.file == c.file &&
          c.byte_offset <= r.read_end + kGapBytes && end - r.read_begin <= kRunBytes) {
        r.end = k + 1;
        r.read_end = std::max(r.read_end, end);
        continue;
      }
    }
    Run r{k, k + 1, c.byte_offset, c.byte_offset};
    if (small) r.read_end = c.byte_offset + c.byte_length;
    runs.push_back(r);
  }
  std::vector<std::vector<std::byte>> buffers(static_cast<size_t>(std::max(threads, 1)));
  std::vector<TorchTensorRefCache> refs(buffers.size());
  // Tasks never fail: each chunk's outcome is its result.
  (void)ParallelFor(runs.size(), std::max(threads, 1), [&](size_t n, int worker) -> Status {
    const Run& r = runs[n];
    const uint32_t file_id = chunks[order[r.begin]].chunk->file;
    Result<const RandomAccessFile*> file = files.File(file_id);
    if (!file.ok()) {
      for (size_t k = r.begin; k < r.end; ++k) results[order[k]] = file.status();
      return Status::Ok();
    }
    std::span<const std::byte> bytes;
    if (r.read_end > r.read_begin) {
      std::vector<std::byte>& buffer = buffers[static_cast<size_t>(worker)];
      buffer.resize(static_cast<size_t>(r.read_end - r.read_begin));
      // A failed read (the file shrank) leaves `bytes` empty: each chunk then reads for
      // itself and reports its own error.
      if ((*file)->ReadAt(r.read_begin, buffer).ok()) bytes = buffer;
    }
    for (size_t k = r.begin; k < r.end; ++k) {
      const ChunkToLocate& ref = chunks[order[k]];
      std::span<const std::byte> prefix;
      if (!bytes.empty()) {
        prefix = bytes.subspan(static_cast<size_t>(ref.chunk->byte_offset - r.read_begin),
                               static_cast<size_t>(ref.chunk->byte_length));
      }
      results[order[k]] = LocateTorchDcpChunk(**file, index.files[file_id].path, *ref.key,
                                              *ref.chunk, prefix,
                                              &refs[static_cast<size_t>(worker)]);
    }
    return Status::Ok();
  });
  return results;
}

}  // namespace fc
