// Internal to --hf-family (not installed API): pre-Core Megatron GPT names (language_model.*,
// as Megatron-LM saved before Megatron-Core, and Megatron-DeepSpeed's GPTModel without a
// pipeline) read as their Megatron-Core counterparts, and the generated program spelled back
// in the source's names. Pure: no IO.
#ifndef FC_SRC_AOA_HF_PRECORE_NAMES_H_
#define FC_SRC_AOA_HF_PRECORE_NAMES_H_

#include <map>
#include <string>

#include "fc/aoa/hf_family.h"
#include "fc/core/status.h"

namespace fc::aoa::hf_family_internal {

// The source with pre-Core names given their Megatron-Core names, and the program
// identifiers to spell back (core -> pre-Core, per-layer names with $LAYER_ID). Names that
// are neither stay as they are (the generator names them in its refusal).
struct CoreSpelling {
  HfSourceFacts source;
  std::map<std::string, std::string> respell;
  std::map<std::string, std::string> source_name;  // core name -> the source's, renamed only
};

// Errors (kUnimplemented, after `where`): one tensor spelled two ways in different layers, or
// two source tensors naming the same Megatron-Core tensor.
Result<CoreSpelling> ToCoreNames(const HfSourceFacts& in, const std::string& where);

// `program` with every identifier in `respell` replaced, comment lines left as they are.
std::string Respell(const std::string& program, const std::map<std::string, std::string>& respell);

}  // namespace fc::aoa::hf_family_internal

#endif  // FC_SRC_AOA_HF_PRECORE_NAMES_H_
