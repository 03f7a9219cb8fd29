// AOA macro expansion: turns the statements of an AOA file into plain statements
// (statement.h) that use only the primitives.
//
// Passes, in this order; each runs over every statement before the next starts (this is
// the reference's priority order, semantics.md 1.4):
//
//   1. $LAYER_ID_OFFSET  `layers.$LAYER_ID_OFFSET.w -> layers.$LAYER_ID_OFFSET.w`: for each
//      id L found in the source keys, the left side gets L and the right side L-1.
//   2. $LAYER_ID, $EXPERT_ID   expanded from the source keys matching the first name that
//      holds a placeholder (right-hand side in reverse mode). One statement per combination
//      of ids that occurs in the keys, sorted by (EXPERT_ID, LAYER_ID). When no source key
//      matches, the names defined by the statements that run before it are used instead
//      (so `w.$LAYER_ID -> t.$LAYER_ID` can be followed by `t.$LAYER_ID -> ...`).
//   3. name[a:b]          `w[0:3]` becomes `w_0, w_1, w_2`.
//   4. *                  `layers.*.w` becomes every matching key, sorted by the number; names
//                         left of '->' match the left-side keys, names right of it the
//                         right-side keys.
//   5. (bookkeeping)      records which names feed which, so the fused macros can find the
//                         stored tensor behind a temporary name and count its shards.
//   6. ^T                 `X^T -> Y` becomes `X -> X_transpose_tmp, permute="[]"` and
//                         `X_transpose_tmp -> Y`. Only valid left of '->'.
//   7. fused_qkv, fused_qkv_old, fused_ffn  (see man/fc-aoa.7 for the layouts).
//
// "Left-side keys" are the source checkpoint's in forward mode and the destination's in
// reverse mode (the statements are written in the load direction and run backwards); the
// right side is the other one. "Source keys" for the id macros are always the checkpoint
// being read. Optimizer suffixes are stripped before matching.
//
// Differences from the reference, all of them checks it does not make:
//   - a placeholder, '*' or fused statement that matches no key is an error, not a silent
//     empty expansion; id combinations that do not occur in the keys are not generated;
//   - fused_qkv / fused_qkv_old / fused_ffn check that the head counts divide by the shard
//     counts, and that the stored shards are an even split of one axis;
//   - a shard count that cannot be traced to a stored tensor is an error (the reference
//     warns and assumes 1), except on a side without tensors (export: destination degree 1);
//   - `X^T -> Y, fused_ffn` traces X_transpose_tmp back to X (the reference loses it);
//   - in reverse mode `q, k, v -> D, fused_qkv_old` splits q, k and v into heads instead of
//     concatenating them first (whose reverse would be a wrong equal three-way split).
//
// Thread-safety: pure function.
#ifndef FC_AOA_MACROS_H_
#define FC_AOA_MACROS_H_

#include <vector>

#include "fc/aoa/program.h"
#include "fc/aoa/provenance.h"
#include "fc/aoa/statement.h"
#include "fc/aoa/tensor_meta.h"
#include "fc/core/status.h"

namespace fc::aoa {

struct ExpandedStatement {
  Statement statement;
  int node = -1;  // provenance node
};

struct MacroExpansion {
  // In program order, as written (not yet reversed in reverse mode).
  std::vector<ExpandedStatement> statements;
  Provenance provenance;
};

// Expands `program`. `source` is the checkpoint being read (required); `destination` the
// layout being written, or nullptr (export: outputs are the leaves of the dataflow).
// Errors: kInvalidArgument through Provenance::Error (location, statement, macro chain).
Result<MacroExpansion> ExpandMacros(const AoaProgram& program, const TensorDirectory& source,
                                    const TensorDirectory* destination);

}  // namespace fc::aoa

#endif  // FC_AOA_MACROS_H_
