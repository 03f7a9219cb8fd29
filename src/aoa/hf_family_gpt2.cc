// --hf-family gpt2: the Megatron-Core GPT -> HuggingFace GPT-2 program (hf_family_forward.h).
#include <map>

#include "hf_family_forward.h"
#include "hf_source_model.h"

namespace fc::aoa::hf_family_internal {
namespace {

// The GPT-2 layer tensors (suffixes after "decoder.layers.[i.]").
constexpr const char* kGpt2LayerSuffixes[] = {
    "self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
    "input_layernorm.weight", "input_layernorm.bias",
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
    "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
    "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias",
    "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
    "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"};

// GPT-2's facts, read from config.json and the source in steps, each checked against the
// other; then the program from them.
struct Gpt2Facts {
  const HfSourceFacts& source;
  const HfTargetConfig& cfg;
  const std::string where = "--hf-family gpt2";
  SourceModel src;
  int64_t hidden = 0, heads = 0, ffn = 0, padded_vocab = 0;
  std::string ln1w, ln1b, ln2w, ln2b;  // the LayerNorms' names in the source's layers
  std::string act;                     // config.json activation_function
  bool has_output = false;             // untied output_layer.weight

  Status mismatch(const std::string& what) const { return InvalidArgumentError(where + ": " + what); }
  static std::string num(int64_t v) { return std::to_string(v); }

  // config.json's model type and sizes; the source's tensors by role.
  Status ReadConfigAndSource();
  // The LayerNorms' weight and bias (TE's fused or the local spec's names), positions and
  // the final LayerNorm's bias.
  Status FindNorms();
  // Layers, embedding, vocabulary, positions and the Megatron args against config.json.
  Status CheckModel();
  // Each layer tensor's shape from config.json; the output layer against tie_word_embeddings.
  Status CheckLayers();
  std::string Program() const;
};

Status Gpt2Facts::ReadConfigAndSource() {
  if (cfg.model_type != "gpt2") {
    return mismatch("config.json model_type is '" + cfg.model_type + "', family gpt2 takes gpt2");
  }
  for (auto [v, k] : {std::pair{cfg.vocab_size, "vocab_size"}, {cfg.hidden_size, "n_embd"},
                      {cfg.num_hidden_layers, "n_layer"}, {cfg.num_attention_heads, "n_head"},
                      {cfg.max_position_embeddings, "n_positions"}}) {
    if (v <= 0) return mismatch(std::string("config.json has no positive ") + k);
  }
  FC_ASSIGN_OR_RETURN(
      src,
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
  hidden = cfg.hidden_size;
  heads = cfg.num_attention_heads;
  ffn = cfg.intermediate_size > 0 ? cfg.intermediate_size : 4 * hidden;
  if (hidden % heads != 0) {
    return mismatch("config.json n_embd " + num(hidden) + " does not divide by n_head " + num(heads));
  }
  return Status::Ok();
}

Status Gpt2Facts::FindNorms() {
  std::map<std::string, Shape>& top = src.top;
  std::map<std::string, Shape>& layer = src.layer;
  auto pick = [&](const std::string& a, const std::string& b) -> Result<std::string> {
    if (layer.count(a)) return a;
    if (layer.count(b)) return b;
    return UnimplementedError(where + ": the source's layers have no " + a + " (or " + b +
                              "); GPT-2's LayerNorms have weight and bias");
  };
  FC_ASSIGN_OR_RETURN(ln1w, pick("self_attention.linear_qkv.layer_norm_weight",
                                "input_layernorm.weight"));
  FC_ASSIGN_OR_RETURN(ln1b, pick("self_attention.linear_qkv.layer_norm_bias",
                                "input_layernorm.bias"));
  FC_ASSIGN_OR_RETURN(ln2w, pick("mlp.linear_fc1.layer_norm_weight",
                                "pre_mlp_layernorm.weight"));
  FC_ASSIGN_OR_RETURN(ln2b, pick("mlp.linear_fc1.layer_norm_bias",
                                "pre_mlp_layernorm.bias"));
  for (const char* name : {"embedding.position_embeddings.weight", "decoder.final_layernorm.bias"}) {
    if (!top.count(name)) {
      return UnimplementedError(where + ": the source has no " + std::string(name) +
                                " (GPT-2 has learned absolute positions and LayerNorm biases)");
    }
  }
  return Status::Ok();
}

Status Gpt2Facts::CheckModel() {
  std::map<std::string, Shape>& top = src.top;
  if (src.num_layers != cfg.num_hidden_layers) {
    return mismatch("the source has " + num(src.num_layers) + " layers, config.json n_layer is " +
                    num(cfg.num_hidden_layers));
  }
  const Shape& emb = top["embedding.word_embeddings.weight"];
  if (emb.size() != 2 || emb[1] != hidden) {
    return mismatch("embedding.word_embeddings.weight is " + ShapeText(emb) +
                    ", config.json n_embd is " + num(hidden));
  }
  padded_vocab = emb[0];
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
  act = cfg.activation_function.value_or("gelu_new");
  if (act != want_act && !(want_act == "gelu_new" && act == "gelu_pytorch_tanh")) {
    return mismatch("config.json activation_function is '" + act + "'" +
                    (cfg.activation_function ? "" : " (GPT2Config's default)") +
                    "; the source's GeLU is " +
                    (want_act == "gelu" ? "the exact (erf) form Megatron uses without "
                                          "--openai-gelu: set \"activation_function\": \"gelu\""
                                        : "the tanh form (args.openai_gelu): gelu_new") );
  }
  return Status::Ok();
}

Status Gpt2Facts::CheckLayers() {
  std::map<std::string, Shape>& layer = src.layer;
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
  FC_ASSIGN_OR_RETURN(has_output, ReadUntiedOutput(src, cfg, where));
  return Status::Ok();
}

std::string Gpt2Facts::Program() const {
  std::string p;
  p += "# Megatron-Core GPT -> HuggingFace gpt2 (generated by --hf-family gpt2)\n";
  p += "# source: " + num(src.num_layers) + " layers" +
       (src.stacked.empty() ? std::string(" (per-layer keys)") : std::string(" (layer-stacked keys)")) +
       ", hidden " + num(hidden) + ", vocabulary " + num(padded_vocab) + " rows, " +
       num(cfg.max_position_embeddings) + " positions\n";
  p += "# config.json: " + num(heads) + " heads, n_inner " + num(ffn) + ", vocab_size " +
       num(cfg.vocab_size) + ", activation_function " + act + "\n\n";
  p += VocabRows(cfg.vocab_size, padded_vocab, "transformer.wte.weight", "wte_pad", has_output);
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

// --hf-family gpt2: learned absolute positions, LayerNorm with bias, biased linears, GeLU, HF
// Conv1D weights ([in, out]: Megatron's transposed), c_attn = [q; k; v] (Megatron's QKV is
// grouped per head: [q_h k_h v_h] for each head h).
Result<std::string> Gpt2Program(const HfSourceFacts& source, const HfTargetConfig& cfg) {
  Gpt2Facts facts{source, cfg};
  FC_RETURN_IF_ERROR(facts.ReadConfigAndSource());
  FC_RETURN_IF_ERROR(facts.FindNorms());
  FC_RETURN_IF_ERROR(facts.CheckModel());
  FC_RETURN_IF_ERROR(facts.CheckLayers());
  return facts.Program();
}

}  // namespace fc::aoa::hf_family_internal
