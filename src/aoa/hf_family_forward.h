// Internal to --hf-family (not installed API): the Megatron-Core GPT -> HuggingFace program of
// each family over Megatron-Core names (GenerateHfFamilyProgram checks the family's name and
// respells pre-Core sources around them). Pure: no IO.
#ifndef FC_SRC_AOA_HF_FAMILY_FORWARD_H_
#define FC_SRC_AOA_HF_FAMILY_FORWARD_H_

#include <string>

#include "fc/aoa/hf_family.h"
#include "fc/core/status.h"

namespace fc::aoa::hf_family_internal {

// Family gpt2 (hf_family_gpt2.cc): learned absolute positions, LayerNorm with bias, biased
// linears, GeLU, HF Conv1D weights ([in, out]: Megatron's transposed), c_attn = [q; k; v].
Result<std::string> Gpt2Program(const HfSourceFacts& source, const HfTargetConfig& cfg);

// The Llama-like families (hf_family_llama.cc): "llama", "qwen2", "mixtral", "qwen2-moe"
// (`fam`, already known to be one of them): fused query-group QKV, SwiGLU MLP or MoE layers,
// RMSNorm.
Result<std::string> LlamaLikeProgram(const std::string& fam, const HfSourceFacts& source,
                                     const HfTargetConfig& cfg);

}  // namespace fc::aoa::hf_family_internal

#endif  // FC_SRC_AOA_HF_FAMILY_FORWARD_H_
