// --from-hf-family: the HuggingFace -> Megatron-Core GPT AOA program of each family
// (fc/aoa/hf_family.h), the inverse of its --hf-family program.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "fc/aoa/hf_family.h"
#include "hf_source_model.h"

namespace fc::aoa {
namespace {

using hf_family_internal::IsDigits;
using hf_family_internal::ShapeText;

// A family's facts from config.json, the HF tensors they imply and the Megatron-Core tensors
// the program makes, read in steps, each checked against the HF checkpoint and the target;
// then the program from them.
struct ReverseFacts {
  const HfReverseSource& source;
  const HfTargetConfig& cfg;
  const MegatronTargetFacts& target;
  const std::string fam;
  const std::string where = "--from-hf-family " + fam;
  bool gpt2 = false, qwen2 = false, qmoe = false, mixtral = false, moe = false;
  // config.json's names for the fields (GPT-2 has its own)
  std::string k_hidden, k_layers, k_heads, k_ffn, k_experts;
  int64_t hidden = 0, heads = 0, layers = 0, groups = 0, hd = 0, ffn = 0, experts = 0, shared = 0;
  bool qkv_bias = false;
  // HF names: the embedding, where the MoE layers live and the experts' gate / up / down
  std::string emb_hf, moe_at, wg, wu, wd;
  std::map<std::string, Shape> want;  // every HF tensor the family has, shaped by config.json
  std::string cfg_text;               // config.json's sizes, for the messages
  int64_t padded = 0, pad = 0;        // the target's vocabulary rows, the padding among them
  // The Megatron norms: local-spec or Transformer Engine names, attention's and the MLP's
  bool local1 = false, local2 = false;
  std::string norm1w, norm1b, norm2w, norm2b;
  // The Megatron-Core tensors the program makes: the model's own, and one layer's (by the
  // suffix after "decoder.layers.[i.]", shapes without the layer axis).
  std::vector<std::pair<std::string, Shape>> top_out, layer_out;

  Status mismatch(const std::string& what) const { return InvalidArgumentError(where + ": " + what); }
  static std::string num(int64_t v) { return std::to_string(v); }

  // The family's model types and config.json's field names; the fields it needs positive.
  Status ReadConfigKeys();
  // config.json's sizes, biases and activation, checked against the family.
  Status ReadSizes();
  void ListHfTensors();
  // The HF checkpoint's tensors against `want`; the target's vocabulary padding.
  Status CheckHfTensors();
  void ListMegatronTensors();
  // The target's own tensors (--target-like) against what config.json gives.
  Status CheckTarget() const;
  std::string Program() const;
  // One layer's statements, after `L` (the Megatron layer prefix) and `fused` (the fused_qkv
  // arguments); the MoE layers' after `H` (the HF layer prefix) too.
  std::string Gpt2LayerProgram(const std::string& L, const std::string& fused) const;
  std::string LlamaLayerProgram(const std::string& L, const std::string& fused) const;
  std::string MoeLayerProgram(const std::string& L, const std::string& H) const;
};

Status ReverseFacts::ReadConfigKeys() {
  gpt2 = fam == "gpt2";
  qwen2 = fam == "qwen2";
  qmoe = fam == "qwen2-moe";
  mixtral = fam == "mixtral";
  moe = mixtral || qmoe;
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
  k_hidden = gpt2 ? "n_embd" : "hidden_size";
  k_layers = gpt2 ? "n_layer" : "num_hidden_layers";
  k_heads = gpt2 ? "n_head" : "num_attention_heads";
  k_ffn = gpt2 ? "n_inner" : qmoe ? "moe_intermediate_size" : "intermediate_size";
  k_experts = qmoe ? "num_experts" : "num_local_experts";
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
  return Status::Ok();
}

Status ReverseFacts::ReadSizes() {
  hidden = cfg.hidden_size;
  heads = cfg.num_attention_heads;
  layers = cfg.num_hidden_layers;
  // GPT-2: one K/V head per query head, head_dim n_embd / n_head, n_inner 4 x n_embd by default
  groups = !gpt2 && cfg.num_key_value_heads > 0 ? cfg.num_key_value_heads : heads;
  if (heads % groups != 0) {
    return mismatch("config.json num_attention_heads " + num(heads) +
                    " is not a multiple of num_key_value_heads " + num(groups));
  }
  if ((gpt2 || cfg.head_dim <= 0) && hidden % heads != 0) {
    return mismatch("config.json " + k_hidden + " " + num(hidden) + " does not divide by " +
                    k_heads + " " + num(heads) + (gpt2 ? "" : " and there is no head_dim"));
  }
  hd = !gpt2 && cfg.head_dim > 0 ? cfg.head_dim : hidden / heads;
  ffn = gpt2   ? (cfg.intermediate_size > 0 ? cfg.intermediate_size : 4 * hidden)
        : qmoe ? cfg.moe_intermediate_size
               : cfg.intermediate_size;
  experts = moe ? cfg.num_local_experts : 0;
  shared = qmoe ? cfg.shared_expert_intermediate_size : 0;
  qkv_bias = gpt2 || qwen2 || (qmoe && cfg.qkv_bias.value_or(true)) ||
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
  return Status::Ok();
}

void ReverseFacts::ListHfTensors() {
  // Every HF tensor the family has, with its shape from config.json.
  emb_hf = gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
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
  moe_at = qmoe ? "mlp." : "block_sparse_moe.";
  wg = qmoe ? "gate_proj" : "w1";
  wu = qmoe ? "up_proj" : "w3";
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
}

Status ReverseFacts::CheckHfTensors() {
  cfg_text = "config.json (" + k_hidden + " " + num(hidden) + ", " + k_heads + " " +
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
  padded = target.padded_vocab_size > 0 ? target.padded_vocab_size : cfg.vocab_size;
  if (padded < cfg.vocab_size) {
    return mismatch("the target's embedding has " + num(padded) + " rows, fewer than config.json "
                    "vocab_size " + num(cfg.vocab_size));
  }
  pad = padded - cfg.vocab_size;
  if (pad > 0 && source.embedding_dtype.empty()) {
    return mismatch("padding the vocabulary needs the embedding's dtype");
  }
  return Status::Ok();
}

void ReverseFacts::ListMegatronTensors() {
  local1 = target.local_norm_names;
  local2 = target.local_pre_mlp_norm.value_or(local1);
  const std::string norm1 = local1 ? "input_layernorm." : "self_attention.linear_qkv.layer_norm_";
  const std::string norm2 = local2 ? "pre_mlp_layernorm." : "mlp.linear_fc1.layer_norm_";
  // (TE's fused-norm names are layer_norm_weight / layer_norm_bias, the local spec's
  // weight / bias)
  norm1w = norm1 + "weight";
  norm1b = norm1 + "bias";
  norm2w = norm2 + "weight";
  norm2b = norm2 + "bias";
  top_out = {
      {"embedding.word_embeddings.weight", {padded, hidden}},
      {"decoder.final_layernorm.weight", {hidden}}};
  if (!cfg.tie_word_embeddings) top_out.push_back({"output_layer.weight", {padded, hidden}});
  if (gpt2) {
    top_out.push_back({"embedding.position_embeddings.weight", {cfg.max_position_embeddings, hidden}});
    top_out.push_back({"decoder.final_layernorm.bias", {hidden}});
  }
  const int64_t qkv_rows = (heads + 2 * groups) * hd;
  layer_out = {
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
}

Status ReverseFacts::CheckTarget() const {
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
  return Status::Ok();
}

std::string ReverseFacts::Program() const {
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
  p += gpt2 ? Gpt2LayerProgram(L, fused) : LlamaLayerProgram(L, fused);
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

std::string ReverseFacts::Gpt2LayerProgram(const std::string& L, const std::string& fused) const {
  std::string p;
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
  return p;
}

std::string ReverseFacts::LlamaLayerProgram(const std::string& L, const std::string& fused) const {
  std::string p;
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
    p += MoeLayerProgram(L, H);
  }
  return p;
}

std::string ReverseFacts::MoeLayerProgram(const std::string& L, const std::string& H) const {
  std::string p;
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
  return p;
}

}  // namespace

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
  ReverseFacts facts{source, cfg, target, fam};
  FC_RETURN_IF_ERROR(facts.ReadConfigKeys());
  FC_RETURN_IF_ERROR(facts.ReadSizes());
  facts.ListHfTensors();
  FC_RETURN_IF_ERROR(facts.CheckHfTensors());
  facts.ListMegatronTensors();
  FC_RETURN_IF_ERROR(facts.CheckTarget());
  return facts.Program();
}

}  // namespace fc::aoa
