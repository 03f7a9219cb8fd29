// --hf-family NAME: gathers the facts fc/aoa/hf_family.h generates a Megatron-Core GPT ->
// HuggingFace AOA program from: the checkpoint's tensors and Megatron args (the
// megatron.args.* attributes of the legacy and torch_dist readers) and DIR/config.json.
#ifndef FC_OPS_HF_FAMILY_H_
#define FC_OPS_HF_FAMILY_H_

#include <string>

#include "fc/aoa/hf_family.h"
#include "fc/core/status.h"
#include "fc/model/checkpoint_index.h"
#include "fc/model/target_layout.h"

namespace fc {

// config.json's fields (fc::aoa::HfTargetConfig) from its text. kInvalidArgument for bad JSON
// or a field of the wrong type, naming `origin`.
Result<aoa::HfTargetConfig> ParseHfConfig(std::string_view json, const std::string& origin);

// The program for `family` over `index` and `config_dir`/config.json. kInvalidArgument when
// config_dir is empty ("--hf-family needs --copy-from DIR") and for the generator's
// mismatches; kNotFound for a missing config.json.
Result<std::string> HfFamilyProgram(const CheckpointIndex& index, const std::string& family,
                                    const std::string& config_dir);

// The HF model directory of an --from-hf-family input: the input itself when it is a
// directory, else the directory holding the input file.
std::string HfDirOfInput(const std::string& input);

// --from-hf-family NAME: the reverse program (HF -> Megatron-Core) over the HF checkpoint
// `index`, `hf_dir`/config.json (the HF model directory: the input itself, or the directory
// holding an input file) and the target's tensors when known (--target-like: its embedding
// rows, its norm names, layer-stacked or per-layer keys; nullptr: per-layer keys, Transformer
// Engine norm names, no vocabulary padding). kNotFound for a missing config.json.
Result<std::string> HfFamilyReverseProgram(const CheckpointIndex& index, const std::string& family,
                                           const std::string& hf_dir,
                                           const std::vector<TargetTensor>* target);

}  // namespace fc

#endif  // FC_OPS_HF_FAMILY_H_
