// Producing a TargetLayout (fc/model/target_layout.h): from an
// existing checkpoint (--target-like, LayoutFromIndex below), from degrees + rules
// (--target-layout FILE.json, --preset NAME: see fc/layout/layout_rules.h), or read back
// from a manifest (--target-manifest, ParseManifest below).
//
// Invariants of a valid layout (ValidateTargetLayout checks them):
//   - tensor keys are unique; every chunk names a declared tensor;
//   - ranks are sorted by rank, unique and >= 0; a rank may hold no chunk (it still exists
//     in the target world);
//   - every box lies inside its tensor; a flat range lies inside its box's row-major
//     flattening;
//   - per tensor, the chunks with replica_id 0 store every element exactly once (a flat
//     chunk stores only the elements of its range). Chunks with replica_id > 0 are extra
//     copies that a target format keeps per rank (e.g. a TP-replicated layernorm written by
//     every TP rank); they are never needed to cover the tensor.
//
// The manifest (ManifestJson / ParseManifest) is this structure as JSON; man/fc-layout.5
// documents it member by member.
//
// Thread-safety: plain values and pure functions.
#ifndef FC_LAYOUT_TARGET_LAYOUT_H_
#define FC_LAYOUT_TARGET_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/flat_range.h"
#include "fc/core/status.h"
#include "fc/model/target_layout.h"

namespace fc {

struct CheckpointIndex;  // fc/model/checkpoint_index.h



// --target-like: the chunk layout of an existing checkpoint (metadata only).
//   - tensors: every tensor of the index, in index order, with its dtype (set) and shape;
//   - a chunk's rank comes from its file's name (the last path component):
//     "__R_N.distcp" (torch DCP) or "R_N.distcp" (fc distcp, Paddle) give rank R; every
//     chunk of a safetensors checkpoint is rank 0;
//   - boxes, flat ranges and replica ids are carried unchanged;
//   - per rank, chunks are in index order (tensor order, then the tensor's chunk order);
//   - ranks 0 .. max rank are all listed (a rank with no chunk has an empty list), so the
//     target world size is the source's largest rank + 1.
// The result is validated (ValidateTargetLayout). Errors: kInvalidArgument for a file name
// that carries no rank ("file 'x.bin': cannot tell the rank from the name ..."), a chunk
// whose file index is out of range, or a layout that fails validation (e.g. an index whose
// replica-0 chunks overlap).
Result<TargetLayout> LayoutFromIndex(const CheckpointIndex& index);

// The rank encoded in a data file name (see LayoutFromIndex), or nullopt.
// "__3_0.distcp" -> 3, "dir/12_1.distcp" -> 12, "model.safetensors" -> nullopt.
std::optional<int64_t> RankFromFileName(std::string_view path);

// The tensors of a source checkpoint as a target tensor list for LayoutFromRules: keys and
// shapes in index order, dtype unset (keep the source's).
std::vector<TargetTensor> TargetTensorsFromIndex(const CheckpointIndex& index);

// The manifest JSON text of `layout` (schema in man/fc-layout.5): pretty-printed with one
// tensor or chunk per line. Deterministic: equal layouts give equal bytes.
//   {"format": "fc-layout-manifest", "version": 1,
//    "tensors": [{"key": "w", "dtype": "bfloat16", "global_shape": [4, 8]}, ...],
//    "ranks": [{"rank": 0, "chunks": [{"key": "w", "global_offset": [0, 0],
//               "local_shape": [2, 8], "flattened_range": null, "replica_id": 0}, ...]}, ...]}
// "dtype" is omitted for a tensor whose dtype is unset. Precondition: keys are valid UTF-8.
std::string ManifestJson(const TargetLayout& layout);

// Parses a manifest and validates the layout (ValidateTargetLayout).
// ParseManifest(ManifestJson(l)) == l for every valid layout `l`. Unknown members are
// ignored (forward compatibility); "dtype" may be absent or null.
// Errors: kInvalidArgument for invalid JSON, a missing or mistyped member ("manifest:
// ranks[2].chunks[0]: 'local_shape' must be an array of non-negative integers"), a wrong
// "format", or a layout that fails validation; kUnimplemented for a "version" above 1.
Result<TargetLayout> ParseManifest(std::string_view json);

}  // namespace fc

#endif  // FC_LAYOUT_TARGET_LAYOUT_H_
