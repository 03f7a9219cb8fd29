// --hf-family llama / qwen2 / mixtral / qwen2-moe: the Megatron-Core GPT -> HuggingFace
// program of the Llama-like families (hf_family_forward.h).
#include <map>
#include <set>
#include <vector>

#include "hf_family_forward.h"
#include "hf_source_model.h"

namespace fc::aoa::hf_family_internal {
namespace {

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

// A Llama-like family's facts, read from config.json and the source in steps, each checked
// against the other; then the program from them.
struct LlamaLikeFacts {
  const HfSourceFacts& source;
  const HfTargetConfig& cfg;
  const std::string fam;
  const std::string where = "--hf-family " + fam;
  bool qwen2 = false, qmoe = false, moe = false;
  int64_t heads = 0, groups = 0, head_dim = 0;  // config.json's attention
  SourceModel src;
  std::string norm1, norm2;  // the RMSNorms' names in the source's layers
  int64_t hidden = 0, padded_vocab = 0, qkv_rows = 0;
  int64_t ffn = 0, experts = 0;         // the MLP's (the experts' in MoE layers)
  std::string experts_key, ffn_key;     // their config.json names
  bool qkv_bias = false;                // the source's linear_qkv.bias
  bool has_output = false;              // untied output_layer.weight

  Status mismatch(const std::string& what) const { return InvalidArgumentError(where + ": " + what); }
  static std::string num(int64_t v) { return std::to_string(v); }

  // config.json: the family's model types and the fields every family needs.
  Status ReadConfig();
  // The source's tensors by role; the tensors the family's layers need.
  Status ReadLayers();
  // Layers, embedding, vocabulary, heads, query groups and head_dim against config.json.
  Status CheckAttention();
  // The MLP's sizes (the MoE layers' by CheckMoeLayers) against config.json.
  Status CheckMlp();
  Status CheckMoeLayers();
  // The QKV bias against the family and config.json; the output layer against
  // tie_word_embeddings.
  Status CheckBiasesAndOutput();
  std::string Program() const;
  // The MoE layers' statements (router, shared expert, experts), after `L` and `H`: a
  // layer's Megatron and HF name prefixes.
  std::string MoeProgram(const std::string& L, const std::string& H) const;
};

Status LlamaLikeFacts::ReadConfig() {
  qwen2 = fam == "qwen2";
  qmoe = fam == "qwen2-moe";
  moe = fam == "mixtral" || qmoe;
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
  heads = cfg.num_attention_heads;
  groups = cfg.num_key_value_heads > 0 ? cfg.num_key_value_heads : heads;
  if (heads % groups != 0) {
    return mismatch("config.json num_attention_heads " + std::to_string(heads) +
                    " is not a multiple of num_key_value_heads " + std::to_string(groups));
  }
  if (cfg.head_dim <= 0 && cfg.hidden_size % heads != 0) {
    return mismatch("config.json hidden_size " + std::to_string(cfg.hidden_size) +
                    " does not divide by num_attention_heads " + std::to_string(heads) +
                    " and there is no head_dim");
  }
  head_dim = cfg.head_dim > 0 ? cfg.head_dim : cfg.hidden_size / heads;
  return Status::Ok();
}

Status LlamaLikeFacts::ReadLayers() {
  FC_ASSIGN_OR_RETURN(
      src,
      ReadSource(source, where, fam,
                 "fc maps Megatron-Core GPT dense layers: fused QKV, SwiGLU MLP, RMSNorm",
                 [](const std::string& n) {
                   return n == "embedding.word_embeddings.weight" ||
                          n == "output_layer.weight" || n == "decoder.final_layernorm.weight";
                 },
                 [moe = moe, qmoe = qmoe](const std::string& suffix) {
                   return RoleOf(suffix) != nullptr && (moe || !IsMoeSuffix(suffix)) &&
                          (qmoe || !IsSharedExpertSuffix(suffix));
                 }));
  std::map<std::string, Shape>& layer = src.layer;
  auto need = [&](const std::string& a, const std::string& b) -> Result<std::string> {
    if (layer.count(a)) return a;
    if (layer.count(b)) return b;
    return UnimplementedError(where + ": the source's layers have no " + a + " (or " + b + ")");
  };
  FC_ASSIGN_OR_RETURN(norm1, need("self_attention.linear_qkv.layer_norm_weight",
                                  "input_layernorm.weight"));
  FC_ASSIGN_OR_RETURN(norm2, need("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"));
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
  return Status::Ok();
}

Status LlamaLikeFacts::CheckAttention() {
  std::map<std::string, Shape>& top = src.top;
  std::map<std::string, Shape>& layer = src.layer;
  const int64_t num_layers = src.num_layers;
  // Facts against config.json.
  if (num_layers != cfg.num_hidden_layers) {
    return mismatch("the source has " + num(num_layers) + " layers, config.json num_hidden_layers is " +
                    num(cfg.num_hidden_layers));
  }
  const Shape& emb = top["embedding.word_embeddings.weight"];
  if (emb.size() != 2) return mismatch("embedding.word_embeddings.weight is not 2-d: " + ShapeText(emb));
  hidden = emb[1];
  padded_vocab = emb[0];
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
  qkv_rows = (heads + 2 * groups) * head_dim;
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
  return Status::Ok();
}

Status LlamaLikeFacts::CheckMlp() {
  std::map<std::string, Shape>& layer = src.layer;
  // Qwen2-MoE: intermediate_size is its dense MLP's (no layer has one here); the experts'
  // is moe_intermediate_size.
  ffn = qmoe ? cfg.moe_intermediate_size : cfg.intermediate_size;
  experts = cfg.num_local_experts;
  experts_key = qmoe ? "num_experts" : "num_local_experts";
  ffn_key = qmoe ? "moe_intermediate_size" : "intermediate_size";
  if (moe) FC_RETURN_IF_ERROR(CheckMoeLayers());
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
  return Status::Ok();
}

Status LlamaLikeFacts::CheckMoeLayers() {
  std::map<std::string, Shape>& layer = src.layer;
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
  return Status::Ok();
}

Status LlamaLikeFacts::CheckBiasesAndOutput() {
  std::map<std::string, Shape>& layer = src.layer;
  qkv_bias = layer.count("self_attention.linear_qkv.bias") > 0;
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
  FC_ASSIGN_OR_RETURN(has_output, ReadUntiedOutput(src, cfg, where));
  return Status::Ok();
}

std::string LlamaLikeFacts::Program() const {
  const std::map<std::string, Shape>& stacked = src.stacked;
  const int64_t num_layers = src.num_layers;
  std::string p;
  p += "# Megatron-Core GPT -> HuggingFace " + fam + " (generated by --hf-family " + fam + ")\n";
  p += "# source: " + num(num_layers) + " layers" +
       (stacked.empty() ? std::string(" (per-layer keys)") : std::string(" (layer-stacked keys)")) +
       ", hidden " + num(hidden) + ", vocabulary " + num(padded_vocab) + " rows\n";
  p += "# config.json: " + num(heads) + " heads, " + num(groups) + " KV heads, head_dim " +
       num(head_dim) + ", intermediate_size " + num(ffn) + ", vocab_size " + num(cfg.vocab_size) +
       "\n\n";
  p += VocabRows(cfg.vocab_size, padded_vocab, "model.embed_tokens.weight", "embed_pad", has_output);
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
    p += MoeProgram(L, H);
    return p;
  }
  p += "\n# MLP: SwiGLU fc1 is [gate; up] as fc reads it (any TP degree)\n";
  p += L + "mlp.linear_fc1.weight -> " + H + "mlp.gate_proj.weight, " + H +
       "mlp.up_proj.weight, axis=0\n";
  p += L + "mlp.linear_fc2.weight -> " + H + "mlp.down_proj.weight\n";
  return p;
}

std::string LlamaLikeFacts::MoeProgram(const std::string& L, const std::string& H) const {
  std::string p;
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

}  // namespace

Result<std::string> LlamaLikeProgram(const std::string& fam, const HfSourceFacts& source,
                                     const HfTargetConfig& cfg) {
  LlamaLikeFacts facts{source, cfg, fam};
  FC_RETURN_IF_ERROR(facts.ReadConfig());
  FC_RETURN_IF_ERROR(facts.ReadLayers());
  FC_RETURN_IF_ERROR(facts.CheckAttention());
  FC_RETURN_IF_ERROR(facts.CheckMlp());
  FC_RETURN_IF_ERROR(facts.CheckBiasesAndOutput());
  return facts.Program();
}

}  // namespace fc::aoa::hf_family_internal
