// --hf-family: the facts of the checkpoint and of config.json (fc/ops/hf_family.h).
#include "fc/ops/hf_family.h"

#include <simdjson.h>

#include "fc/io/file.h"

namespace fc {

Result<aoa::HfTargetConfig> ParseHfConfig(std::string_view json, const std::string& origin) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto e = parser.parse(json.data(), json.size(), true).get(root); e) {
    return InvalidArgumentError(origin + ": invalid JSON: " + simdjson::error_message(e));
  }
  simdjson::dom::object obj;
  if (root.get_object().get(obj) != simdjson::SUCCESS) {
    return InvalidArgumentError(origin + ": not a JSON object");
  }
  aoa::HfTargetConfig c;
  std::optional<bool> tie;
  for (auto field : obj) {
    const std::string_view k = field.key;
    simdjson::dom::element v = field.value;
    auto integer = [&](int64_t* out) -> Status {
      if (v.is_null()) return Status::Ok();
      int64_t i = 0;
      if (v.get_int64().get(i) != simdjson::SUCCESS) {
        return InvalidArgumentError(origin + ": '" + std::string(k) + "' must be an integer");
      }
      *out = i;
      return Status::Ok();
    };
    auto boolean = [&](std::optional<bool>* out) -> Status {
      bool b = false;
      if (v.get_bool().get(b) != simdjson::SUCCESS) {
        return InvalidArgumentError(origin + ": '" + std::string(k) + "' must be true or false");
      }
      *out = b;
      return Status::Ok();
    };
    if (k == "model_type") {
      std::string_view s;
      if (v.get_string().get(s) != simdjson::SUCCESS) {
        return InvalidArgumentError(origin + ": 'model_type' must be a string");
      }
      c.model_type = std::string(s);
    } else if (k == "activation_function") {
      std::string_view s;
      if (v.get_string().get(s) != simdjson::SUCCESS) {
        return InvalidArgumentError(origin + ": 'activation_function' must be a string");
      }
      c.activation_function = std::string(s);
    } else if (k == "max_position_embeddings" || k == "n_positions") {
      FC_RETURN_IF_ERROR(integer(&c.max_position_embeddings));
    } else if (k == "num_experts") {  // Qwen2-MoE's name
      FC_RETURN_IF_ERROR(integer(&c.num_local_experts));
    } else if (k == "moe_intermediate_size") {
      FC_RETURN_IF_ERROR(integer(&c.moe_intermediate_size));
    } else if (k == "shared_expert_intermediate_size") {
      FC_RETURN_IF_ERROR(integer(&c.shared_expert_intermediate_size));
    } else if (k == "decoder_sparse_step") {
      FC_RETURN_IF_ERROR(integer(&c.decoder_sparse_step));
    } else if (k == "norm_topk_prob") {
      FC_RETURN_IF_ERROR(boolean(&c.norm_topk_prob));
    } else if (k == "qkv_bias") {
      FC_RETURN_IF_ERROR(boolean(&c.qkv_bias));
    } else if (k == "mlp_only_layers") {
      simdjson::dom::array a;
      if (v.get_array().get(a) != simdjson::SUCCESS) {
        return InvalidArgumentError(origin + ": 'mlp_only_layers' must be an array");
      }
      c.has_mlp_only_layers = a.size() > 0;
    } else if (k == "num_local_experts") {
      FC_RETURN_IF_ERROR(integer(&c.num_local_experts));
    } else if (k == "num_experts_per_tok") {
      FC_RETURN_IF_ERROR(integer(&c.num_experts_per_tok));
    } else if (k == "n_embd") {  // GPT-2's names for the fields below
      FC_RETURN_IF_ERROR(integer(&c.hidden_size));
    } else if (k == "n_layer") {
      FC_RETURN_IF_ERROR(integer(&c.num_hidden_layers));
    } else if (k == "n_head") {
      FC_RETURN_IF_ERROR(integer(&c.num_attention_heads));
    } else if (k == "n_inner") {
      FC_RETURN_IF_ERROR(integer(&c.intermediate_size));
    } else if (k == "vocab_size") {
      FC_RETURN_IF_ERROR(integer(&c.vocab_size));
    } else if (k == "hidden_size") {
      FC_RETURN_IF_ERROR(integer(&c.hidden_size));
    } else if (k == "num_hidden_layers") {
      FC_RETURN_IF_ERROR(integer(&c.num_hidden_layers));
    } else if (k == "num_attention_heads") {
      FC_RETURN_IF_ERROR(integer(&c.num_attention_heads));
    } else if (k == "num_key_value_heads") {
      FC_RETURN_IF_ERROR(integer(&c.num_key_value_heads));
    } else if (k == "head_dim") {
      FC_RETURN_IF_ERROR(integer(&c.head_dim));
    } else if (k == "intermediate_size") {
      FC_RETURN_IF_ERROR(integer(&c.intermediate_size));
    } else if (k == "tie_word_embeddings") {
      FC_RETURN_IF_ERROR(boolean(&tie));
    } else if (k == "attention_bias") {
      FC_RETURN_IF_ERROR(boolean(&c.attention_bias));
    } else if (k == "mlp_bias") {
      FC_RETURN_IF_ERROR(boolean(&c.mlp_bias));
    }
  }
  // save_pretrained leaves out fields at their model's default: GPT2Config ties the output
  // layer by default, LlamaConfig, MistralConfig and Qwen2Config do not.
  c.tie_word_embeddings = tie.value_or(c.model_type == "gpt2");
  return c;
}

Result<std::string> HfFamilyProgram(const CheckpointIndex& index, const std::string& family,
                                    const std::string& config_dir) {
  if (config_dir.empty()) {
    return InvalidArgumentError("--hf-family " + family +
                                " needs --copy-from DIR (the HF model directory whose "
                                "config.json the program is made for)");
  }
  const std::string path = JoinPath(config_dir, "config.json");
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(path, 64ull << 20));
  FC_ASSIGN_OR_RETURN(aoa::HfTargetConfig config,
                      ParseHfConfig(std::string_view(reinterpret_cast<const char*>(bytes.data()),
                                                     bytes.size()),
                                    path));
  aoa::HfSourceFacts facts;
  for (const TensorEntry& t : index.tensors) facts.tensors.push_back({t.key, t.global_shape});
  const std::string prefix = "megatron.args.";
  for (const auto& [k, v] : index.attributes) {
    if (k.rfind(prefix, 0) == 0) facts.args[k.substr(prefix.size())] = v;
  }
  return aoa::GenerateHfFamilyProgram(family, facts, config);
}

std::string HfDirOfInput(const std::string& input) {
  const std::string in = StripTrailingSlashes(input);
  if (IsDirectory(in)) return in;
  const size_t slash = in.rfind('/');
  return slash == std::string::npos ? std::string(".") : in.substr(0, slash);
}

Result<std::string> HfFamilyReverseProgram(const CheckpointIndex& index, const std::string& family,
                                           const std::string& hf_dir,
                                           const std::vector<TargetTensor>* target) {
  const std::string path = JoinPath(hf_dir, "config.json");
  FC_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadWholeFile(path, 64ull << 20));
  FC_ASSIGN_OR_RETURN(aoa::HfTargetConfig config,
                      ParseHfConfig(std::string_view(reinterpret_cast<const char*>(bytes.data()),
                                                     bytes.size()),
                                    path));
  aoa::HfReverseSource source;
  for (const TensorEntry& t : index.tensors) {
    source.tensors.push_back({t.key, t.global_shape});
    if (t.key == "model.embed_tokens.weight" || (family == "gpt2" && t.key == "transformer.wte.weight")) {
      source.embedding_dtype = DTypeName(t.dtype);
    }
  }
  aoa::MegatronTargetFacts facts;
  if (target != nullptr) {
    bool te = false, local = false, te_mlp = false, local_mlp = false;
    for (const TargetTensor& t : *target) {
      facts.tensors.push_back({t.key, t.global_shape});
      if (t.key == "embedding.word_embeddings.weight" && !t.global_shape.empty()) {
        facts.padded_vocab_size = t.global_shape[0];
      }
      if (t.key.ends_with("self_attention.linear_qkv.layer_norm_weight")) te = true;
      if (t.key.ends_with("input_layernorm.weight")) local = true;
      if (t.key.ends_with("mlp.linear_fc1.layer_norm_weight")) te_mlp = true;
      if (t.key.ends_with("pre_mlp_layernorm.weight")) local_mlp = true;
      if (t.key.starts_with("decoder.layers.self_attention.")) facts.stacked_layers = true;
    }
    if (te && local) {
      return InvalidArgumentError("--from-hf-family " + family + ": the target has both "
                                  "linear_qkv.layer_norm_weight and input_layernorm.weight names");
    }
    if (te_mlp && local_mlp) {
      return InvalidArgumentError("--from-hf-family " + family + ": the target has both "
                                  "linear_fc1.layer_norm_weight and pre_mlp_layernorm.weight names");
    }
    facts.local_norm_names = local;
    if (te_mlp || local_mlp) facts.local_pre_mlp_norm = local_mlp;
  }
  return aoa::GenerateHfFamilyReverseProgram(family, source, config, facts);
}

}  // namespace fc
