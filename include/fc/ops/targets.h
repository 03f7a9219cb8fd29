// The tensors a tool produces from a checkpoint, each described by the source pieces that
// fill it: identities when there is no AOA program, the AOA engine's mapping otherwise.
#ifndef FC_OPS_TARGETS_H_
#define FC_OPS_TARGETS_H_

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "fc/aoa/engine.h"
#include "fc/core/status.h"
#include "fc/exec/assemble.h"
#include "fc/model/checkpoint_index.h"
#include "fc/layout/target_layout.h"

namespace fc {

struct OutputTensor {
  std::string name;
  DType dtype = DType::kFloat32;  // after the program's casts (before any --dtype)
  Shape shape;
  std::vector<SourcePiece> pieces;  // dst boxes tile the whole tensor
};

// One output per tensor of `index`, same name, dtype and shape, one identity piece each.
std::vector<OutputTensor> IdentityOutputs(const CheckpointIndex& index);

// The leaves of the AOA program in `aoa_text` (line form or JSON) applied to `index`, with
// pieces from the engine. `origin` names the program in messages (e.g. the file path).
// Errors: kInvalidArgument for program errors (with statement, line and macro chain),
// kNotFound for names that do not exist.
Result<std::vector<OutputTensor>> AoaOutputs(const CheckpointIndex& index,
                                             const std::string& aoa_text,
                                             const std::string& origin);

// The engine's mappings for the whole of `out`, as SourcePieces whose sources `resolve`
// finds by the engine's source key (nullptr: not held; an error naming both keys).
Result<OutputTensor> OutputFromEngine(
    const aoa::AoaEngine& engine, const aoa::OutputTensor& out,
    const std::function<const TensorEntry*(const std::string&)>& resolve);

// Convert mode: one output per tensor of `layout` (in layout order), filled by the program's
// mappings; tensors declared with `_ -> key` become zeros. Errors as AoaOutputs, plus those
// of the engine's destination checks (dtype change without a cast, shape mismatch).
Result<std::vector<OutputTensor>> AoaConvertOutputs(const CheckpointIndex& index,
                                                    const std::string& aoa_text,
                                                    const std::string& origin,
                                                    const TargetLayout& layout);

// Prints what the AOA program makes of `index` without reading tensor bytes: the statements
// after macro expansion and the output tensors (name, dtype, shape), as text or JSON.
Status WriteAoaPreview(const CheckpointIndex& index, const std::string& aoa_text,
                       const std::string& origin, bool json, std::ostream& out);

}  // namespace fc

#endif  // FC_OPS_TARGETS_H_
