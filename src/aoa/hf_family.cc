// --hf-family: the Megatron-Core GPT -> HuggingFace AOA program from facts (fc/aoa/hf_family.h):
// the family's name checked, pre-Core names respelled around the family's generator
// (hf_family_gpt2.cc, hf_family_llama.cc). The reverse is hf_family_reverse.cc.
#include "fc/aoa/hf_family.h"

#include <algorithm>

#include "hf_family_forward.h"
#include "hf_precore_names.h"

namespace fc::aoa {

using hf_family_internal::CoreSpelling;
using hf_family_internal::Gpt2Program;
using hf_family_internal::LlamaLikeProgram;
using hf_family_internal::Respell;
using hf_family_internal::ToCoreNames;

const std::vector<std::string_view>& HfFamilyNames() {
  static const std::vector<std::string_view> kNames = {"gpt2", "llama", "mixtral", "qwen2",
                                                       "qwen2-moe"};
  return kNames;
}

namespace {

// The program over Megatron-Core names (GenerateHfFamilyProgram respells pre-Core sources).
Result<std::string> CoreFamilyProgram(std::string_view family, const HfSourceFacts& source,
                                      const HfTargetConfig& cfg) {
  const auto& names = HfFamilyNames();
  if (std::find(names.begin(), names.end(), family) == names.end()) {
    std::string known;
    for (std::string_view n : names) known += (known.empty() ? "" : ", ") + std::string(n);
    return InvalidArgumentError("--hf-family " + std::string(family) + ": unknown family (known: " +
                                known + ")");
  }
  const std::string fam(family);
  if (fam == "gpt2") return Gpt2Program(source, cfg);
  return LlamaLikeProgram(fam, source, cfg);
}

}  // namespace

Result<std::string> GenerateHfFamilyProgram(std::string_view family, const HfSourceFacts& source,
                                            const HfTargetConfig& cfg) {
  const std::string where = "--hf-family " + std::string(family);
  FC_ASSIGN_OR_RETURN(CoreSpelling core, ToCoreNames(source, where));
  Result<std::string> program = CoreFamilyProgram(family, core.source, cfg);
  if (core.respell.empty()) return program;
  if (!program.ok()) {
    // name the source's tensors as the source spells them
    return Status(program.status().code(),
                  Respell(program.status().message(), core.source_name));
  }
  std::string text = Respell(*program, core.respell);
  const size_t first_line = text.find('\n') + 1;
  return text.insert(first_line,
                     "# the source's names are pre-Core Megatron's (language_model.*), mapped as "
                     "their\n# Megatron-Core counterparts (query_key_value as linear_qkv, ...)\n");
}

}  // namespace fc::aoa
