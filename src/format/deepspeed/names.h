// DeepSpeed's names: what a file in a tag dir is (after DeepSpeed's checkpoint naming
// functions), the tag a save dir's `latest` names, Universal Checkpoint dirs, and the names
// of MoE expert params. Pure except HasStateFiles / LatestTag / IsUniversalDir, which list or
// read the dir.
#ifndef FC_SRC_FORMAT_DEEPSPEED_NAMES_H_
#define FC_SRC_FORMAT_DEEPSPEED_NAMES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fc/core/status.h"

namespace fc::deepspeed_internal {

enum class FileKind {
  kModelMp, kModelZero3, kOptim, kPipelineLayer, kExpert, kExpertOptim, kOther
};

struct NameInfo {
  FileKind kind = FileKind::kOther;
  int64_t dp = 0, mp = 0;
  int64_t layer = 0;  // kPipelineLayer: the global layer index
};

// Names, after DeepSpeed's checkpoint naming functions:
//   layer_XX-model_YY-model_states.pt, layer_XX-model_states.pt (no model axis: TP rank 0)
//                                          PipelineModule.ckpt_layer_path
//   layer_L_expert_E_mp_rank_XX_model_states.pt   MoE layer L's global expert E (dp carries E)
//   mp_rank_XX_model_states.pt | [bf16_|fp16_]zero_pp_rank_N_mp_rank_XX_{model,optim}_states.pt
//   expp_rank_*_optim_states.pt                   MoE optimizer states (not read)
// Ranks and layers of 1e9 and more are not a DeepSpeed file (kOther).
NameInfo ClassifyName(std::string_view n);

// "mp_rank_XX": a model-parallel rank as DeepSpeed names it (two digits at least).
std::string MpName(int64_t mp);

// True when `dir` holds model or optimizer states files (mp_rank_*, zero_pp_rank_*).
bool HasStateFiles(const std::string& dir);

// The tag named by <dir>/<file> (latest, latest_universal), if that file exists.
// Errors: kDataLoss when its text is not a tag directory name; reading errors.
Result<std::optional<std::string>> LatestTag(const std::string& dir, const std::string& file);

// A Universal Checkpoint dir: zero/ beside optimizer_state.pt or model states.
bool IsUniversalDir(const std::string& dir);

// An expert param's name: <prefix>deepspeed_experts.<id>.<rest> (deepspeed.moe's Experts
// module); the prefix ends after "deepspeed_experts.".
struct ExpertName {
  std::string prefix, rest;  // rest starts with '.'
  int64_t id = 0;
};
std::optional<ExpertName> ParseExpertName(const std::string& name);

}  // namespace fc::deepspeed_internal

#endif  // FC_SRC_FORMAT_DEEPSPEED_NAMES_H_
