// Pre-Core Megatron GPT names as their Megatron-Core counterparts, and back (hf_precore_names.h).
#include "hf_precore_names.h"

#include <cctype>
#include <string_view>

#include "hf_source_model.h"

namespace fc::aoa::hf_family_internal {
namespace {

// Pre-Core Megatron GPT names (megatron/legacy/model, as Megatron-LM saved before
// Megatron-Core, and Megatron-DeepSpeed's GPTModel without a pipeline) for the Megatron-Core
// local-spec names the families map. The tensors are the same: checkpoint_version 3's
// query_key_value is grouped per query group exactly as linear_qkv ([q.. k v] per group),
// and with swiglu dense_h_to_4h is [gate; up] as linear_fc1 (fc's legacy reader merges the
// TP ranks' [gate_r; up_r] into it). Older names first where Megatron renamed (input_norm,
// post_attention_norm, final_norm are the 2023 spellings).
struct PreCoreName {
  const char* pre_core;
  const char* core;
};
constexpr PreCoreName kPreCoreTop[] = {
    {"language_model.embedding.word_embeddings.weight", "embedding.word_embeddings.weight"},
    {"language_model.embedding.position_embeddings.weight", "embedding.position_embeddings.weight"},
    {"language_model.encoder.final_layernorm.weight", "decoder.final_layernorm.weight"},
    {"language_model.encoder.final_layernorm.bias", "decoder.final_layernorm.bias"},
    {"language_model.encoder.final_norm.weight", "decoder.final_layernorm.weight"},
    {"language_model.encoder.final_norm.bias", "decoder.final_layernorm.bias"},
    {"language_model.output_layer.weight", "output_layer.weight"},
};
constexpr PreCoreName kPreCoreLayer[] = {  // after "...layers.<i>."
    {"input_layernorm.weight", "input_layernorm.weight"},
    {"input_layernorm.bias", "input_layernorm.bias"},
    {"input_norm.weight", "input_layernorm.weight"},
    {"input_norm.bias", "input_layernorm.bias"},
    {"self_attention.query_key_value.weight", "self_attention.linear_qkv.weight"},
    {"self_attention.query_key_value.bias", "self_attention.linear_qkv.bias"},
    {"self_attention.dense.weight", "self_attention.linear_proj.weight"},
    {"self_attention.dense.bias", "self_attention.linear_proj.bias"},
    {"post_attention_layernorm.weight", "pre_mlp_layernorm.weight"},
    {"post_attention_layernorm.bias", "pre_mlp_layernorm.bias"},
    {"post_attention_norm.weight", "pre_mlp_layernorm.weight"},
    {"post_attention_norm.bias", "pre_mlp_layernorm.bias"},
    {"mlp.dense_h_to_4h.weight", "mlp.linear_fc1.weight"},
    {"mlp.dense_h_to_4h.bias", "mlp.linear_fc1.bias"},
    {"mlp.dense_4h_to_h.weight", "mlp.linear_fc2.weight"},
    {"mlp.dense_4h_to_h.bias", "mlp.linear_fc2.bias"},
};
constexpr std::string_view kPreCoreLayers = "language_model.encoder.layers.";

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '$' ||
         c == '*' || c == '-';
}

}  // namespace

Result<CoreSpelling> ToCoreNames(const HfSourceFacts& in, const std::string& where) {
  CoreSpelling out;
  out.source.args = in.args;
  std::map<std::string, std::string> core_of;  // core name -> the source name it came from
  for (const HfSourceFacts::Tensor& t : in.tensors) {
    std::string core = t.name;
    for (const PreCoreName& n : kPreCoreTop) {
      if (t.name == n.pre_core) {
        core = n.core;
        out.respell[n.core] = n.pre_core;
      }
    }
    if (t.name.starts_with(kPreCoreLayers)) {
      const std::string rest = t.name.substr(kPreCoreLayers.size());
      const size_t dot = rest.find('.');
      if (dot != std::string::npos && IsDigits(rest.substr(0, dot))) {
        const std::string suffix = rest.substr(dot + 1);
        for (const PreCoreName& n : kPreCoreLayer) {
          if (suffix != n.pre_core) continue;
          core = "decoder.layers." + rest.substr(0, dot + 1) + n.core;
          const std::string macro = std::string("decoder.layers.$LAYER_ID.") + n.core;
          const std::string spelled = std::string(kPreCoreLayers) + "$LAYER_ID." + n.pre_core;
          auto [it, fresh] = out.respell.emplace(macro, spelled);
          if (!fresh && it->second != spelled) {
            return UnimplementedError(where + ": the source spells one tensor two ways in " +
                                      "different layers (" + it->second + ", " + spelled + ")");
          }
        }
      }
    }
    auto [it, fresh] = core_of.emplace(core, t.name);
    if (!fresh) {
      return UnimplementedError(where + ": the source holds both " + it->second + " and " +
                                t.name + " (the same Megatron-Core tensor " + core + ")");
    }
    if (core != t.name) out.source_name[core] = t.name;
    out.source.tensors.push_back({core, t.shape});
  }
  return out;
}

std::string Respell(const std::string& program, const std::map<std::string, std::string>& respell) {
  std::string out;
  size_t i = 0;
  bool line_start = true, comment = false;
  while (i < program.size()) {
    const char c = program[i];
    if (c == '\n') {
      out += c;
      ++i;
      line_start = true;
      comment = false;
      continue;
    }
    if (line_start && c == '#') comment = true;
    line_start = false;
    if (comment || !IsNameChar(c)) {
      out += c;
      ++i;
      continue;
    }
    size_t end = i;
    while (end < program.size() && IsNameChar(program[end])) ++end;
    const std::string word = program.substr(i, end - i);
    auto it = respell.find(word);
    out += it == respell.end() ? word : it->second;
    i = end;
  }
  return out;
}

}  // namespace fc::aoa::hf_family_internal
