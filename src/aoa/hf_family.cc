// --hf-family: the Megatron-Core GPT -> HuggingFace AOA program from facts (fc/aoa/hf_family.h).
#include "fc/aoa/hf_family.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

namespace fc::aoa {
namespace {

std::string ShapeText(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The per-layer tensors a Llama-like family maps, by their name after "decoder.layers.[i.]".
struct LayerRole {
  const char* suffix;
  const char* hf;  // HF name after "model.layers.<i>."; nullptr: handled specially
};
constexpr LayerRole kLayerRoles[] = {
    {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
    {"input_layernorm.weight", "input_layernorm.weight"},
    {"self_attention.linear_qkv.weight", nullptr},
    {"self_attention.linear_qkv.bias", nullptr},
    {"self_attention.linear_proj.weight", "self_attn.o_proj.weight"},
    {"mlp.linear_fc1.layer_norm_weight", "post_attention_layernorm.weight"},
    {"pre_mlp_layernorm.weight", "post_attention_layernorm.weight"},
    {"mlp.linear_fc1.weight", nullptr},
    {"mlp.linear_fc2.weight", "mlp.down_proj.weight"},
    // MoE layers (family mixtral): the router and the SequentialMLP experts as torch_dist
    // saves them, one tensor per layer with the expert on axis 0
    {"mlp.router.weight", nullptr},
    {"mlp.experts.experts.linear_fc1.weight", nullptr},
    {"mlp.experts.experts.linear_fc2.weight", nullptr},
    // the shared expert and its sigmoid gate (family qwen2-moe)
    {"mlp.shared_experts.linear_fc1.weight", nullptr},
    {"mlp.shared_experts.linear_fc2.weight", nullptr},
    {"mlp.shared_experts.gate_weight", nullptr},
};

bool IsSharedExpertSuffix(std::string_view suffix) {
  return suffix.starts_with("mlp.shared_experts.");
}

bool IsMoeSuffix(std::string_view suffix) {
  return suffix == "mlp.router.weight" || suffix.starts_with("mlp.experts.") ||
         IsSharedExpertSuffix(suffix);
}

const LayerRole* RoleOf(std::string_view suffix) {
  for (const LayerRole& r : kLayerRoles) {
    if (suffix == r.suffix) return &r;
  }
  return nullptr;
}

std::optional<int64_t> ArgInt(const HfSourceFacts& f, const std::string& k) {
  auto it = f.args.find(k);
  if (it == f.args.end()) return std::nullopt;
  try {
    size_t used = 0;
    int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (...) {
  }
  return std::nullopt;
}

std::optional<bool> ArgBool(const HfSourceFacts& f, const std::string& k) {
  auto it = f.args.find(k);
  if (it == f.args.end()) return std::nullopt;
  if (it->second == "true") return true;
  if (it->second == "false") return false;
  return std::nullopt;
}

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The source's tensors by role: non-layer names (`is_top`), and the layers' tensors from
// layer-stacked ("decoder.layers.<suffix>", layer on axis 0) or per-layer
// ("decoder.layers.<i>.<suffix>") keys whose suffix `is_layer`; anything else is
// kUnimplemented naming the tensor (`what`: the names the family maps).
struct SourceModel {
  std::map<std::string, Shape> top;      // non-layer tensors
  std::map<std::string, Shape> stacked;  // suffix -> stacked shape (empty: per-layer keys)
  std::map<std::string, Shape> layer;    // one layer's tensors, without the layer axis
  int64_t num_layers = 0;
};

template <typename IsTop, typename IsLayer>
Result<SourceModel> ReadSource(const HfSourceFacts& source, const std::string& where,
                               const std::string& fam, const std::string& what, IsTop is_top,
                               IsLayer is_layer) {
  auto mismatch = [&](const std::string& text) { return InvalidArgumentError(where + ": " + text); };
  // The source's names: layer-stacked ("decoder.layers.<suffix>", layer on axis 0) or
  // per-layer ("decoder.layers.<i>.<suffix>") keys.
  SourceModel m;
  std::map<std::string, Shape>& top = m.top;
  std::map<std::string, Shape>& stacked = m.stacked;
  std::map<int64_t, std::map<std::string, Shape>> layers;    // id -> suffix -> shape
  for (const HfSourceFacts::Tensor& t : source.tensors) {
    if (t.name.rfind("optimizer.", 0) == 0) continue;
    const std::string prefix = "decoder.layers.";
    if (t.name.rfind(prefix, 0) == 0) {
      std::string rest = t.name.substr(prefix.size());
      const size_t dot = rest.find('.');
      std::string suffix = rest;
      std::optional<int64_t> id;
      if (dot != std::string::npos && IsDigits(rest.substr(0, dot))) {
        id = std::stoll(rest.substr(0, dot));
        suffix = rest.substr(dot + 1);
      }
      if (!is_layer(suffix)) {
        return UnimplementedError(where + ": the source tensor '" + t.name +
                                  "' has no place in family " + fam + " (" + what + ")");
      }
      if (id) {
        layers[*id][suffix] = t.shape;
      } else {
        stacked[suffix] = t.shape;
      }
      continue;
    }
    if (is_top(t.name)) {
      top[t.name] = t.shape;
      continue;
    }
    return UnimplementedError(where + ": the source tensor '" + t.name + "' has no place in family " +
                              fam + " (not a Megatron-Core GPT name fc maps)");
  }
  if (!top.count("embedding.word_embeddings.weight")) {
    return UnimplementedError(where + ": the source has no embedding.word_embeddings.weight; " +
                              "--hf-family reads Megatron-Core GPT checkpoints");
  }
  if (!top.count("decoder.final_layernorm.weight")) {
    return UnimplementedError(where + ": the source has no decoder.final_layernorm.weight");
  }
  if (!stacked.empty() && !layers.empty()) {
    return UnimplementedError(where + ": the source mixes layer-stacked and per-layer keys");
  }
  // One layer's tensors (shapes without the layer axis) and the layer count.
  std::map<std::string, Shape>& layer = m.layer;
  int64_t& num_layers = m.num_layers;
  if (!stacked.empty()) {
    for (const auto& [suffix, shape] : stacked) {
      if (shape.empty()) return mismatch("stacked tensor decoder.layers." + suffix + " is 0-d");
      if (num_layers == 0) num_layers = shape[0];
      if (shape[0] != num_layers) {
        return mismatch("stacked tensors disagree on the layer count: decoder.layers." + suffix +
                        " has " + std::to_string(shape[0]) + ", others " +
                        std::to_string(num_layers));
      }
      layer[suffix] = Shape(shape.begin() + 1, shape.end());
    }
  } else if (!layers.empty()) {
    num_layers = static_cast<int64_t>(layers.size());
    layer = layers.begin()->second;
    int64_t expect = 0;
    for (const auto& [id, tensors] : layers) {
      if (id != expect) {
        return mismatch("the source's layers are not numbered 0.." + std::to_string(num_layers - 1) +
                        " (layer " + std::to_string(expect) + " is missing)");
      }
      if (tensors != layer) {
        return mismatch("layer " + std::to_string(id) + " holds other tensors or shapes than layer 0");
      }
      ++expect;
    }
  }
  return m;
}


// "decoder.layers.<suffix>" stacked tensors cut into "decoder.layers.<i>.<suffix>", each
// without the layer axis (nothing for per-layer keys).
std::string StackedCut(const SourceModel& m) {
  if (m.stacked.empty()) return "";
  std::string p = "\n# layer-stacked tensors: cut into layers, each without the layer axis\n";
  const std::string L = "decoder.layers.$LAYER_ID.";
  for (const auto& [suffix, shape] : m.stacked) {
    p += "decoder.layers." + suffix + " ->";
    for (int64_t i = 0; i < m.num_layers; ++i) {
      p += std::string(i ? "," : "") + "\n    decoder.layers." + std::to_string(i) + "." + suffix;
    }
    p += ",\n    axis=0\n";
    p += L + suffix + " -> " + L + suffix + ", shape='" + ShapeText(m.layer.at(suffix)) + "'\n";
  }
  return p;
}

// The GPT-2 layer tensors (suffixes after "decoder.layers.[i.]").
constexpr const char* kGpt2LayerSuffixes[] = {
    "self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
    "input_layernorm.weight", "input_layernorm.bias",
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
    "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
    "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias",
    "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
    "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"};

// --hf-family gpt2: learned absolute positions, LayerNorm with bias, biased linears, GeLU, HF
// Conv1D weights ([in, out]: Megatron's transposed), c_attn = [q; k; v] (Megatron's QKV is
// grouped per head: [q_h k_h v_h] for each head h).
Result<std::string> Gpt2Program(const HfSourceFacts& source, const HfTargetConfig& cfg) {
  const std::string where = "--hf-family gpt2";
  auto mismatch = [&](const std::string& what) { return InvalidArgumentError(where + ": " + what); };
  auto num = [](int64_t v) { return std::to_string(v); };
  if (cfg.model_type != "gpt2") {
    return mismatch("config.json model_type is '" + cfg.model_type + "', family gpt2 takes gpt2");
  }
  for (auto [v, k] : {std::pair{cfg.vocab_size, "vocab_size"}, {cfg.hidden_size, "n_embd"},
                      {cfg.num_hidden_layers, "n_layer"}, {cfg.num_attention_heads, "n_head"},
                      {cfg.max_position_embeddings, "n_positions"}}) {
    if (v <= 0) return mismatch(std::string("config.json has no positive ") + k);
  }
  FC_ASSIGN_OR_RETURN(
      SourceModel src,
      ReadSource(source, where, "gpt2",
                 "fc maps Megatron-Core GPT layers with LayerNorm, biases and a GeLU MLP",
                 [](const std::string& n) {
                   return n == "embedding.word_embeddings.weight" ||
                          n == "embedding.position_embeddings.weight" ||
                          n == "output_layer.weight" || n == "decoder.final_layernorm.weight" ||
                          n == "decoder.final_layernorm.bias";
                 },
                 [](const std::string& suffix) {
                   for (const char* s : kGpt2LayerSuffixes) {
                     if (suffix == s) return true;
                   }
                   return false;
                 }));
  std::map<std::string, Shape>& top = src.top;
  std::map<std::string, Shape>& layer = src.layer;
  const int64_t hidden = cfg.hidden_size, heads = cfg.num_attention_heads;
  const int64_t ffn = cfg.intermediate_size > 0 ? cfg.intermediate_size : 4 * hidden;
  if (hidden % heads != 0) {
    return mismatch("config.json n_embd " + num(hidden) + " does not divide by n_head " + num(heads));
  }
  auto pick = [&](const std::string& a, const std::string& b) -> Result<std::string> {
    if (layer.count(a)) return a;
    if (layer.count(b)) return b;
    return UnimplementedError(where + ": the source's layers have no " + a + " (or " + b +
                              "); GPT-2's LayerNorms have weight and bias");
  };
  FC_ASSIGN_OR_RETURN(std::string ln1w, pick("self_attention.linear_qkv.layer_norm_weight",
                                             "input_layernorm.weight"));
  FC_ASSIGN_OR_RETURN(std::string ln1b, pick("self_attention.linear_qkv.layer_norm_bias",
                                             "input_layernorm.bias"));
  FC_ASSIGN_OR_RETURN(std::string ln2w, pick("mlp.linear_fc1.layer_norm_weight",
                                             "pre_mlp_layernorm.weight"));
  FC_ASSIGN_OR_RETURN(std::string ln2b, pick("mlp.linear_fc1.layer_norm_bias",
                                             "pre_mlp_layernorm.bias"));
  for (const char* name : {"embedding.position_embeddings.weight", "decoder.final_layernorm.bias"}) {
    if (!top.count(name)) {
      return UnimplementedError(where + ": the source has no " + std::string(name) +
                                " (GPT-2 has learned absolute positions and LayerNorm biases)");
    }
  }
  if (src.num_layers != cfg.num_hidden_layers) {
    return mismatch("the source has " + num(src.num_layers) + " layers, config.json n_layer is " +
                    num(cfg.num_hidden_layers));
  }
  const Shape& emb = top["embedding.word_embeddings.weight"];
  if (emb.size() != 2 || emb[1] != hidden) {
    return mismatch("embedding.word_embeddings.weight is " + ShapeText(emb) +
                    ", config.json n_embd is " + num(hidden));
  }
  const int64_t padded_vocab = emb[0];
  if (cfg.vocab_size > padded_vocab) {
    return mismatch("config.json vocab_size " + num(cfg.vocab_size) +
                    " is larger than the source's vocabulary " + num(padded_vocab) +
                    " (embedding.word_embeddings.weight rows)");
  }
  const Shape& pos = top["embedding.position_embeddings.weight"];
  if (pos != Shape{cfg.max_position_embeddings, hidden}) {
    return mismatch("embedding.position_embeddings.weight is " + ShapeText(pos) +
                    ", config.json n_positions " + num(cfg.max_position_embeddings) +
                    " and n_embd " + num(hidden) + " need " +
                    ShapeText({cfg.max_position_embeddings, hidden}));
  }
  if (auto h = ArgInt(source, "num_attention_heads"); h && *h != heads) {
    return mismatch("the source's num_attention_heads is " + num(*h) +
                    " (Megatron args), config.json n_head is " + num(heads));
  }
  if (ArgBool(source, "group_query_attention").value_or(false)) {
    if (auto g = ArgInt(source, "num_query_groups"); g && *g != heads) {
      return mismatch("the source has grouped-query attention (args.num_query_groups " + num(*g) +
                      "); GPT-2 has one K/V head per query head (n_head " + num(heads) + ")");
    }
  }
  if (ArgBool(source, "swiglu").value_or(false)) {
    return mismatch("the source's args.swiglu is true; GPT-2's MLP has no gate");
  }
  const std::string want_act = ArgBool(source, "openai_gelu").value_or(false) ? "gelu_new" : "gelu";
  // GPT2Config's default activation_function is gelu_new (the tanh form)
  const std::string act = cfg.activation_function.value_or("gelu_new");
  if (act != want_act && !(want_act == "gelu_new" && act == "gelu_pytorch_tanh")) {
    return mismatch("config.json activation_function is '" + act + "'" +
                    (cfg.activation_function ? "" : " (GPT2Config's default)") +
                    "; the source's GeLU is " +
                    (want_act == "gelu" ? "the exact (erf) form Megatron uses without "
                                          "--openai-gelu: set \"activation_function\": \"gelu\""
                                        : "the tanh form (args.openai_gelu): gelu_new") );
  }
  auto expect = [&](const std::string& suffix, const Shape& want) -> Status {
    if (!layer.count(suffix)) {
      return UnimplementedError(where + ": the source's layers have no " + suffix +
                                " (GPT-2's linears have biases: Megatron add_bias_linear)");
    }
    if (layer[suffix] != want) {
      return mismatch(suffix + " is " + ShapeText(layer[suffix]) + " per layer; config.json (n_embd " +
                      num(hidden) + ", n_head " + num(heads) + ", n_inner " + num(ffn) +
                      ") needs " + ShapeText(want) +
                      (suffix == "mlp.linear_fc1.weight" && layer[suffix] == Shape{2 * ffn, hidden}
                           ? " (the source's MLP is gated, GPT-2's is not)"
                           : ""));
    }
    return Status::Ok();
  };
  FC_RETURN_IF_ERROR(expect("self_attention.linear_qkv.weight", {3 * hidden, hidden}));
  FC_RETURN_IF_ERROR(expect("self_attention.linear_qkv.bias", {3 * hidden}));
  FC_RETURN_IF_ERROR(expect("self_attention.linear_proj.weight", {hidden, hidden}));
  FC_RETURN_IF_ERROR(expect("self_attention.linear_proj.bias", {hidden}));
  FC_RETURN_IF_ERROR(expect("mlp.linear_fc1.weight", {ffn, hidden}));
  FC_RETURN_IF_ERROR(expect("mlp.linear_fc1.bias", {ffn}));
  FC_RETURN_IF_ERROR(expect("mlp.linear_fc2.weight", {hidden, ffn}));
  FC_RETURN_IF_ERROR(expect("mlp.linear_fc2.bias", {hidden}));
  for (const std::string& s : {ln1w, ln1b, ln2w, ln2b}) FC_RETURN_IF_ERROR(expect(s, {hidden}));
  const bool has_output = top.count("output_layer.weight") > 0;
  if (has_output == cfg.tie_word_embeddings) {
    return mismatch(std::string("the source ") +
                    (has_output ? "has its own output_layer.weight (untied)" :
                                  "has no output_layer.weight (tied to the embedding)") +
                    ", config.json tie_word_embeddings is " +
                    (cfg.tie_word_embeddings ? "true" : "false"));
  }
  if (has_output && top["output_layer.weight"] != emb) {
    return mismatch("output_layer.weight is " + ShapeText(top["output_layer.weight"]) +
                    ", the embedding " + ShapeText(emb));
  }

  std::string p;
  const int64_t pad = padded_vocab - cfg.vocab_size;
  p += "# Megatron-Core GPT -> HuggingFace gpt2 (generated by --hf-family gpt2)\n";
  p += "# source: " + num(src.num_layers) + " layers" +
       (src.stacked.empty() ? std::string(" (per-layer keys)") : std::string(" (layer-stacked keys)")) +
       ", hidden " + num(hidden) + ", vocabulary " + num(padded_vocab) + " rows, " +
       num(cfg.max_position_embeddings) + " positions\n";
  p += "# config.json: " + num(heads) + " heads, n_inner " + num(ffn) + ", vocab_size " +
       num(cfg.vocab_size) + ", activation_function " + act + "\n\n";
  auto vocab = [&](const std::string& from, const std::string& to, const std::string& tmp) {
    if (pad == 0) {
      p += from + " -> " + to + "\n";
    } else {
      p += from + " -> " + to + ", " + tmp + ", axis=0, sizes='[" + num(cfg.vocab_size) + "," +
           num(pad) + "]'\n" + tmp + " -> _\n";
    }
  };
  if (pad > 0) p += "# drop the " + num(pad) + " rows Megatron padded the vocabulary with\n";
  vocab("embedding.word_embeddings.weight", "transformer.wte.weight", "wte_pad");
  if (has_output) vocab("output_layer.weight", "lm_head.weight", "lm_head_pad");
  p += "embedding.position_embeddings.weight -> transformer.wpe.weight\n";
  p += "decoder.final_layernorm.weight -> transformer.ln_f.weight\n";
  p += "decoder.final_layernorm.bias -> transformer.ln_f.bias\n";
  p += StackedCut(src);
  const std::string L = "decoder.layers.$LAYER_ID.";
  const std::string H = "transformer.h.$LAYER_ID.";
  p += "\n# attention: Megatron's QKV is [q_h k_h v_h] per head; HF's c_attn is [q; k; v], and\n"
       "# HF's Conv1D weights are [in, out] (Megatron's transposed)\n";
  p += L + ln1w + " -> " + H + "ln_1.weight\n";
  p += L + ln1b + " -> " + H + "ln_1.bias\n";
  const std::string fused = ", fused_qkv, num_heads=" + num(heads) +
                            ", num_key_value_groups=" + num(heads) + ", axis=0\n";
  p += L + "self_attention.linear_qkv.weight ->\n    gpt2_q.$LAYER_ID, gpt2_k.$LAYER_ID, "
       "gpt2_v.$LAYER_ID" + fused;
  p += "gpt2_q.$LAYER_ID, gpt2_k.$LAYER_ID, gpt2_v.$LAYER_ID -> gpt2_qkv.$LAYER_ID, axis=0\n";
  p += "gpt2_qkv.$LAYER_ID -> " + H + "attn.c_attn.weight, permute='[1, 0]'\n";
  p += L + "self_attention.linear_qkv.bias ->\n    gpt2_qb.$LAYER_ID, gpt2_kb.$LAYER_ID, "
       "gpt2_vb.$LAYER_ID" + fused;
  p += "gpt2_qb.$LAYER_ID, gpt2_kb.$LAYER_ID, gpt2_vb.$LAYER_ID -> " + H + "attn.c_attn.bias, axis=0\n";
  p += L + "self_attention.linear_proj.weight -> " + H + "attn.c_proj.weight, permute='[1, 0]'\n";
  p += L + "self_attention.linear_proj.bias -> " + H + "attn.c_proj.bias\n";
  p += "\n# MLP (GeLU, no gate)\n";
  p += L + ln2w + " -> " + H + "ln_2.weight\n";
  p += L + ln2b + " -> " + H + "ln_2.bias\n";
  p += L + "mlp.linear_fc1.weight -> " + H + "mlp.c_fc.weight, permute='[1, 0]'\n";
  p += L + "mlp.linear_fc1.bias -> " + H + "mlp.c_fc.bias\n";
  p += L + "mlp.linear_fc2.weight -> " + H + "mlp.c_proj.weight, permute='[1, 0]'\n";
  p += L + "mlp.linear_fc2.bias -> " + H + "mlp.c_proj.bias\n";
  return p;
}

}  // namespace

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
  const std::string where = "--hf-family " + fam;
  auto mismatch = [&](const std::string& what) { return InvalidArgumentError(where + ": " + what); };

  // config.json: the family's model types and the fields every family needs.
  const bool qwen2 = fam == "qwen2";
  const bool qmoe = fam == "qwen2-moe";
  const bool moe = fam == "mixtral" || qmoe;
  const std::string type_text = qwen2 ? "qwen2" : qmoe ? "qwen2_moe" : moe ? "mixtral"
                                                                          : "llama or mistral";
  const std::set<std::string> types = qwen2  ? std::set<std::string>{"qwen2"}
                                      : qmoe ? std::set<std::string>{"qwen2_moe"}
                                      : moe  ? std::set<std::string>{"mixtral"}
                                             : std::set<std::string>{"llama", "mistral"};
  if (!types.count(cfg.model_type)) {
    return mismatch("config.json model_type is '" + cfg.model_type + "', family " + fam +
                    " takes " + type_text);
  }
  if (qmoe && (cfg.decoder_sparse_step > 1 || cfg.has_mlp_only_layers)) {
    return mismatch("config.json has dense MLP layers (decoder_sparse_step " +
                    std::to_string(cfg.decoder_sparse_step) +
                    ", mlp_only_layers); fc maps Qwen2-MoE models whose every MLP is a MoE layer");
  }
  for (auto [v, k] : {std::pair{cfg.vocab_size, "vocab_size"}, {cfg.hidden_size, "hidden_size"},
                      {cfg.num_hidden_layers, "num_hidden_layers"},
                      {cfg.num_attention_heads, "num_attention_heads"},
                      {cfg.intermediate_size, "intermediate_size"}}) {
    if (v <= 0) return mismatch(std::string("config.json has no positive ") + k);
  }
  const int64_t heads = cfg.num_attention_heads;
  const int64_t groups = cfg.num_key_value_heads > 0 ? cfg.num_key_value_heads : heads;
  if (heads % groups != 0) {
    return mismatch("config.json num_attention_heads " + std::to_string(heads) +
                    " is not a multiple of num_key_value_heads " + std::to_string(groups));
  }
  if (cfg.head_dim <= 0 && cfg.hidden_size % heads != 0) {
    return mismatch("config.json hidden_size " + std::to_string(cfg.hidden_size) +
                    " does not divide by num_attention_heads " + std::to_string(heads) +
                    " and there is no head_dim");
  }
  const int64_t head_dim = cfg.head_dim > 0 ? cfg.head_dim : cfg.hidden_size / heads;

  FC_ASSIGN_OR_RETURN(
      SourceModel src,
      ReadSource(source, where, fam,
                 "fc maps Megatron-Core GPT dense layers: fused QKV, SwiGLU MLP, RMSNorm",
                 [](const std::string& n) {
                   return n == "embedding.word_embeddings.weight" ||
                          n == "output_layer.weight" || n == "decoder.final_layernorm.weight";
                 },
                 [moe, qmoe](const std::string& suffix) {
                   return RoleOf(suffix) != nullptr && (moe || !IsMoeSuffix(suffix)) &&
                          (qmoe || !IsSharedExpertSuffix(suffix));
                 }));
  std::map<std::string, Shape>& top = src.top;
  const std::map<std::string, Shape>& stacked = src.stacked;
  std::map<std::string, Shape>& layer = src.layer;
  const int64_t num_layers = src.num_layers;
  auto need = [&](const std::string& a, const std::string& b) -> Result<std::string> {
    if (layer.count(a)) return a;
    if (layer.count(b)) return b;
    return UnimplementedError(where + ": the source's layers have no " + a + " (or " + b + ")");
  };
  FC_ASSIGN_OR_RETURN(std::string norm1, need("self_attention.linear_qkv.layer_norm_weight",
                                              "input_layernorm.weight"));
  FC_ASSIGN_OR_RETURN(std::string norm2, need("mlp.linear_fc1.layer_norm_weight",
                                              "pre_mlp_layernorm.weight"));
  std::vector<const char*> required =
      moe ? std::vector<const char*>{"self_attention.linear_qkv.weight",
                                     "self_attention.linear_proj.weight", "mlp.router.weight",
                                     "mlp.experts.experts.linear_fc1.weight",
                                     "mlp.experts.experts.linear_fc2.weight"}
          : std::vector<const char*>{"self_attention.linear_qkv.weight",
                                     "self_attention.linear_proj.weight", "mlp.linear_fc1.weight",
                                     "mlp.linear_fc2.weight"};
  if (qmoe) {
    for (const char* s : {"mlp.shared_experts.linear_fc1.weight",
                          "mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.gate_weight"}) {
      required.push_back(s);
    }
  }
  if (moe && (layer.count("mlp.linear_fc1.weight") || layer.count("mlp.linear_fc2.weight"))) {
    return UnimplementedError(where + ": the source's layers have a dense MLP "
                              "(mlp.linear_fc1.weight); Mixtral's every MLP is a MoE layer");
  }
  for (const char* s : required) {
    if (!layer.count(s)) {
      return UnimplementedError(where + ": the source's layers have no " + std::string(s));
    }
  }

  // Facts against config.json.
  auto num = [](int64_t v) { return std::to_string(v); };
  if (num_layers != cfg.num_hidden_layers) {
    return mismatch("the source has " + num(num_layers) + " layers, config.json num_hidden_layers is " +
                    num(cfg.num_hidden_layers));
  }
  const Shape& emb = top["embedding.word_embeddings.weight"];
  if (emb.size() != 2) return mismatch("embedding.word_embeddings.weight is not 2-d: " + ShapeText(emb));
  const int64_t hidden = emb[1], padded_vocab = emb[0];
  if (hidden != cfg.hidden_size) {
    return mismatch("the source's hidden size is " + num(hidden) +
                    " (embedding.word_embeddings.weight " + ShapeText(emb) +
                    "), config.json hidden_size is " + num(cfg.hidden_size));
  }
  if (cfg.vocab_size > padded_vocab) {
    return mismatch("config.json vocab_size " + num(cfg.vocab_size) +
                    " is larger than the source's vocabulary " + num(padded_vocab) +
                    " (embedding.word_embeddings.weight rows)");
  }
  if (auto p = ArgInt(source, "padded_vocab_size"); p && *p != padded_vocab) {
    return mismatch("args.padded_vocab_size is " + num(*p) + ", the embedding has " +
                    num(padded_vocab) + " rows");
  }
  if (auto h = ArgInt(source, "num_attention_heads"); h && *h != heads) {
    return mismatch("the source's num_attention_heads is " + num(*h) +
                    " (Megatron args), config.json num_attention_heads is " + num(heads));
  }
  if (ArgBool(source, "group_query_attention").value_or(false)) {
    if (auto g = ArgInt(source, "num_query_groups"); g && *g != groups) {
      return mismatch("the source's num_query_groups is " + num(*g) +
                      " (Megatron args), config.json num_key_value_heads is " + num(groups));
    }
  } else if (ArgBool(source, "group_query_attention") && groups != heads) {
    return mismatch("the source has no grouped-query attention (args.group_query_attention false: " +
                    num(heads) + " KV heads), config.json num_key_value_heads is " + num(groups));
  }
  if (auto k = ArgInt(source, "kv_channels"); k && *k != head_dim) {
    return mismatch("the source's kv_channels (head dim) is " + num(*k) +
                    " (Megatron args), config.json gives head_dim " + num(head_dim));
  }
  const Shape& qkv = layer["self_attention.linear_qkv.weight"];
  const int64_t qkv_rows = (heads + 2 * groups) * head_dim;
  if (qkv.size() != 2 || qkv[0] != qkv_rows || qkv[1] != hidden) {
    return mismatch("linear_qkv.weight is " + ShapeText(qkv) + " per layer; config.json's " +
                    "num_attention_heads " + num(heads) + ", num_key_value_heads " + num(groups) +
                    ", head_dim " + num(head_dim) + " need [(" + num(heads) + " + 2 x " +
                    num(groups) + ") x " + num(head_dim) + ", " + num(hidden) + "] = [" +
                    num(qkv_rows) + ", " + num(hidden) + "]");
  }
  const Shape& proj = layer["self_attention.linear_proj.weight"];
  if (proj != Shape{hidden, heads * head_dim}) {
    return mismatch("linear_proj.weight is " + ShapeText(proj) + " per layer, config.json needs " +
                    ShapeText({hidden, heads * head_dim}));
  }
  if (auto s = ArgBool(source, "swiglu"); s && !*s) {
    return mismatch("family " + fam + " needs SwiGLU; the source's args.swiglu is false");
  }
  // Qwen2-MoE: intermediate_size is its dense MLP's (no layer has one here); the experts'
  // is moe_intermediate_size.
  const int64_t ffn = qmoe ? cfg.moe_intermediate_size : cfg.intermediate_size;
  const int64_t experts = cfg.num_local_experts;
  const std::string experts_key = qmoe ? "num_experts" : "num_local_experts";
  const std::string ffn_key = qmoe ? "moe_intermediate_size" : "intermediate_size";
  if (moe) {
    if (experts <= 0 || cfg.num_experts_per_tok <= 0 || ffn <= 0) {
      return mismatch("config.json has no positive " + experts_key + ", num_experts_per_tok and " +
                      ffn_key);
    }
    const Shape& router = layer["mlp.router.weight"];
    if (router != Shape{experts, hidden}) {
      return mismatch("mlp.router.weight is " + ShapeText(router) + " per layer; config.json " +
                      experts_key + " " + num(experts) + " needs " + ShapeText({experts, hidden}));
    }
    const Shape& efc1 = layer["mlp.experts.experts.linear_fc1.weight"];
    const Shape& efc2 = layer["mlp.experts.experts.linear_fc2.weight"];
    if (efc1 != Shape{experts, 2 * ffn, hidden} || efc2 != Shape{experts, hidden, ffn}) {
      return mismatch("the experts' linear_fc1.weight is " + ShapeText(efc1) + " and linear_fc2.weight " +
                      ShapeText(efc2) + " per layer; config.json " + experts_key + " " + num(experts) +
                      " and " + ffn_key + " " + num(ffn) + " need " +
                      ShapeText({experts, 2 * ffn, hidden}) + " (SwiGLU gate and up) and " +
                      ShapeText({experts, hidden, ffn}));
    }
    if (auto e = ArgInt(source, "num_experts"); e && *e != experts) {
      return mismatch("the source's num_experts is " + num(*e) + " (Megatron args), config.json " +
                      experts_key + " is " + num(experts));
    }
    if (auto k = ArgInt(source, "moe_router_topk"); k && *k != cfg.num_experts_per_tok) {
      return mismatch("the source's moe_router_topk is " + num(*k) +
                      " (Megatron args), config.json num_experts_per_tok is " +
                      num(cfg.num_experts_per_tok));
    }
    // Megatron's router: softmax over the top-k logits (Mixtral, Qwen2-MoE norm_topk_prob
    // true), or with moe_router_pre_softmax over all logits, then the top-k (Qwen2-MoE's
    // default norm_topk_prob false).
    const bool renormalized = qmoe ? cfg.norm_topk_prob.value_or(false) : true;
    if (auto pre = ArgBool(source, "moe_router_pre_softmax"); pre && *pre == renormalized) {
      return mismatch(std::string("the source's router takes the softmax ") +
                      (*pre ? "over all experts before the top-k (args.moe_router_pre_softmax "
                              "true); config.json's model renormalizes the top-k"
                            : "over the top-k logits (args.moe_router_pre_softmax false); "
                              "config.json's model does not renormalize the top-k") +
                      (qmoe ? " (norm_topk_prob " + std::string(renormalized ? "true" : "false") + ")"
                            : std::string(" (Mixtral always does)")));
    }
    if (qmoe) {
      const int64_t shared = cfg.shared_expert_intermediate_size;
      const Shape& sfc1 = layer["mlp.shared_experts.linear_fc1.weight"];
      const Shape& sfc2 = layer["mlp.shared_experts.linear_fc2.weight"];
      if (shared <= 0 || sfc1 != Shape{2 * shared, hidden} || sfc2 != Shape{hidden, shared}) {
        return mismatch("the shared expert's linear_fc1.weight is " + ShapeText(sfc1) +
                        " and linear_fc2.weight " + ShapeText(sfc2) + " per layer; config.json " +
                        "shared_expert_intermediate_size " + num(shared) + " needs " +
                        ShapeText({2 * shared, hidden}) + " and " + ShapeText({hidden, shared}));
      }
      if (layer["mlp.shared_experts.gate_weight"] != Shape{1, hidden}) {
        return mismatch("mlp.shared_experts.gate_weight is " +
                        ShapeText(layer["mlp.shared_experts.gate_weight"]) + ", Qwen2-MoE's "
                        "shared_expert_gate needs " + ShapeText({1, hidden}));
      }
    }
    if (auto f = ArgInt(source, "moe_ffn_hidden_size"); f && *f != ffn) {
      return mismatch("the source's moe_ffn_hidden_size is " + num(*f) +
                      " (Megatron args), config.json " + ffn_key + " is " + num(ffn));
    }
  }
  const Shape& fc1 = moe ? Shape{2 * ffn, hidden} : layer["mlp.linear_fc1.weight"];
  const Shape& fc2 = moe ? Shape{hidden, ffn} : layer["mlp.linear_fc2.weight"];
  if (fc1 != Shape{2 * ffn, hidden} || fc2 != Shape{hidden, ffn}) {
    return mismatch("linear_fc1.weight is " + ShapeText(fc1) + " and linear_fc2.weight " +
                    ShapeText(fc2) + " per layer; config.json intermediate_size " + num(ffn) +
                    " needs " + ShapeText({2 * ffn, hidden}) + " (SwiGLU gate and up) and " +
                    ShapeText({hidden, ffn}));
  }
  if (auto f = ArgInt(source, "ffn_hidden_size"); !moe && f && *f != ffn) {
    return mismatch("the source's ffn_hidden_size is " + num(*f) +
                    " (Megatron args), config.json intermediate_size is " + num(ffn));
  }
  const bool qkv_bias = layer.count("self_attention.linear_qkv.bias") > 0;
  if (qwen2 && !qkv_bias) {
    return mismatch("the source has no linear_qkv.bias; Qwen2's q_proj, k_proj and v_proj have "
                    "biases (Megatron add_qkv_bias)");
  }
  if (auto b = ArgBool(source, "add_qkv_bias"); qwen2 && b && !*b) {
    return mismatch("family qwen2 needs QKV biases; the source's args.add_qkv_bias is false");
  }
  if (qmoe && qkv_bias != cfg.qkv_bias.value_or(true)) {
    return mismatch(std::string("the source ") + (qkv_bias ? "has" : "has no") +
                    " linear_qkv.bias, config.json qkv_bias is " +
                    (cfg.qkv_bias.value_or(true) ? "true (Qwen2MoeConfig's default)" : "false"));
  }
  if (!qwen2 && !qmoe && qkv_bias != cfg.attention_bias.value_or(false)) {
    return mismatch(std::string("the source ") + (qkv_bias ? "has" : "has no") +
                    " linear_qkv.bias, config.json attention_bias is " +
                    (cfg.attention_bias.value_or(false) ? "true" : "false") +
                    (qkv_bias ? " (Llama's attention_bias also needs an o_proj bias, which "
                                "Megatron's linear_proj does not have here)"
                              : ""));
  }
  if (qkv_bias && layer["self_attention.linear_qkv.bias"] != Shape{qkv_rows}) {
    return mismatch("linear_qkv.bias is " + ShapeText(layer["self_attention.linear_qkv.bias"]) +
                    " per layer, config.json needs [" + num(qkv_rows) + "]");
  }
  if (cfg.mlp_bias.value_or(false)) {
    return mismatch("config.json mlp_bias is true; the source's MLP has no biases");
  }
  const bool has_output = top.count("output_layer.weight") > 0;
  if (has_output == cfg.tie_word_embeddings) {
    return mismatch(std::string("the source ") +
                    (has_output ? "has its own output_layer.weight (untied)" :
                                  "has no output_layer.weight (tied to the embedding)") +
                    ", config.json tie_word_embeddings is " +
                    (cfg.tie_word_embeddings ? "true" : "false"));
  }
  if (has_output && top["output_layer.weight"] != emb) {
    return mismatch("output_layer.weight is " + ShapeText(top["output_layer.weight"]) +
                    ", the embedding " + ShapeText(emb));
  }

  // The program.
  std::string p;
  const int64_t pad = padded_vocab - cfg.vocab_size;
  p += "# Megatron-Core GPT -> HuggingFace " + fam + " (generated by --hf-family " + fam + ")\n";
  p += "# source: " + num(num_layers) + " layers" +
       (stacked.empty() ? std::string(" (per-layer keys)") : std::string(" (layer-stacked keys)")) +
       ", hidden " + num(hidden) + ", vocabulary " + num(padded_vocab) + " rows\n";
  p += "# config.json: " + num(heads) + " heads, " + num(groups) + " KV heads, head_dim " +
       num(head_dim) + ", intermediate_size " + num(ffn) + ", vocab_size " + num(cfg.vocab_size) +
       "\n\n";
  auto vocab = [&](const std::string& from, const std::string& to, const std::string& tmp) {
    if (pad == 0) {
      p += from + " -> " + to + "\n";
    } else {
      p += from + " -> " + to + ", " + tmp + ", axis=0, sizes='[" + num(cfg.vocab_size) + "," +
           num(pad) + "]'\n" + tmp + " -> _\n";
    }
  };
  if (pad > 0) p += "# drop the " + num(pad) + " rows Megatron padded the vocabulary with\n";
  vocab("embedding.word_embeddings.weight", "model.embed_tokens.weight", "embed_pad");
  if (has_output) vocab("output_layer.weight", "lm_head.weight", "lm_head_pad");
  p += "decoder.final_layernorm.weight -> model.norm.weight\n";
  const std::string L = "decoder.layers.$LAYER_ID.";
  const std::string H = "model.layers.$LAYER_ID.";
  p += StackedCut(src);
  p += "\n# attention: Megatron's query-group QKV (per group its " + num(heads / groups) +
       " query heads, K, V)\n";
  p += L + norm1 + " -> " + H + "input_layernorm.weight\n";
  const std::string fused = ", fused_qkv, num_heads=" + num(heads) +
                            ", num_key_value_groups=" + num(groups) + ", axis=0\n";
  p += L + "self_attention.linear_qkv.weight ->\n    " + H + "self_attn.q_proj.weight,\n    " + H +
       "self_attn.k_proj.weight,\n    " + H + "self_attn.v_proj.weight" + fused;
  if (qkv_bias) {
    p += L + "self_attention.linear_qkv.bias ->\n    " + H + "self_attn.q_proj.bias,\n    " + H +
         "self_attn.k_proj.bias,\n    " + H + "self_attn.v_proj.bias" + fused;
  }
  p += L + "self_attention.linear_proj.weight -> " + H + "self_attn.o_proj.weight\n";
  p += L + norm2 + " -> " + H + "post_attention_layernorm.weight\n";
  if (moe) {
    // HF names: Mixtral block_sparse_moe.experts.<e>.w1 / w3 / w2, Qwen2-MoE
    // mlp.experts.<e>.gate_proj / up_proj / down_proj
    const std::string M = H + (qmoe ? "mlp." : "block_sparse_moe.");
    const std::string wg = qmoe ? "gate_proj" : "w1", wu = qmoe ? "up_proj" : "w3",
                      wd = qmoe ? "down_proj" : "w2";
    p += "\n# MoE: the router is the HF gate; each expert's SwiGLU fc1 is [gate; up] (" + wg +
         "; " + wu + "),\n# fc2 is " + wd + "; Megatron stacks the " + num(experts) +
         " experts on axis 0\n";
    p += L + "mlp.router.weight -> " + M + "gate.weight\n";
    if (qmoe) {
      p += L + "mlp.shared_experts.linear_fc1.weight -> " + M + "shared_expert.gate_proj.weight, " +
           M + "shared_expert.up_proj.weight, axis=0\n";
      p += L + "mlp.shared_experts.linear_fc2.weight -> " + M + "shared_expert.down_proj.weight\n";
      p += L + "mlp.shared_experts.gate_weight -> " + M + "shared_expert_gate.weight\n";
    }
    for (const char* fc : {"fc1", "fc2"}) {
      p += L + "mlp.experts.experts.linear_" + fc + ".weight ->";
      for (int64_t e = 0; e < experts; ++e) {
        p += std::string(e ? "," : "") + "\n    moe_" + fc + ".$LAYER_ID." + num(e);
      }
      p += ",\n    axis=0\n";
    }
    for (int64_t e = 0; e < experts; ++e) {
      const std::string id = ".$LAYER_ID." + num(e);
      const std::string X = M + "experts." + num(e) + ".";
      p += "moe_fc1" + id + " -> moe_fc1_view" + id + ", shape='" + ShapeText({2 * ffn, hidden}) +
           "'\n";
      p += "moe_fc1_view" + id + " -> " + X + wg + ".weight, " + X + wu + ".weight, axis=0\n";
      p += "moe_fc2" + id + " -> " + X + wd + ".weight, shape='" + ShapeText({hidden, ffn}) + "'\n";
    }
    return p;
  }
  p += "\n# MLP: SwiGLU fc1 is [gate; up] as fc reads it (any TP degree)\n";
  p += L + "mlp.linear_fc1.weight -> " + H + "mlp.gate_proj.weight, " + H +
       "mlp.up_proj.weight, axis=0\n";
  p += L + "mlp.linear_fc2.weight -> " + H + "mlp.down_proj.weight\n";
  return p;
}

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

// The source with pre-Core names given their Megatron-Core names, and the program
// identifiers to spell back (core -> pre-Core, per-layer names with $LAYER_ID). Names that
// are neither stay as they are (the generator names them in its refusal).
struct CoreSpelling {
  HfSourceFacts source;
  std::map<std::string, std::string> respell;
  std::map<std::string, std::string> source_name;  // core name -> the source's, renamed only
};

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

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '$' ||
         c == '*' || c == '-';
}

// `program` with every identifier in `respell` replaced, comment lines left as they are.
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

const std::vector<std::string_view>& HfFamilyReverseNames() {
  static const std::vector<std::string_view> kNames = {"gpt2", "llama", "mixtral", "qwen2",
                                                       "qwen2-moe"};
  return kNames;
}

Result<std::string> GenerateHfFamilyReverseProgram(std::string_view family,
                                                   const HfReverseSource& source,
                                                   const HfTargetConfig& cfg,
                                                   const MegatronTargetFacts& target) {
  const std::string fam(family);
  const std::string where = "--from-hf-family " + fam;
  const auto& names = HfFamilyReverseNames();
  if (std::find(names.begin(), names.end(), family) == names.end()) {
    std::string known;
    for (std::string_view n : names) known += (known.empty() ? "" : ", ") + std::string(n);
    return InvalidArgumentError(where + ": no reverse program for this family (reverse: " +
                                known + ")");
  }
  auto mismatch = [&](const std::string& what) { return InvalidArgumentError(where + ": " + what); };
  auto num = [](int64_t v) { return std::to_string(v); };
  const bool gpt2 = fam == "gpt2";
  const bool qwen2 = fam == "qwen2";
  const bool qmoe = fam == "qwen2-moe";
  const bool mixtral = fam == "mixtral";
  const bool moe = mixtral || qmoe;
  const std::string type_text = gpt2    ? "gpt2"
                                : qwen2 ? "qwen2"
                                : qmoe  ? "qwen2_moe"
                                : mixtral ? "mixtral"
                                          : "llama or mistral";
  const std::set<std::string> types = gpt2    ? std::set<std::string>{"gpt2"}
                                      : qwen2 ? std::set<std::string>{"qwen2"}
                                      : qmoe  ? std::set<std::string>{"qwen2_moe"}
                                      : mixtral ? std::set<std::string>{"mixtral"}
                                                : std::set<std::string>{"llama", "mistral"};
  if (!types.count(cfg.model_type)) {
    return mismatch("config.json model_type is '" + cfg.model_type + "', family " + fam +
                    " takes " + type_text);
  }
  // config.json's names for the fields (GPT-2 has its own)
  const std::string k_hidden = gpt2 ? "n_embd" : "hidden_size";
  const std::string k_layers = gpt2 ? "n_layer" : "num_hidden_layers";
  const std::string k_heads = gpt2 ? "n_head" : "num_attention_heads";
  const std::string k_ffn = gpt2 ? "n_inner" : qmoe ? "moe_intermediate_size" : "intermediate_size";
  const std::string k_experts = qmoe ? "num_experts" : "num_local_experts";
  std::vector<std::pair<int64_t, std::string>> positive = {
      {cfg.vocab_size, "vocab_size"}, {cfg.hidden_size, k_hidden},
      {cfg.num_hidden_layers, k_layers}, {cfg.num_attention_heads, k_heads}};
  if (gpt2) positive.push_back({cfg.max_position_embeddings, "n_positions"});
  if (!gpt2 && !qmoe) positive.push_back({cfg.intermediate_size, "intermediate_size"});
  if (qmoe) {
    positive.push_back({cfg.moe_intermediate_size, "moe_intermediate_size"});
    positive.push_back({cfg.shared_expert_intermediate_size, "shared_expert_intermediate_size"});
  }
  if (moe) {
    positive.push_back({cfg.num_local_experts, k_experts});
    positive.push_back({cfg.num_experts_per_tok, "num_experts_per_tok"});
  }
  for (const auto& [v, k] : positive) {
    if (v <= 0) return mismatch("config.json has no positive " + k);
  }
  if (qmoe && (cfg.decoder_sparse_step > 1 || cfg.has_mlp_only_layers)) {
    return mismatch("config.json has dense MLP layers (decoder_sparse_step " +
                    num(cfg.decoder_sparse_step) +
                    ", mlp_only_layers); fc maps Qwen2-MoE models whose every MLP is a MoE layer");
  }
  const int64_t hidden = cfg.hidden_size, heads = cfg.num_attention_heads,
                layers = cfg.num_hidden_layers;
  // GPT-2: one K/V head per query head, head_dim n_embd / n_head, n_inner 4 x n_embd by default
  const int64_t groups = !gpt2 && cfg.num_key_value_heads > 0 ? cfg.num_key_value_heads : heads;
  if (heads % groups != 0) {
    return mismatch("config.json num_attention_heads " + num(heads) +
                    " is not a multiple of num_key_value_heads " + num(groups));
  }
  if ((gpt2 || cfg.head_dim <= 0) && hidden % heads != 0) {
    return mismatch("config.json " + k_hidden + " " + num(hidden) + " does not divide by " +
                    k_heads + " " + num(heads) + (gpt2 ? "" : " and there is no head_dim"));
  }
  const int64_t hd = !gpt2 && cfg.head_dim > 0 ? cfg.head_dim : hidden / heads;
  const int64_t ffn = gpt2   ? (cfg.intermediate_size > 0 ? cfg.intermediate_size : 4 * hidden)
                      : qmoe ? cfg.moe_intermediate_size
                             : cfg.intermediate_size;
  const int64_t experts = moe ? cfg.num_local_experts : 0;
  const int64_t shared = qmoe ? cfg.shared_expert_intermediate_size : 0;
  const bool qkv_bias = gpt2 || qwen2 || (qmoe && cfg.qkv_bias.value_or(true)) ||
                        cfg.attention_bias.value_or(false);
  if ((fam == "llama" || mixtral) && qkv_bias) {
    return mismatch("config.json attention_bias is true: the model's o_proj then has a bias, "
                    "which Megatron's linear_proj here does not");
  }
  if (!gpt2 && cfg.mlp_bias.value_or(false)) {
    return mismatch("config.json mlp_bias is true; Megatron's SwiGLU MLP here has no biases");
  }
  if (gpt2) {
    // Megatron-Core GPT's GeLU: the exact form, or the tanh form with --openai-gelu; the
    // weights are the same either way (the target's args decide which one it runs).
    const std::string act = cfg.activation_function.value_or("gelu_new");
    if (act != "gelu" && act != "gelu_new" && act != "gelu_pytorch_tanh") {
      return mismatch("config.json activation_function is '" + act +
                      "'; Megatron-Core GPT's MLP here is a GeLU (gelu, gelu_new)");
    }
  }

  // Every HF tensor the family has, with its shape from config.json.
  std::map<std::string, Shape> want;
  const std::string emb_hf = gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  want[emb_hf] = {cfg.vocab_size, hidden};
  if (!cfg.tie_word_embeddings) want["lm_head.weight"] = {cfg.vocab_size, hidden};
  if (gpt2) {
    want["transformer.wpe.weight"] = {cfg.max_position_embeddings, hidden};
    want["transformer.ln_f.weight"] = {hidden};
    want["transformer.ln_f.bias"] = {hidden};
  } else {
    want["model.norm.weight"] = {hidden};
  }
  // Qwen2-MoE's MoE names live under "mlp.", Mixtral's under "block_sparse_moe."
  const std::string moe_at = qmoe ? "mlp." : "block_sparse_moe.";
  const std::string wg = qmoe ? "gate_proj" : "w1", wu = qmoe ? "up_proj" : "w3",
                    wd = qmoe ? "down_proj" : "w2";
  for (int64_t i = 0; i < layers; ++i) {
    if (gpt2) {
      const std::string h = "transformer.h." + num(i) + ".";
      for (const char* n : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias",
                            "attn.c_proj.bias", "mlp.c_proj.bias"}) {
        want[h + n] = {hidden};
      }
      want[h + "attn.c_attn.weight"] = {hidden, 3 * hidden};
      want[h + "attn.c_attn.bias"] = {3 * hidden};
      want[h + "attn.c_proj.weight"] = {hidden, hidden};
      want[h + "mlp.c_fc.weight"] = {hidden, ffn};
      want[h + "mlp.c_fc.bias"] = {ffn};
      want[h + "mlp.c_proj.weight"] = {ffn, hidden};
      continue;
    }
    const std::string h = "model.layers." + num(i) + ".";
    want[h + "input_layernorm.weight"] = {hidden};
    want[h + "post_attention_layernorm.weight"] = {hidden};
    want[h + "self_attn.q_proj.weight"] = {heads * hd, hidden};
    want[h + "self_attn.k_proj.weight"] = {groups * hd, hidden};
    want[h + "self_attn.v_proj.weight"] = {groups * hd, hidden};
    if (qkv_bias) {
      want[h + "self_attn.q_proj.bias"] = {heads * hd};
      want[h + "self_attn.k_proj.bias"] = {groups * hd};
      want[h + "self_attn.v_proj.bias"] = {groups * hd};
    }
    want[h + "self_attn.o_proj.weight"] = {hidden, heads * hd};
    if (!moe) {
      want[h + "mlp.gate_proj.weight"] = {ffn, hidden};
      want[h + "mlp.up_proj.weight"] = {ffn, hidden};
      want[h + "mlp.down_proj.weight"] = {hidden, ffn};
      continue;
    }
    const std::string m = h + moe_at;
    want[m + "gate.weight"] = {experts, hidden};
    for (int64_t e = 0; e < experts; ++e) {
      const std::string x = m + "experts." + num(e) + ".";
      want[x + wg + ".weight"] = {ffn, hidden};
      want[x + wu + ".weight"] = {ffn, hidden};
      want[x + wd + ".weight"] = {hidden, ffn};
    }
    if (qmoe) {
      want[m + "shared_expert.gate_proj.weight"] = {shared, hidden};
      want[m + "shared_expert.up_proj.weight"] = {shared, hidden};
      want[m + "shared_expert.down_proj.weight"] = {hidden, shared};
      want[m + "shared_expert_gate.weight"] = {1, hidden};
    }
  }
  std::string cfg_text = "config.json (" + k_hidden + " " + num(hidden) + ", " + k_heads + " " +
                         num(heads);
  if (!gpt2) cfg_text += ", num_key_value_heads " + num(groups) + ", head_dim " + num(hd);
  cfg_text += ", " + k_ffn + " " + num(ffn);
  if (gpt2) cfg_text += ", n_positions " + num(cfg.max_position_embeddings);
  if (moe) cfg_text += ", " + k_experts + " " + num(experts);
  if (qmoe) cfg_text += ", shared_expert_intermediate_size " + num(shared);
  cfg_text += ", vocab_size " + num(cfg.vocab_size) + ")";
  std::set<std::string> seen;
  for (const HfSourceFacts::Tensor& t : source.tensors) {
    auto it = want.find(t.name);
    if (it == want.end()) {
      if (t.name == "lm_head.weight") {
        return mismatch("the source has lm_head.weight, config.json tie_word_embeddings is true");
      }
      return UnimplementedError(where + ": the source tensor '" + t.name +
                                "' has no place in a Megatron-Core GPT of family " + fam + " with " +
                                num(layers) + " layers (config.json " + k_layers + ")" +
                                (moe ? " and " + num(experts) + " experts (config.json " +
                                           k_experts + ")"
                                     : "") +
                                (t.name.find("bias") != std::string::npos
                                     ? " and config.json's biases"
                                     : ""));
    }
    if (t.shape != it->second) {
      return mismatch(t.name + " is " + ShapeText(t.shape) + ", " + cfg_text + " needs " +
                      ShapeText(it->second));
    }
    seen.insert(t.name);
  }
  for (const auto& [name, shape] : want) {
    if (!seen.count(name)) {
      return mismatch("the source has no " + name + " (" + ShapeText(shape) + "), which " +
                      (name == "lm_head.weight" ? "config.json tie_word_embeddings false"
                                                : "config.json") +
                      " implies");
    }
  }
  const int64_t padded = target.padded_vocab_size > 0 ? target.padded_vocab_size : cfg.vocab_size;
  if (padded < cfg.vocab_size) {
    return mismatch("the target's embedding has " + num(padded) + " rows, fewer than config.json "
                    "vocab_size " + num(cfg.vocab_size));
  }
  const int64_t pad = padded - cfg.vocab_size;
  if (pad > 0 && source.embedding_dtype.empty()) {
    return mismatch("padding the vocabulary needs the embedding's dtype");
  }

  // The Megatron-Core tensors the program makes: the model's own, and one layer's (by the
  // suffix after "decoder.layers.[i.]", shapes without the layer axis).
  const bool local1 = target.local_norm_names;
  const bool local2 = target.local_pre_mlp_norm.value_or(local1);
  const std::string norm1 = local1 ? "input_layernorm." : "self_attention.linear_qkv.layer_norm_";
  const std::string norm2 = local2 ? "pre_mlp_layernorm." : "mlp.linear_fc1.layer_norm_";
  // (TE's fused-norm names are layer_norm_weight / layer_norm_bias, the local spec's
  // weight / bias)
  const std::string norm1w = norm1 + "weight", norm1b = norm1 + "bias";
  const std::string norm2w = norm2 + "weight", norm2b = norm2 + "bias";
  std::vector<std::pair<std::string, Shape>> top_out = {
      {"embedding.word_embeddings.weight", {padded, hidden}},
      {"decoder.final_layernorm.weight", {hidden}}};
  if (!cfg.tie_word_embeddings) top_out.push_back({"output_layer.weight", {padded, hidden}});
  if (gpt2) {
    top_out.push_back({"embedding.position_embeddings.weight", {cfg.max_position_embeddings, hidden}});
    top_out.push_back({"decoder.final_layernorm.bias", {hidden}});
  }
  const int64_t qkv_rows = (heads + 2 * groups) * hd;
  std::vector<std::pair<std::string, Shape>> layer_out = {
      {norm1w, {hidden}},
      {"self_attention.linear_qkv.weight", {qkv_rows, hidden}},
      {"self_attention.linear_proj.weight", {hidden, heads * hd}},
      {norm2w, {hidden}}};
  if (qkv_bias) layer_out.push_back({"self_attention.linear_qkv.bias", {qkv_rows}});
  if (gpt2) {
    for (const std::string& s : {norm1b, norm2b, std::string("self_attention.linear_proj.bias"),
                                 std::string("mlp.linear_fc2.bias")}) {
      layer_out.push_back({s, {hidden}});
    }
    layer_out.push_back({"mlp.linear_fc1.weight", {ffn, hidden}});
    layer_out.push_back({"mlp.linear_fc1.bias", {ffn}});
    layer_out.push_back({"mlp.linear_fc2.weight", {hidden, ffn}});
  } else if (!moe) {
    layer_out.push_back({"mlp.linear_fc1.weight", {2 * ffn, hidden}});
    layer_out.push_back({"mlp.linear_fc2.weight", {hidden, ffn}});
  } else {
    layer_out.push_back({"mlp.router.weight", {experts, hidden}});
    layer_out.push_back({"mlp.experts.experts.linear_fc1.weight", {experts, 2 * ffn, hidden}});
    layer_out.push_back({"mlp.experts.experts.linear_fc2.weight", {experts, hidden, ffn}});
    if (qmoe) {
      layer_out.push_back({"mlp.shared_experts.linear_fc1.weight", {2 * shared, hidden}});
      layer_out.push_back({"mlp.shared_experts.linear_fc2.weight", {hidden, shared}});
      layer_out.push_back({"mlp.shared_experts.gate_weight", {1, hidden}});
    }
  }

  // The target's own tensors (--target-like) against what config.json gives.
  std::map<std::string, Shape> target_shapes;
  for (const HfSourceFacts::Tensor& t : target.tensors) {
    if (t.name.rfind("optimizer.", 0) != 0) target_shapes[t.name] = t.shape;
  }
  if (!target_shapes.empty()) {
    int64_t target_layers = 0;
    std::string layer_witness;
    for (const auto& [name, shape] : target_shapes) {
      const std::string prefix = "decoder.layers.";
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string rest = name.substr(prefix.size());
      const size_t dot = rest.find('.');
      if (dot != std::string::npos && IsDigits(rest.substr(0, dot))) {
        target_layers = std::max<int64_t>(target_layers, std::stoll(rest.substr(0, dot)) + 1);
        if (layer_witness.empty()) layer_witness = "per-layer keys decoder.layers.<i>.*";
      } else if (target.stacked_layers && !shape.empty() && target_layers == 0) {
        target_layers = shape[0];
        layer_witness = name + " " + ShapeText(shape);
      }
    }
    if (target_layers > 0 && target_layers != layers) {
      return mismatch("the target (--target-like) has " + num(target_layers) + " layers (" +
                      layer_witness + "), config.json " + k_layers + " is " + num(layers));
    }
    if (moe) {
      for (const auto& [name, shape] : target_shapes) {
        if (name.ends_with("mlp.router.weight") && shape.size() >= 2 &&
            shape[shape.size() - 2] != experts) {
          return mismatch("the target's MoE layers have " + num(shape[shape.size() - 2]) +
                          " experts (" + name + " " + ShapeText(shape) + "), config.json " +
                          k_experts + " is " + num(experts));
        }
      }
    }
    auto check = [&](const std::string& name, const Shape& shape) -> Status {
      auto it = target_shapes.find(name);
      if (it == target_shapes.end()) {
        return mismatch("the target (--target-like) has no " + name + ", which " +
                        (name == "output_layer.weight"
                             ? std::string("config.json tie_word_embeddings false")
                             : cfg_text) +
                        " gives (" + ShapeText(shape) + ")");
      }
      if (it->second != shape) {
        return mismatch("the target's " + name + " is " + ShapeText(it->second) + ", " + cfg_text +
                        " gives " + ShapeText(shape));
      }
      return Status::Ok();
    };
    for (const auto& [name, shape] : top_out) FC_RETURN_IF_ERROR(check(name, shape));
    for (const auto& [suffix, shape] : layer_out) {
      if (target.stacked_layers) {
        Shape s = shape;
        s.insert(s.begin(), layers);
        FC_RETURN_IF_ERROR(check("decoder.layers." + suffix, s));
      } else {
        for (int64_t i = 0; i < layers; ++i) {
          FC_RETURN_IF_ERROR(check("decoder.layers." + num(i) + "." + suffix, shape));
        }
      }
    }
    if (cfg.tie_word_embeddings && target_shapes.count("output_layer.weight")) {
      return mismatch("the target has its own output_layer.weight (untied), config.json "
                      "tie_word_embeddings is true");
    }
  }

  // The program.
  std::string p;
  p += "# HuggingFace " + fam + " -> Megatron-Core GPT (generated by --from-hf-family " + fam + ")\n";
  p += "# config.json: " + num(layers) + " layers, hidden " + num(hidden) + ", " + num(heads) +
       " heads, " + num(groups) + " KV heads, head_dim " + num(hd) + ", " + k_ffn + " " +
       num(ffn) + (moe ? ", " + num(experts) + " experts" : "") +
       (qmoe ? ", shared expert " + num(shared) : "") + ", vocab_size " + num(cfg.vocab_size) +
       "\n";
  p += "# target: " + std::string(target.stacked_layers ? "layer-stacked" : "per-layer") +
       " keys, " + (local1 ? "local-spec" : "Transformer Engine") + " norm names" +
       (local1 != local2 ? std::string(" (the MLP's: ") + (local2 ? "local-spec" : "TE") + ")"
                         : std::string()) +
       ", vocabulary " + num(padded) + " rows\n\n";
  auto vocab = [&](const std::string& from, const std::string& to, const std::string& tmp) {
    if (pad == 0) {
      p += from + " -> " + to + "\n";
      return;
    }
    p += "_ -> " + tmp + ", shape='" + ShapeText({pad, hidden}) + "', dtype='" +
         source.embedding_dtype + "', fill=0\n";
    p += from + ", " + tmp + " -> " + to + ", axis=0\n";
  };
  if (pad > 0) p += "# pad the vocabulary with " + num(pad) + " zero rows (Megatron's padding)\n";
  vocab(emb_hf, "embedding.word_embeddings.weight", "embed_pad");
  if (!cfg.tie_word_embeddings) vocab("lm_head.weight", "output_layer.weight", "lm_head_pad");
  const std::string L = target.stacked_layers ? "mg_layer.$LAYER_ID." : "decoder.layers.$LAYER_ID.";
  const std::string fused = ", fused_qkv, num_heads=" + num(heads) +
                            ", num_key_value_groups=" + num(groups) + ", axis=0\n";
  if (gpt2) {
    const std::string H = "transformer.h.$LAYER_ID.";
    p += "transformer.wpe.weight -> embedding.position_embeddings.weight\n";
    p += "transformer.ln_f.weight -> decoder.final_layernorm.weight\n";
    p += "transformer.ln_f.bias -> decoder.final_layernorm.bias\n";
    p += "\n# attention: HF's Conv1D weights are [in, out] (Megatron's transposed); c_attn is\n"
         "# [q; k; v], Megatron's QKV [q_h k_h v_h] per head\n";
    p += H + "ln_1.weight -> " + L + norm1w + "\n";
    p += H + "ln_1.bias -> " + L + norm1b + "\n";
    p += H + "attn.c_attn.weight -> gpt2_qkv.$LAYER_ID, permute='[1, 0]'\n";
    p += "gpt2_qkv.$LAYER_ID -> gpt2_q.$LAYER_ID, gpt2_k.$LAYER_ID, gpt2_v.$LAYER_ID, axis=0\n";
    p += "gpt2_q.$LAYER_ID, gpt2_k.$LAYER_ID, gpt2_v.$LAYER_ID ->\n    " + L +
         "self_attention.linear_qkv.weight" + fused;
    p += H + "attn.c_attn.bias -> gpt2_qb.$LAYER_ID, gpt2_kb.$LAYER_ID, gpt2_vb.$LAYER_ID, axis=0\n";
    p += "gpt2_qb.$LAYER_ID, gpt2_kb.$LAYER_ID, gpt2_vb.$LAYER_ID ->\n    " + L +
         "self_attention.linear_qkv.bias" + fused;
    p += H + "attn.c_proj.weight -> " + L + "self_attention.linear_proj.weight, permute='[1, 0]'\n";
    p += H + "attn.c_proj.bias -> " + L + "self_attention.linear_proj.bias\n";
    p += "\n# MLP (GeLU, no gate)\n";
    p += H + "ln_2.weight -> " + L + norm2w + "\n";
    p += H + "ln_2.bias -> " + L + norm2b + "\n";
    p += H + "mlp.c_fc.weight -> " + L + "mlp.linear_fc1.weight, permute='[1, 0]'\n";
    p += H + "mlp.c_fc.bias -> " + L + "mlp.linear_fc1.bias\n";
    p += H + "mlp.c_proj.weight -> " + L + "mlp.linear_fc2.weight, permute='[1, 0]'\n";
    p += H + "mlp.c_proj.bias -> " + L + "mlp.linear_fc2.bias\n";
  } else {
    const std::string H = "model.layers.$LAYER_ID.";
    p += "model.norm.weight -> decoder.final_layernorm.weight\n";
    p += "\n# attention: Megatron's QKV is grouped per query group (its " + num(heads / groups) +
         " query heads, K, V)\n";
    p += H + "input_layernorm.weight -> " + L + norm1w + "\n";
    p += H + "self_attn.q_proj.weight, " + H + "self_attn.k_proj.weight, " + H +
         "self_attn.v_proj.weight ->\n    " + L + "self_attention.linear_qkv.weight" + fused;
    if (qkv_bias) {
      p += H + "self_attn.q_proj.bias, " + H + "self_attn.k_proj.bias, " + H +
           "self_attn.v_proj.bias ->\n    " + L + "self_attention.linear_qkv.bias" + fused;
    }
    p += H + "self_attn.o_proj.weight -> " + L + "self_attention.linear_proj.weight\n";
    p += H + "post_attention_layernorm.weight -> " + L + norm2w + "\n";
    if (!moe) {
      p += "\n# MLP: SwiGLU fc1 is [gate; up] as torch_dist stores it globally (at any TP degree)\n";
      p += H + "mlp.gate_proj.weight, " + H + "mlp.up_proj.weight -> " + L +
           "mlp.linear_fc1.weight, axis=0\n";
      p += H + "mlp.down_proj.weight -> " + L + "mlp.linear_fc2.weight\n";
    } else {
      const std::string M = H + moe_at;
      p += "\n# MoE: the HF gate is the router; each expert's " + wg + " and " + wu +
           " make its SwiGLU fc1 [gate; up],\n# " + wd + " its fc2; Megatron stacks the " +
           num(experts) + " experts on axis 0\n";
      p += M + "gate.weight -> " + L + "mlp.router.weight\n";
      for (int64_t e = 0; e < experts; ++e) {
        const std::string id = ".$LAYER_ID." + num(e);
        const std::string X = M + "experts." + num(e) + ".";
        p += X + wg + ".weight, " + X + wu + ".weight -> moe_fc1" + id + ", axis=0\n";
        p += "moe_fc1" + id + " -> moe_fc1_one" + id + ", shape='" +
             ShapeText({1, 2 * ffn, hidden}) + "'\n";
        p += X + wd + ".weight -> moe_fc2_one" + id + ", shape='" + ShapeText({1, hidden, ffn}) +
             "'\n";
      }
      for (const char* fc : {"fc1", "fc2"}) {
        for (int64_t e = 0; e < experts; ++e) {
          p += std::string(e ? ",\n    " : "") + "moe_" + fc + "_one.$LAYER_ID." + num(e);
        }
        p += " ->\n    " + L + "mlp.experts.experts.linear_" + fc + ".weight, axis=0\n";
      }
      if (qmoe) {
        p += "\n# the shared expert (SwiGLU fc1 [gate; up]) and its sigmoid gate\n";
        p += M + "shared_expert.gate_proj.weight, " + M + "shared_expert.up_proj.weight -> " + L +
             "mlp.shared_experts.linear_fc1.weight, axis=0\n";
        p += M + "shared_expert.down_proj.weight -> " + L + "mlp.shared_experts.linear_fc2.weight\n";
        p += M + "shared_expert_gate.weight -> " + L + "mlp.shared_experts.gate_weight\n";
      }
    }
  }
  if (target.stacked_layers) {
    p += "\n# layer-stacked target: each layer's tensor gets a layer axis, then they are stacked\n";
    for (const auto& [suffix, shape] : layer_out) {
      Shape one = shape;
      one.insert(one.begin(), 1);
      p += L + suffix + " -> mg_stack.$LAYER_ID." + suffix + ", shape='" + ShapeText(one) + "'\n";
      for (int64_t i = 0; i < layers; ++i) {
        p += std::string(i ? ",\n    " : "") + "mg_stack." + num(i) + "." + suffix;
      }
      p += " ->\n    decoder.layers." + suffix + ", axis=0\n";
    }
  }
  return p;
}

}  // namespace fc::aoa
