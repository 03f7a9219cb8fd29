// AoaEngine: runs an AOA program over tensor metadata and answers, for any box of any
// target tensor, exactly which source blocks (and which postprocess ops) fill it.
//
// Pure computation on metadata: no IO, no tensor bytes, no MPI. Typical use:
//
//   FC_ASSIGN_OR_RETURN(AoaProgram program, ParseAoaProgram(text, path));
//   FC_ASSIGN_OR_RETURN(AoaEngine engine, AoaEngine::Create(program, sources));   // export
//   for (const OutputTensor& out : engine.ListOutputs(/*with_states=*/false)) {
//     FC_ASSIGN_OR_RETURN(auto pieces,
//                         engine.FindShardSources(out.key, Box::Whole(out.shape)));
//     ...  // read each piece.source_box, apply piece.ops, write piece.target_box
//   }
//
// Modes.
//   - Export (no destination): the outputs are the leaves of the dataflow graph: every
//     variable no later statement consumes, plus every source tensor no statement touches
//     (except those removed with `name -> _`).
//   - Convert (destination given): the outputs are the destination tensors. Each must be
//     produced by a statement, be a source tensor of the same name (passed through), or be
//     declared with `_ -> name` (nothing to load). Output dtypes must equal the declared
//     ones (a dtype change needs a cast statement); shapes must have the declared rank and
//     element count (a same-size different shape only warns, as the reference allows).
//
// Reverse mode (AoaProgram::reverse): the statements are written in the load direction
// (e.g. HF -> framework) and run backwards: the list is reversed, each statement's sides
// are swapped (split <-> merge, add <-> remove), permutations are inverted,
// src_dtype/dst_dtype swap, and `dtype=` is an error. `sources` is then the framework
// checkpoint and `destination` (if any) the HF layout.
//
// Optimizer states: a target key "<model key><suffix>" (tensor_meta.h StateSuffixes) maps
// like its model key, with the suffix appended to every source key. States keep their own
// stored dtype (the statements' casts are for parameters); when the destination declares a
// different dtype for the state, a Cast to it is appended. Scalar suffixes return one
// mapping copying that suffix's tensor from the first source of the parameter.
//
// Primitives, attributes, macros, extensions and errors: man/fc-aoa.7.
//
// Thread-safety: immutable after Create; const methods may run concurrently.
#ifndef FC_AOA_ENGINE_H_
#define FC_AOA_ENGINE_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fc/aoa/program.h"
#include "fc/aoa/shard_mapping.h"
#include "fc/aoa/tensor_meta.h"
#include "fc/core/box.h"
#include "fc/core/dtype.h"
#include "fc/core/status.h"

namespace fc::aoa {

struct EngineOptions {
  StateSuffixes state_suffixes;
};

struct OutputTensor {
  std::string key;
  Shape shape;
  DType dtype = DType::kFloat32;  // final element type (after the statements' casts)
  // False for a destination tensor declared with `_ -> key` (no shape) or removed: nothing
  // is loaded into it (FindShardSources returns an empty list).
  bool has_data = true;

  friend bool operator==(const OutputTensor&, const OutputTensor&) = default;
};

class AoaEngine {
 public:
  // Expands the macros and runs every statement. `sources`: the checkpoint being read
  // (every dtype set, keys unique). `destination`: the layout being written, or nullopt for
  // export. Both are copied.
  // Errors: kInvalidArgument for a bad program or metadata; messages of statement errors
  // name the file and line, the statement as written and the macro chain (provenance.h).
  static Result<AoaEngine> Create(const AoaProgram& program, std::span<const TensorMeta> sources,
                                  std::optional<std::span<const TensorMeta>> destination =
                                      std::nullopt,
                                  const EngineOptions& options = {});

  AoaEngine(AoaEngine&&) noexcept;
  AoaEngine& operator=(AoaEngine&&) noexcept;
  ~AoaEngine();

  // The mappings that fill `target_box` of target `target_key` (a model key, or a model key
  // plus an optimizer suffix). Entries follow the variable's slice order and are not
  // coalesced. An empty list means nothing to load.
  // Errors: kNotFound for an unknown target, or a state the source lacks;
  //         kInvalidArgument for a box of the wrong rank or outside the target's shape.
  Result<std::vector<ShardMapping>> FindShardSources(std::string_view target_key,
                                                     const Box& target_box) const;

  // The output tensors, sorted by key. Export: the leaves whose sources are all stored; with
  // `with_states`, also "<key><suffix>" for each state suffix every source of the key has
  // (and each scalar suffix any source has). Convert: the destination's model tensors.
  std::vector<OutputTensor> ListOutputs(bool with_states = false) const;

  // One output (model or state key). Errors: kNotFound.
  Result<OutputTensor> Output(std::string_view key) const;

  // The statements after macro expansion, in program order and as written.
  std::vector<std::string> ExpandedStatements() const;
  // The statements the engine ran (reversed and swapped in reverse mode).
  std::vector<std::string> ExecutedStatements() const;
  // Non-fatal findings (e.g. a destination shape that differs from the produced one with
  // the same element count; a variable produced but never written in convert mode).
  const std::vector<std::string>& warnings() const;

 private:
  struct Impl;
  explicit AoaEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fc::aoa

#endif  // FC_AOA_ENGINE_H_
