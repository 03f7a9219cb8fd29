// Megatron state-dict names: dotted components, the tensor-parallel role a name has (the
// built-in table of include/fc/format/megatron.h), where its layer and expert numbers are,
// and the flattening of a rank's nested state dict into its tensors. Pure.
#ifndef FC_SRC_FORMAT_MEGATRON_PARAM_NAMES_H_
#define FC_SRC_FORMAT_MEGATRON_PARAM_NAMES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/status.h"
#include "src/format/megatron/rank_file.h"

namespace fc::megatron_internal {

// A decimal number of at most 12 digits, the whole of `s`.
bool ParseUint(std::string_view s, int64_t* out);

// "a.b.c" -> {"a", "b", "c"}, and back (Join puts the dots).
std::vector<std::string_view> Split(std::string_view s, char sep);
std::string Join(const std::vector<std::string_view>& parts);

// The role of a param in tensor parallelism (the built-in table of megatron.h).
enum class Role { kColumn, kRow, kReplicated, kUnknown };

struct RoleInfo {
  Role role = Role::kUnknown;
  bool gated = false;  // linear_fc1 / dense_h_to_4h: two halves per rank with SwiGLU
  size_t axis = 0;     // kColumn / kRow: the dim the ranks' pieces are concatenated along
};

RoleInfo RoleOf(std::string_view name);

// Position of the local layer number in `parts` (the component after the first "layers").
std::optional<size_t> LayerComponent(const std::vector<std::string_view>& parts);

// The local expert number of an expert tensor: component index and, for a TEGroupedMLP
// param (weightI / biasI), the length of its non-digit stem.
struct ExpertPos {
  size_t component = 0;
  size_t stem = 0;  // 0: the whole component is the number (local_experts.I)
  int64_t local = 0;
};

std::optional<ExpertPos> ExpertOf(const std::vector<std::string_view>& parts);

// One state-dict tensor of one rank file.
struct Piece {
  std::string name;  // as saved (local layer and expert numbers)
  const PV* value = nullptr;
};

// Flattens a (possibly nested) state dict into tensors; counts what is skipped. Errors:
// kDataLoss past 16 levels, kResourceExhausted past 4M dicts and entries walked (a dict
// shared through the pickle memo is walked once per reference).
Status FlattenStateDict(const RankFile& f, const PV& dict, const std::string& prefix, int depth,
                        std::vector<Piece>* out, int64_t* skipped);

bool IsExpertPiece(const Piece& pc);

// The word embedding and output layer weights (Megatron's is_embedding_or_output_parameter,
// and the params it marks shared_embedding when tied embeddings span a pipeline; pre-Core
// models name the last stage's copy word_embeddings_for_head).
bool IsEmbeddingOrOutput(std::string_view name);

}  // namespace fc::megatron_internal

#endif  // FC_SRC_FORMAT_MEGATRON_PARAM_NAMES_H_
