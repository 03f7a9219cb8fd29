// fc-export / fc-convert --hf-family NAME: the AOA program that maps a Megatron-Core GPT
// checkpoint's names and fused layouts (torch_dist, layer-stacked or per-layer keys, and the
// legacy per-rank files as fc's readers name them) to a HuggingFace family's names, generated
// from the source's own facts (tensor shapes, Megatron args where saved) and the target's
// config.json. Pure: no IO.
#ifndef FC_AOA_HF_FAMILY_H_
#define FC_AOA_HF_FAMILY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fc/core/box.h"
#include "fc/core/status.h"

namespace fc::aoa {

// What the source says about the model.
struct HfSourceFacts {
  struct Tensor {
    std::string name;
    Shape shape;
  };
  std::vector<Tensor> tensors;  // every tensor; names starting "optimizer." are ignored
  // Megatron args (the megatron.args.<name> attributes without the prefix), may be empty.
  std::map<std::string, std::string> args;
};

// The fields of the target's config.json the families read (0 / nullopt: absent).
struct HfTargetConfig {
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // 0: num_attention_heads
  int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  int64_t intermediate_size = 0;
  bool tie_word_embeddings = false;
  std::optional<bool> attention_bias;
  std::optional<bool> mlp_bias;
  int64_t max_position_embeddings = 0;  // GPT-2: n_positions
  int64_t num_local_experts = 0;        // Mixtral; Qwen2-MoE: num_experts
  int64_t num_experts_per_tok = 0;      // Mixtral, Qwen2-MoE
  // Qwen2-MoE
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  std::optional<bool> norm_topk_prob;  // absent: false
  std::optional<bool> qkv_bias;        // absent: true
  int64_t decoder_sparse_step = 1;
  bool has_mlp_only_layers = false;    // a non-empty mlp_only_layers
  std::optional<std::string> activation_function;  // GPT-2
};

// The families fc generates programs for, each verified against a real Megatron-Core save
// and transformers: "llama" (Llama 2/3, Mistral: model_type llama or mistral; no biases, or
// config.json attention_bias with a QKV bias), "qwen2" (model_type qwen2: the QKV bias of
// Megatron's add_qkv_bias split into q/k/v_proj.bias with the weight's query grouping), "gpt2"
// (model_type gpt2: learned positions, LayerNorm and linear biases, GeLU; c_attn = [q; k; v]
// from Megatron's per-head QKV, Conv1D weights transposed). GPT-2's config.json names
// (n_embd, n_layer, n_head, n_inner, n_positions) fill the HfTargetConfig fields. "mixtral"
// (model_type mixtral: llama's attention, every MLP a MoE layer: Megatron's router ->
// block_sparse_moe.gate, the SequentialMLP experts' fc1 -> experts.<e>.w1 / w3, fc2 -> w2),
// "qwen2-moe" (model_type qwen2_moe: as mixtral with QKV bias, the names mlp.gate,
// mlp.experts.<e>.gate_proj / up_proj / down_proj, and the shared expert with its sigmoid
// gate: Megatron's shared_experts.linear_fc1 / linear_fc2 / gate_weight).
const std::vector<std::string_view>& HfFamilyNames();

// The AOA program (line form, with comments) for `family`. Errors: kInvalidArgument for an
// unknown family and for every disagreement between the source and config.json (layers,
// hidden size, heads / query groups / head_dim, vocabulary, FFN size, biases, tied
// embeddings), naming both values; kUnimplemented for a source that is not a Megatron-Core
// GPT checkpoint of that family (names it does not map: position embeddings, LayerNorm
// biases, MoE layers, ...), naming the tensor.
Result<std::string> GenerateHfFamilyProgram(std::string_view family, const HfSourceFacts& source,
                                            const HfTargetConfig& config);

// --from-hf-family NAME: the reverse, a HuggingFace checkpoint of `family` -> Megatron-Core
// GPT names and fused layouts (torch_dist's global tensors: linear_qkv grouped per query
// group [q.. k v], linear_fc1 = [gate; up] whole, which torch_dist keeps at every TP degree).
struct HfReverseSource {
  std::vector<HfSourceFacts::Tensor> tensors;  // the HF checkpoint's tensors
  // model.embed_tokens.weight's (GPT-2: transformer.wte.weight's) dtype name (vocabulary
  // padding)
  std::string embedding_dtype;
};
// What the Megatron target looks like (from --target-like; defaults otherwise).
struct MegatronTargetFacts {
  int64_t padded_vocab_size = 0;  // embedding rows; 0: the HF vocabulary, no padding
  // Transformer Engine names (linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight;
  // GPT-2's LayerNorms also layer_norm_bias), or the local spec's (input_layernorm.weight,
  // pre_mlp_layernorm.weight; .bias).
  bool local_norm_names = false;
  // The MLP's norm alone, where it differs from the attention's (a TE attention with
  // pre_mlp_layernorm.weight); nullopt: as local_norm_names.
  std::optional<bool> local_pre_mlp_norm;
  // Layer-stacked keys ("decoder.layers.<suffix>", layer on axis 0) instead of per-layer
  // "decoder.layers.<i>.<suffix>".
  bool stacked_layers = false;
  // The target's tensors (global shapes; names starting "optimizer." are ignored); empty: no
  // target to check. Each tensor the program makes must be there with the shape config.json
  // gives, and the target's layer and expert counts must be config.json's.
  std::vector<HfSourceFacts::Tensor> tensors;
};

// The families with a reverse program, each the inverse of its --hf-family program: "llama"
// (model_type llama or mistral, no biases), "qwen2" (QKV bias, tied or untied embeddings),
// "gpt2" (transformer.wte / wpe / h.<i>.* / ln_f: learned positions, LayerNorm and linear
// biases; the Conv1D weights transposed back, c_attn = [q; k; v] reordered into Megatron's
// per-head QKV), "mixtral" (block_sparse_moe.gate -> mlp.router, the experts' w1 / w3 -> each
// expert's fc1 [gate; up], w2 -> fc2, the experts stacked on axis 0 of
// mlp.experts.experts.linear_fc1 / linear_fc2) and "qwen2-moe" (as mixtral under mlp.gate,
// mlp.experts.<e>.gate_proj / up_proj / down_proj, with QKV bias unless config.json qkv_bias is
// false, and the shared expert: shared_expert.gate_proj / up_proj -> shared_experts.linear_fc1,
// down_proj -> linear_fc2, shared_expert_gate -> shared_experts.gate_weight).
const std::vector<std::string_view>& HfFamilyReverseNames();

// The AOA program HF -> Megatron-Core for `family`. Errors: kInvalidArgument for an unknown
// family and for every disagreement between the HF tensors, config.json and the target
// (layers, experts, shapes from heads / query groups / head_dim / FFN sizes, tied output;
// naming both values); kUnimplemented for an HF tensor the family does not map, naming it.
Result<std::string> GenerateHfFamilyReverseProgram(std::string_view family,
                                                   const HfReverseSource& source,
                                                   const HfTargetConfig& config,
                                                   const MegatronTargetFacts& target);

}  // namespace fc::aoa

#endif  // FC_AOA_HF_FAMILY_H_
