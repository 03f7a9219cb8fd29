// Parts of a chunk along one dim that still address the same bytes: how a TP merge narrows
// or moves chunks without touching data. A flattened-range chunk stays one along dim 0 (a
// sub-range); along another dim it becomes strided blocks.
#ifndef FC_SRC_FORMAT_DEEPSPEED_CHUNK_SLICES_H_
#define FC_SRC_FORMAT_DEEPSPEED_CHUNK_SLICES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "fc/model/checkpoint_index.h"

namespace fc::deepspeed_internal {

// The part of `c` (a chunk of a tensor of rank >= 1) that lies in rows [lo, hi) of dim 0,
// still addressing the same bytes; nullopt when nothing does. `item`: the dtype's size.
std::optional<Chunk> RowSlice(const Chunk& c, int64_t lo, int64_t hi, size_t item);

// The parts of `c` lying in [lo, hi) along dim `d` of the tensor, still addressing the same
// bytes, appended to `out`. Dim 0 keeps the chunk's form (RowSlice); another dim makes it
// strided (a flattened range first becomes its strided blocks).
void AxisSlice(const Chunk& c, size_t d, int64_t lo, int64_t hi, size_t item,
               std::vector<Chunk>* out);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_CHUNK_SLICES_H_
