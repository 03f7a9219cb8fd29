// TargetLayout (model type): where every piece of every tensor goes in the checkpoint fc-convert writes:
// per target rank, the list of chunks that rank's file(s) hold. Pure data; produced from an
// existing checkpoint (--target-like, fc/layout/target_layout.h LayoutFromIndex), from degrees + rules
// (--target-layout FILE.json, --preset NAME: see fc/layout/layout_rules.h), or read back
// from a manifest (--target-manifest, fc/layout/target_layout.h ParseManifest).
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
#ifndef FC_MODEL_TARGET_LAYOUT_H_
#define FC_MODEL_TARGET_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/flat_range.h"
#include "fc/core/status.h"
#include "fc/model/key_lookup.h"

namespace fc {

struct TargetTensor {
  std::string key;
  std::optional<DType> dtype;  // unset: keep the source's (or the AOA program's) dtype
  Shape global_shape;

  friend bool operator==(const TargetTensor&, const TargetTensor&) = default;
};

struct TargetChunk {
  std::string key;                       // a TargetTensor key
  Box box;                               // global coordinates
  std::optional<FlatRange> flat_range;   // over the box's row-major flattening
  int64_t replica_id = 0;                // > 0: a copy the target format stores per rank

  // Elements actually stored: the flat range's size, or the box's element count.
  int64_t stored_elements() const {
    return flat_range ? flat_range->size() : box.num_elements();
  }
  friend bool operator==(const TargetChunk&, const TargetChunk&) = default;
};

struct TargetRank {
  int64_t rank = 0;
  std::vector<TargetChunk> chunks;       // in the order the rank's file stores them

  friend bool operator==(const TargetRank&, const TargetRank&) = default;
};

struct TargetLayout {
  std::vector<TargetTensor> tensors;     // unique keys
  std::vector<TargetRank> ranks;         // sorted by rank, unique

  // The tensor named `key`, or nullptr. O(1) on average (see fc/model/key_lookup.h);
  // concurrent lookups are safe, a lookup concurrent with a change of `tensors` is not.
  const TargetTensor* FindTensor(std::string_view key) const;
  KeyLookupCache tensor_lookup;  // FindTensor's cache; not part of the value (always ==)
  friend bool operator==(const TargetLayout&, const TargetLayout&) = default;
};

// Checks a layout (kInvalidArgument naming tensor, rank and box): unique keys and ranks,
// every chunk's key declared, boxes inside their tensors (ValidateBox), flat ranges inside
// their boxes, and the replica-0 chunks of each tensor storing every element exactly once.
// Errors, all kInvalidArgument:
//   "tensor 'k': duplicate key" / "tensor 'k': box [..] of tensor shape (..): <reason>"
//   "rank 3: ranks must be sorted, unique and >= 0 (previous 3)"
//   "rank 3: chunk of undeclared tensor 'k'"
//   "rank 3: tensor 'k': box [..] of tensor shape (..): <reason>" (box outside the tensor)
//   "rank 3: tensor 'k' box [..]: flat range [a, b) is not within [0, n)" (and for a
//     negative replica_id)
//   "tensor 'k': replica-0 chunks overlap: rank 0 box [..] and rank 1 box [..]"
//   "tensor 'k': replica-0 chunks store 12 of 16 elements; missing e.g. [..]"
Status ValidateTargetLayout(const TargetLayout& layout);

}  // namespace fc

#endif  // FC_MODEL_TARGET_LAYOUT_H_
