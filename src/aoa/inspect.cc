#include "fc/aoa/inspect.h"

namespace fc::aoa {

Result<AoaInspection> InspectAoa(const AoaProgram& program, std::span<const TensorMeta> sources,
                                 bool with_states, const EngineOptions& options) {
  FC_ASSIGN_OR_RETURN(AoaEngine engine, AoaEngine::Create(program, sources, std::nullopt, options));
  AoaInspection out;
  out.expanded_statements = engine.ExpandedStatements();
  out.executed_statements = engine.ExecutedStatements();
  out.outputs = engine.ListOutputs(with_states);
  out.warnings = engine.warnings();
  return out;
}

}  // namespace fc::aoa
