// Where many chunks keep their data, for listings (fc-inspect --json): the exact place of
// every chunk, as ChunkReader::Locate gives it, found with few reads and several threads,
// and not cached (a listing asks once per chunk; a million cached places would be memory
// held for nothing).
//
// Torch DCP chunks are located from their items (LocateTorchDcpChunk: the zip directory and
// data.pkl of each item). Small items that lie close together in one file are read with one
// read per run of them (a run spans at most kRunBytes; items of at most kSmallItemBytes,
// gaps of at most kGapBytes), so a million items of a few hundred bytes cost thousands of
// reads, not millions. Chunks that are located already (every other format) cost nothing.
#ifndef FC_OPS_LOCATE_CHUNKS_H_
#define FC_OPS_LOCATE_CHUNKS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fc/core/status.h"
#include "fc/format/chunk_reader.h"
#include "fc/model/checkpoint_index.h"

namespace fc {

struct ChunkToLocate {
  const std::string* key = nullptr;  // the tensor's key, for errors
  const Chunk* chunk = nullptr;      // a chunk of the index given to LocateChunks
};

inline constexpr uint64_t kSmallItemBytes = 64 << 10;
inline constexpr uint64_t kGapBytes = 64 << 10;
inline constexpr uint64_t kRunBytes = 4 << 20;

// results[i] is where chunks[i] keeps its data, or why it cannot be located (the error
// LocateTorchDcpChunk gives: a corrupt item, a read error), on `threads` threads. Files are
// opened through `files` (its File(); the reader's location cache is not used). A run whose
// read fails locates its chunks one by one, so each gets its own error.
std::vector<Result<ChunkLocation>> LocateChunks(const CheckpointIndex& index,
                                                ChunkReader& files,
                                                std::span<const ChunkToLocate> chunks,
                                                int threads);

}  // namespace fc

#endif  // FC_OPS_LOCATE_CHUNKS_H_
