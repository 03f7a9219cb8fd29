// What `fc-inspect CKPT --aoa FILE` shows: the program after macro expansion and the
// tensors it would write, computed from metadata alone (no tensor bytes).
//
// Thread-safety: pure function.
#ifndef FC_AOA_INSPECT_H_
#define FC_AOA_INSPECT_H_

#include <span>
#include <string>
#include <vector>

#include "fc/aoa/engine.h"
#include "fc/aoa/program.h"
#include "fc/aoa/tensor_meta.h"
#include "fc/core/status.h"

namespace fc::aoa {

struct AoaInspection {
  // After macro expansion, in program order and direction as written.
  std::vector<std::string> expanded_statements;
  // As run: equal to expanded_statements, except reversed and swapped in reverse mode.
  std::vector<std::string> executed_statements;
  // The export outputs (dataflow leaves), sorted by key, with final dtypes; with
  // `with_states`, optimizer states too (AoaEngine::ListOutputs).
  std::vector<OutputTensor> outputs;
  std::vector<std::string> warnings;
};

// Runs `program` over `sources` (key, dtype, global shape, chunk boxes) in export mode.
// Errors: as AoaEngine::Create.
Result<AoaInspection> InspectAoa(const AoaProgram& program, std::span<const TensorMeta> sources,
                                 bool with_states = false, const EngineOptions& options = {});

}  // namespace fc::aoa

#endif  // FC_AOA_INSPECT_H_
