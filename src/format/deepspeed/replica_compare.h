// Comparing the TP copies of a tensor that must be equal (replicated params, module
// buffers) element by element, as torch.equal does, through the chunks an export reads.
#ifndef FC_SRC_FORMAT_DEEPSPEED_REPLICA_COMPARE_H_
#define FC_SRC_FORMAT_DEEPSPEED_REPLICA_COMPARE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fc/core/status.h"
#include "fc/format/chunk_reader.h"
#include "fc/model/checkpoint_index.h"

namespace fc::deepspeed_internal {

// The first element where a TP copy of a replicated tensor differs from TP rank 0's.
struct ReplicaDifference {
  size_t rank = 0;      // the TP rank whose copy differs
  int64_t element = 0;  // row-major index in the tensor
  std::string value0, value;  // the two elements as text: value (and bit pattern for floats)
};

// The TP copies `parts` of one tensor (equal dtype and shape) compared element by element,
// read through their chunks (flattened ranges, strides) in pieces of at most `max_piece_bytes`
// per copy (a strided copy is read whole): the first difference from TP rank 0's copy, or
// nullopt. Equal: equal bytes, or floats of equal value (+0 and -0). Errors: reading's.
Result<std::optional<ReplicaDifference>> FirstReplicaDifference(
    const std::vector<TensorEntry*>& parts, uint64_t max_piece_bytes, ChunkReader& reader);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_REPLICA_COMPARE_H_
